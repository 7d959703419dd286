"""S3Store: the object tier on S3 (or any S3-compatible endpoint: MinIO, moto), through aiobotocore.

Owner: one aiobotocore client (one connection pool) per store, opened by `S3Store.open` and kept until
`close`; every call runs on the event loop that opened it. botocore's own retries are kept to a minimum
(`max_attempts`, default 2 tries per request): the uploader retries with its own capped backoff and the
tiered reader surfaces a retriable error, so an outage is reported in seconds instead of being hidden behind
a long retry chain.

Error mapping: connection refused/reset, timeouts, 5xx and throttling -> ObjectStoreUnavailable (retriable);
NoSuchKey -> ObjectNotFound; anything else the service refuses (AccessDenied, NoSuchBucket, ...) ->
ObjectStoreError. The botocore exception is chained as the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import aiohttp
import botocore.exceptions as boto_errors
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from danube_fast.errors import ObjectNotFound, ObjectStoreError, ObjectStoreUnavailable
from danube_fast.storage.objects.format import Buffer
from danube_fast.storage.objects.s3_body import PartsBody, crc32_checksum
from danube_fast.storage.objects.store import check_key

_TRANSIENT_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
                              "RequestTimeTooSkewed", "Throttling", "ThrottlingException"})
_TRANSIENT = (boto_errors.ConnectionError, boto_errors.HTTPClientError, aiohttp.ClientError, OSError,
              TimeoutError)


class S3Store:
    """Open with `await S3Store.open(bucket, prefix, ...)`. Implements ObjectStore; keys are stored under
    `{prefix}/` in the bucket. The bucket must exist."""

    def __init__(self, bucket: str, prefix: str, client: Any, stack: contextlib.AsyncExitStack) -> None:
        self.bucket = bucket
        self.prefix = f"{check_key(prefix.strip('/'))}/" if prefix.strip("/") else ""
        self._client = client
        self._stack = stack

    @classmethod
    async def open(cls, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                   region: str | None = None, access_key: str | None = None, secret_key: str | None = None,
                   connect_timeout: float = 5.0, read_timeout: float = 30.0,
                   max_attempts: int = 2) -> S3Store:
        """`max_attempts` counts every try of one request, the first included (1: botocore never retries).
        Credentials and region default to botocore's chain (environment, ~/.aws, instance role)."""
        # Bodies are not SHA-256 signed (botocore hashes them on the event loop: 64 MiB stalled a broker's
        # loop, and every acknowledgement with it, 150-300 ms per uploaded segment); each put carries a
        # CRC32 checksum computed off the loop instead, which S3 verifies. Over https, botocore skips body
        # signing whenever a checksum is present anyway.
        config = AioConfig(connect_timeout=connect_timeout, read_timeout=read_timeout,
                           retries={"total_max_attempts": max_attempts, "mode": "standard"},
                           s3={"payload_signing_enabled": False})
        stack = contextlib.AsyncExitStack()
        client = await stack.enter_async_context(get_session().create_client(
            "s3", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=access_key,
            aws_secret_access_key=secret_key, config=config))
        return cls(bucket, prefix, client, stack)

    def __repr__(self) -> str:
        return f"S3Store(s3://{self.bucket}/{self.prefix})"

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    async def put(self, key: str, data: bytes) -> str | None:
        return await self.put_parts(key, (data,))

    async def put_parts(self, key: str, parts: Sequence[Buffer]) -> str | None:
        # Sent from the parts in place (s3_body.py): neither joined nor copied whole on the event loop.
        path = self._key(key)
        checksum = await asyncio.get_running_loop().run_in_executor(None, crc32_checksum, parts)
        try:
            answer = await self._client.put_object(Bucket=self.bucket, Key=path, Body=PartsBody(parts),
                                                   ChecksumCRC32=checksum)
        except Exception as e:
            raise self._error(e, "put", key) from e
        etag = answer.get("ETag")
        return etag.strip('"') if isinstance(etag, str) else None

    async def put_file(self, key: str, path: str) -> str | None:
        def read() -> bytes:
            with open(path, "rb") as f:
                return f.read()

        try:
            data = await asyncio.get_running_loop().run_in_executor(None, read)
        except OSError as e:
            raise ObjectStoreError(f"cannot read {path} to store it as {key!r}: {e.strerror or e}") from e
        return await self.put(key, data)

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self._key(key)
        if start is None and end is None:
            extra = {}
        elif start is not None and start < 0:
            extra = {"Range": f"bytes={start}"}
        else:
            lo = start or 0
            if end is not None and end <= lo:
                return b""
            extra = {"Range": f"bytes={lo}-" + ("" if end is None else str(end - 1))}
        try:
            answer = await self._client.get_object(Bucket=self.bucket, Key=path, **extra)
            async with answer["Body"] as body:
                data: bytes = await body.read()
        except boto_errors.ClientError as e:
            if _code(e) == "InvalidRange":  # the range starts past the end: clipped, as the protocol says
                return b""
            raise self._error(e, "get", key) from e
        except Exception as e:
            raise self._error(e, "get", key) from e
        return data

    async def delete(self, key: str) -> None:
        path = self._key(key)
        try:
            await self._client.delete_object(Bucket=self.bucket, Key=path)
        except Exception as e:
            raise self._error(e, "delete", key) from e

    async def list(self, prefix: str = "") -> list[str]:
        keys: list[str] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                keys.extend(item["Key"][len(self.prefix):] for item in page.get("Contents", ()))
        except Exception as e:
            raise self._error(e, "list", prefix) from e
        return sorted(keys)

    async def close(self) -> None:
        await self._stack.aclose()

    def _error(self, e: Exception, what: str, key: str) -> Exception:
        where = f"s3://{self.bucket}/{self.prefix}{key}"
        if isinstance(e, boto_errors.ClientError):
            code = _code(e)
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(f"no object {where}")
            if status >= 500 or code in _TRANSIENT_CODES:
                return ObjectStoreUnavailable(f"S3 {what} {where} failed: {code} (HTTP {status})")
            return ObjectStoreError(f"S3 {what} {where} refused: {code} (HTTP {status})")
        if isinstance(e, _TRANSIENT):
            return ObjectStoreUnavailable(f"S3 {what} {where} failed: {type(e).__name__}: {e}")
        return ObjectStoreError(f"S3 {what} {where} failed: {type(e).__name__}: {e}")


def _code(e: boto_errors.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))
