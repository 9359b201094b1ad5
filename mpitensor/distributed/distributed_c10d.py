"""``torch.distributed.distributed_c10d``: the module torch defines its process-group API in.

Programs import names from here as well as from the package (``from
torch.distributed.distributed_c10d import ReduceOp``); every public name of
:mod:`mpitensor.distributed` resolves here to the same object.
"""

from __future__ import annotations

from typing import Any

from .. import distributed as _package

__all__ = list(_package.__all__)


def __getattr__(name: str) -> Any:
    if name in _package.__all__ or name in ("breakpoint", "default_pg_timeout"):
        return getattr(_package, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
