"""A follower's word that its owner's process is gone, ahead of the owner's lease (docs/REPLICATION.md,
"Failover").

A broker killed, or whose process died, refuses connections on its admin port at once (nothing listens
there any more), while its lease lives on for up to `[cluster] lease_ttl_s`, and its topics wait that long
for a successor. A follower whose fetches from its owner fail probes the owner's admin port with a plain
TCP connect; when it has been refused for REFUSED_FOR seconds on end, the follower revokes the lease of the
owner's registration, and the leader moves the dead broker's topics at once, as at the lease's expiry.

Only a registration the owner was seen serving under counts (a fetch answered while it was the current
one): a broker that restarted registers anew before its ports serve, and that new registration is left
alone. A partition, a pause or an overloaded broker time out rather than refuse: those wait for the lease,
as before. A port refused by a live broker (it is shutting down) costs it nothing it would not lose anyway:
its topics move, as they are about to.

Owner: the broker's event loop (`Copies` in follower.py reports its fetches here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from danube_fast.client.rpc import dial_target
from danube_fast.meta import keys
from danube_fast.meta.store import MetadataStore

log = logging.getLogger("danube_fast.replication")

REFUSED_FOR = 0.3  # seconds of refused connections before the owner counts as gone
PROBE_TIMEOUT = 0.5


class DeadOwners:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._served: dict[int, int] = {}  # broker -> mod revision of the registration it answered under
        self._refused: dict[int, float] = {}  # broker -> since when its port refuses
        self._probes: dict[int, asyncio.Future[bool]] = {}  # one probe at a time per broker
        self.revoked = 0

    def served(self, broker: int, registration_revision: int) -> None:
        """A fetch from `broker` was answered while its registration had this mod revision."""
        self._served[broker] = registration_revision
        self._refused.pop(broker, None)

    async def failed(self, broker: int, admin_addr: str) -> None:
        """A fetch from `broker` failed as unreachable: probe its port, and once it has refused for
        REFUSED_FOR seconds, revoke the lease of the registration it served under."""
        if not await self._probe(broker, admin_addr):
            self._refused.pop(broker, None)
            return
        now = time.monotonic()
        since = self._refused.setdefault(broker, now)
        if now - since < REFUSED_FOR:
            return
        kv = await self._store.get(keys.broker_register(broker))
        if kv is None or not kv.lease or kv.mod_revision != self._served.get(broker):
            return  # gone already, or registered anew since it last served: left to its lease
        del self._served[broker]  # one revocation per registration
        log.warning("broker %d has refused connections on %s for %.1f s: its process is gone; its lease is "
                    "revoked so that its topics move now", broker, admin_addr, now - since)
        await self._store.revoke_lease(kv.lease)
        self.revoked += 1

    async def _probe(self, broker: int, admin_addr: str) -> bool:
        probe = self._probes.get(broker)
        if probe is None:
            probe = self._probes[broker] = asyncio.ensure_future(refused(admin_addr))
            probe.add_done_callback(lambda _: self._probes.pop(broker, None))
        return await asyncio.shield(probe)


async def refused(admin_addr: str) -> bool:
    """Whether a TCP connection to `admin_addr` is refused (nothing listens there); False when it connects,
    times out or fails otherwise."""
    host, _, port = dial_target(admin_addr).rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)),
                                           PROBE_TIMEOUT)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False
