"""``mpitensor.utils.data.dataloader``: the DataLoader and its helpers at torch's import path.

Example:
    >>> from mpitensor.utils.data.dataloader import DataLoader, default_collate
"""

from __future__ import annotations

from mpitensor.data.loader import DataLoader, default_collate, default_convert, get_worker_info

__all__ = ["DataLoader", "get_worker_info", "default_collate", "default_convert"]
