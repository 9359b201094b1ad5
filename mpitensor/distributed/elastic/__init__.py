"""``torch.distributed.elastic``: the names programs launched by torchrun import from it
(:mod:`.multiprocessing.errors`'s ``@record``). Launching itself is ``mpitensor.run``."""

from __future__ import annotations

from . import multiprocessing

__all__ = ["multiprocessing"]
