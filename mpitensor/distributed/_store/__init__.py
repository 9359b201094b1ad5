"""Key-value stores with torch's API: ``TCPStore``, ``FileStore``, ``HashStore``, ``PrefixStore``.

Processes use a store to find each other and to agree on small facts (an address, a counter,
who leads) before, or beside, the collectives. See ``docs/stores.md`` for the protocol, the
limits, and how these stores differ from torch's.
"""

from __future__ import annotations

from .common import (
    DistError,
    DistNetworkError,
    DistStoreError,
    HashStore,
    PrefixStore,
    Store,
    StoreTimeoutError,
)
from .file import FileStore
from .tcp import TCPStore

__all__ = [
    "Store", "TCPStore", "FileStore", "HashStore", "PrefixStore",
    "DistError", "DistStoreError", "DistNetworkError", "StoreTimeoutError",
]
