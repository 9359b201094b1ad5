"""``torch.distributed.algorithms``: DDP communication hooks (:mod:`.ddp_comm_hooks`) and the
uneven-inputs context manager :class:`Join` (:mod:`.join`)."""

from __future__ import annotations

from . import ddp_comm_hooks, join
from .join import Join, Joinable, JoinHook

__all__ = ["Join", "JoinHook", "Joinable", "ddp_comm_hooks", "join"]
