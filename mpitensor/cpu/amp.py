"""``mpitensor.cpu.amp``: the older spellings of ``mpitensor.amp`` for the CPU, as torch keeps them.

Each warns with a FutureWarning, as torch does, and then is ``mpitensor.amp``'s object with
``device_type="cpu"``.
"""

from __future__ import annotations

import warnings

from mpitensor import amp as _amp
from mpitensor import dtypes as _dt

__all__ = ["autocast", "GradScaler"]


def _moved(old: str) -> None:
    warnings.warn(f"`mpitensor.cpu.amp.{old}(args...)` is deprecated, as in torch; use "
                  f"`mpitensor.amp.{old}('cpu', args...)` instead", FutureWarning, stacklevel=3)


class autocast(_amp.autocast):  # noqa: N801 - torch's name
    """``mpitensor.amp.autocast("cpu", ...)`` under its older name (warns FutureWarning)."""

    def __init__(self, enabled: bool = True, dtype: _dt.dtype = _dt.bfloat16,
                 cache_enabled: bool = True) -> None:
        _moved("autocast")
        super().__init__("cpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_amp.GradScaler):
    """``mpitensor.amp.GradScaler("cpu", ...)`` under its older name (warns FutureWarning)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        _moved("GradScaler")
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)
