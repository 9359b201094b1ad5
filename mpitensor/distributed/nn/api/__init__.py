"""``mpitensor.distributed.nn.api`` (``torch.distributed.nn.api``): :class:`RemoteModule`."""

from __future__ import annotations

from .remote_module import RemoteModule

__all__ = ["RemoteModule"]
