"""`python -m bench security`: what `mode = tls_jwt` costs (docs/SECURITY.md), as a ratio to `mode = none` in
the same run.

Per run two fresh standalone brokers, one plaintext and one with TLS, HS256 tokens and RBAC (the producer's
principal is not a super admin: it holds a role bound on the namespace, so every call takes the full
check), each loaded in turn (which goes first alternates between runs):

- `danube_api_produce_reliable_*`: the official client's `Producer.send` to a Reliable topic, CONCURRENCY
  sends in flight (bench/broker): one unary SendMessage per message, so one TLS record and one gate check
  (a cached token) per message. Also the broker's CPU per message.
- `fast_produce_reliable_*`: our FastProducer's stream of 1,000-record batches (bench/fast): TLS on the
  bytes, one check per stream.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jwt
import uvloop
from danube import DanubeClientBuilder, DispatchStrategy

from bench.broker import Sample, Sizes, close_client, produce
from bench.common import Options, Result, median, paired_ratio, progress
from bench.fast import through_broker
from danube_fast.client.credentials import Credentials, open_channel
from danube_fast.proto import SecurityAdmin_pb2 as sec_pb
from danube_fast.proto import SecurityAdmin_pb2_grpc as sec_grpc
from danube_fast.testing.broker import Broker
from danube_fast.testing.certs import authority

ISSUER, AUDIENCE = "bench", "danube"
FAST_BATCHES = 1000


class Secrets:
    def __init__(self, directory: Path) -> None:
        ca = authority(directory / "ca")
        self.ca = ca.cert
        self.broker = ca.issue(directory / "ca", "broker")
        self.secret = secrets.token_hex(32).encode()
        self.secret_file = directory / "jwt.secret"
        self.secret_file.write_bytes(self.secret)

    def token(self, sub: str) -> str:
        now = int(time.time())
        return jwt.encode({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "nbf": now, "exp": now + 3600},
                          self.secret, algorithm="HS256")

    def config(self) -> str:
        return (f'[security]\nmode = "tls_jwt"\ncert_file = "{self.broker.cert}"\n'
                f'key_file = "{self.broker.key}"\nca_file = "{self.ca}"\n'
                f'jwt_secret_file = "{self.secret_file}"\njwt_issuer = "{ISSUER}"\n'
                f'jwt_audience = "{AUDIENCE}"\nsuper_admins = ["admin"]\n')


async def grant(broker: Broker, keys: Secrets) -> None:
    """The bench principal gets Produce and Lookup on /default (not a super admin: the full check runs)."""
    credentials = Credentials(ca_file=str(keys.ca), token=keys.token("admin"))
    async with open_channel(f"127.0.0.1:{broker.admin_port}", (), credentials) as channel:
        stub: Any = sec_grpc.SecurityAdminStub(channel)  # type: ignore[no-untyped-call]
        await stub.PutRole(sec_pb.Role(name="bench", permissions=["Produce", "Lookup"]), timeout=10)
        await stub.Bind(sec_pb.Binding(principal="bench", role="bench", scope="/default"), timeout=10)


async def danube_api(broker: Broker, keys: Secrets | None, run: int, sizes: Sizes) -> Sample:
    builder = DanubeClientBuilder()
    if keys is None:
        builder = builder.service_url(broker.url)
    else:
        builder = (builder.service_url(f"https://{broker.target}").with_tls(str(keys.ca))
                   .with_token(keys.token("bench")))
    client = await builder.build()
    try:
        mode = "none" if keys is None else "tls-jwt"
        return await produce(client, broker, f"/default/api-{mode}-{run}", DispatchStrategy.RELIABLE, sizes)
    finally:
        await close_client(client)


async def fast(broker: Broker, keys: Secrets | None, run: int, batches: int) -> float:
    credentials = None if keys is None else Credentials(ca_file=str(keys.ca), token=keys.token("bench"))
    mode = "none" if keys is None else "tls-jwt"
    topic = f"/default/fast-{mode}-{run}"
    await through_broker(broker, topic + "-warm", True, batches // 10, credentials)
    rate, _, _ = await through_broker(broker, topic, True, batches, credentials)
    return rate


Figures = dict[str, float]


def run_security(options: Options) -> list[Result]:
    sizes = Sizes.of(options.quick)
    batches = FAST_BATCHES // 5 if options.quick else FAST_BATCHES
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-security-", dir=options.parent_dir))
    runs: list[Figures] = []
    try:
        keys = Secrets(scratch / "pki")
        for run in range(options.runs):
            plain = Broker(scratch / f"none-{run}", die_with_parent=True)
            secured = Broker(scratch / f"tls-jwt-{run}", keys.config(), die_with_parent=True)
            figures: Figures = {}
            try:
                plain.start()
                secured.start()
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    runner.run(grant(secured, keys))
                    order = [(plain, None, "none"), (secured, keys, "tls_jwt")]
                    for broker, k, mode in order if run % 2 == 0 else order[::-1]:
                        api = runner.run(danube_api(broker, k, run, sizes))
                        figures[f"danube_api_produce_reliable_{mode}"] = api.rate
                        figures[f"danube_api_produce_reliable_{mode}_server_cpu"] = api.server_us
                        figures[f"fast_produce_reliable_{mode}"] = runner.run(fast(broker, k, run, batches))
            finally:
                plain.stop()
                secured.stop()
            runs.append(figures)
            shown = ", ".join(f"{k} {v:,.1f}" for k, v in figures.items())
            progress(f"run {run + 1}/{options.runs}: {shown}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summarise(runs)


def summarise(runs: list[Figures]) -> list[Result]:
    n = len(runs)
    out = []
    for name, unit in (("danube_api_produce_reliable", "msgs/s"), ("danube_api_produce_reliable", "µs/msg"),
                       ("fast_produce_reliable", "records/s")):
        suffix = "_server_cpu" if unit == "µs/msg" else ""
        plain = [r[f"{name}_none{suffix}"] for r in runs]
        secured = [r[f"{name}_tls_jwt{suffix}"] for r in runs]
        out.append(Result(f"{name}_none{suffix}", unit, median(plain), n))
        out.append(Result(f"{name}_tls_jwt{suffix}", unit, median(secured), n, median(plain),
                          paired_ratio(secured, plain)))
    return out


def load_line() -> str:
    return ("- Load: two standalone brokers per run, mode none and mode tls_jwt (HS256, RBAC: the producer's "
            "role is bound on the namespace); the official client's Reliable sends and our fast producer's "
            "1,000-record batches; ratios are tls_jwt / none in the same run")

