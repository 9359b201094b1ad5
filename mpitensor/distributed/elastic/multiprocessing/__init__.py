"""``torch.distributed.elastic.multiprocessing``: :mod:`.errors` (``@record``)."""

from __future__ import annotations

from . import errors

__all__ = ["errors"]
