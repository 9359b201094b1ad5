"""``torch.distributed.algorithms._checkpoint``: activation checkpointing as module wrappers
(:mod:`.checkpoint_wrapper`)."""

from __future__ import annotations

from . import checkpoint_wrapper

__all__ = ["checkpoint_wrapper"]
