"""What a Reliable topic's acknowledgements wait for beyond its own WAL: copies on other brokers
(docs/REPLICATION.md).

The topic core defines the protocol; cluster mode implements it (`cluster/replication/owner.py`
`ReplicaSet`) for a topic whose policy asks for more than one copy. A topic without one (every topic
standalone, and replicationFactor 1) waits for nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Replicas(Protocol):
    """Owned by the cluster's replication; the topic calls it on its publish path, metrics read it."""

    @property
    def wanted(self) -> int:
        """Copies the policy asks for, the owner's included (replicationFactor)."""
        ...

    @property
    def in_sync(self) -> int:
        """Copies in sync now, the owner's included."""
        ...

    @property
    def sent_bytes(self) -> Mapping[str, int]:
        """Record bytes the followers fetched from this owner, by transport ("native", "grpc")."""
        ...

    async def admit(self) -> None:
        """Before an append: raises (UNAVAILABLE, retriable) when fewer copies are in sync than the policy
        needs (after a short wait for them), so that nothing is stored for a send that cannot be
        acknowledged."""
        ...

    async def replicated(self, last: int) -> None:
        """After `last` is durable here: returns once every in-sync copy holds it too; raises UNAVAILABLE when
        fewer copies than the policy needs stay in sync."""
        ...
