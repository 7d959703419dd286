"""`open_object_store(url)`: the ObjectStore implementation a URL names (kept apart from the protocol in
`store.py`, which the implementations import)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from danube_fast.storage.objects.folder import FolderStore
from danube_fast.storage.objects.store import ObjectStore


async def open_object_store(url: str, **options: Any) -> ObjectStore:
    """Open the store a URL names:
    - `s3://bucket[/prefix]`: S3Store; options are S3Store's (endpoint_url, region, access_key, secret_key,
      connect_timeout, read_timeout, max_attempts);
    - `file:///abs/path` or a plain path: FolderStore (created if missing); its one option is `direct`
      (O_DIRECT writes, default on).
    """
    parts = urlsplit(url)
    if parts.scheme == "s3":
        from danube_fast.storage.objects.s3 import S3Store  # aiobotocore only when S3 is used

        if not parts.netloc:
            raise ValueError(f"an S3 URL names a bucket: s3://bucket/prefix, not {url!r}")
        return await S3Store.open(parts.netloc, unquote(parts.path).strip("/"), **options)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"a file URL names a local path (file:///path), not {url!r}")
        path = unquote(parts.path)
    elif parts.scheme == "":
        path = url
    else:
        raise ValueError(f"unknown object store URL scheme {parts.scheme!r} in {url!r}: use s3:// or a path")
    unknown = sorted(set(options) - {"direct"})
    if unknown:
        raise TypeError(f"a folder store takes only the option direct, got {unknown}")
    return await FolderStore.open(path, **options)
