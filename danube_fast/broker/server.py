"""The broker process: assemble a broker (assemble.py), serve until SIGTERM or SIGINT, stop in order.

The "broker ready" line is logged only once every listener serves; the stop order is Broker.stop()'s
(broker.py). Exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal

from danube_fast.broker.assemble import StartError, assemble
from danube_fast.broker.config import BrokerConfig

__all__ = ["StartError", "raise_open_files_limit", "serve"]

log = logging.getLogger("danube_fast.broker")


def raise_open_files_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit, and return it. Every Reliable topic
    holds a descriptor per segment and every client a socket; the usual soft limit of 1024 would stop a
    broker near a thousand topics with EMFILE, while the hard limit (often 2^19) is the administrator's
    real ceiling (Go's runtime lifts it the same way since 1.19)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


async def serve(config: BrokerConfig) -> None:
    """Run until SIGTERM or SIGINT."""
    open_files = raise_open_files_limit()
    if open_files < 16_384:
        log.warning("open files are limited to %d for this process (RLIMIT_NOFILE): each Reliable topic "
                    "holds a descriptor per segment; raise the hard limit for thousands of topics",
                    open_files)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    broker = await assemble(config)
    await broker.start()
    listening = broker.listening
    host = config.broker_addr.rpartition(":")[0]
    admin_host = config.admin_addr.rpartition(":")[0]
    metrics = (f"{config.prom_exporter.rpartition(':')[0]}:{listening.metrics_port}"
               if listening.metrics_port is not None else "off")
    native = (f", native transport on {config.native_addr.rpartition(':')[0]}:{listening.fast_port}"
              if listening.fast_port is not None else "")
    if listening.console_port is not None:
        scheme = "https" if config.security.tls else "http"
        native += f", console at {scheme}://{config.console_listen.rpartition(':')[0]}:{listening.console_port}"
    failed = broker.topics.broken()
    broken = f" ({len(failed)} could not be loaded: see above)" if failed else ""
    log.info("broker ready: Danube API on %s:%d (advertised %s), admin on %s:%d, metrics on %s%s, data in "
             "%s, %d topics%s", host, listening.client_port, broker.url(), admin_host, listening.admin_port,
             metrics, native, os.path.abspath(config.data_dir), len(broker.topics.names()), broken)
    await stopping.wait()
    log.info("stopping: ending streams, flushing cursors and WALs")
    await broker.stop()
    log.info("stopped")
