"""What a dispatcher reads of the subscription it feeds, and tells it.

The subscription (broker/subscription.py) owns its consumer list, in attach order, and changes it; a
dispatcher only reads it, through this protocol, so that the subscription may import the dispatchers and
not the other way round. The subscription also owns what was delivered over its life (dispatchers are
replaced by a seek or a switch of API): a dispatcher that hands records to a stream itself reports them.
"""

from __future__ import annotations

from typing import Protocol

from danube_fast.broker.consumer import Consumer
from danube_fast.meta.resources import SubscriptionType


class Members(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def topic_name(self) -> str: ...

    @property
    def kind(self) -> SubscriptionType: ...

    @property
    def consumers(self) -> list[Consumer]: ...

    def sent(self, messages: int, size: int) -> None:
        """`messages` (`size` bytes) went to a consumer stream."""
