"""What the admin API asks of the load manager: a rebalance, and the topic moves it proposes or makes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Move:
    """One topic moved (or, on a dry run, to be moved) between brokers; `topic` is `/{ns}/{topic}`."""

    topic: str
    from_broker: int
    to_broker: int
    load: float  # the load the move takes off `from_broker`, in the units of GetClusterBalance
    reason: str


class Rebalancer(Protocol):
    """Implemented by the load manager of the leader (TriggerRebalance calls it there only)."""

    async def rebalance(self, *, dry_run: bool, max_moves: int | None) -> list[Move]:
        """The moves that even out the cluster, at most `max_moves` of them (None: as many as it takes).
        A dry run only proposes them; otherwise each one is started (unloaded from `from_broker`)."""
        ...
