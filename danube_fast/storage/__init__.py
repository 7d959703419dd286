"""Storage: the per-topic write-ahead log (native engine, asyncio facade) and its read cache."""

from danube_fast.storage.config import SyncPolicy, WalConfig
from danube_fast.storage.wal import Wal, WalReader

__all__ = ["SyncPolicy", "Wal", "WalConfig", "WalReader"]
