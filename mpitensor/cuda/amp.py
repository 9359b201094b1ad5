"""``mpitensor.cuda.amp``: the older spellings of ``mpitensor.amp`` for CUDA, as torch keeps them.

Each warns with a FutureWarning, as torch does, and then is ``mpitensor.amp``'s object with
``device_type="cuda"``; without a GPU, ``autocast`` and ``GradScaler`` then disable themselves
with a warning, as torch's do.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional

from mpitensor import amp as _amp
from mpitensor import dtypes as _dt

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


def _moved(old: str, new: str) -> None:
    warnings.warn(f"`mpitensor.cuda.amp.{old}(args...)` is deprecated, as in torch; use "
                  f"`mpitensor.amp.{new}` instead", FutureWarning, stacklevel=3)


class autocast(_amp.autocast):  # noqa: N801 - torch's name
    """``mpitensor.amp.autocast("cuda", ...)`` under its older name (warns FutureWarning)."""

    def __init__(self, enabled: bool = True, dtype: _dt.dtype = _dt.float16,
                 cache_enabled: bool = True) -> None:
        _moved("autocast", "autocast('cuda', args...)")
        super().__init__("cuda", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_amp.GradScaler):
    """``mpitensor.amp.GradScaler("cuda", ...)`` under its older name (warns FutureWarning)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        _moved("GradScaler", "GradScaler('cuda', args...)")
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


def custom_fwd(fwd: Optional[Callable] = None, *,
               cast_inputs: Optional[_dt.dtype] = None) -> Callable:
    """``mpitensor.amp.custom_fwd(device_type="cuda")`` under its older name."""
    _moved("custom_fwd", "custom_fwd(args..., device_type='cuda')")
    if fwd is None:
        return functools.partial(_amp.custom_fwd, device_type="cuda", cast_inputs=cast_inputs)
    return _amp.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)


def custom_bwd(bwd: Any = None) -> Callable:
    """``mpitensor.amp.custom_bwd(device_type="cuda")`` under its older name."""
    _moved("custom_bwd", "custom_bwd(args..., device_type='cuda')")
    if bwd is None:
        return functools.partial(_amp.custom_bwd, device_type="cuda")
    return _amp.custom_bwd(bwd, device_type="cuda")
