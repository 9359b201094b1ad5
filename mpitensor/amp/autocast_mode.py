"""``autocast``: run listed ops in a lower precision inside a region, as ``torch.autocast``.

Inside ``with autocast("cpu")`` (bfloat16 by default; ``"cuda"``: float16) the matrix products
and convolutions cast their floating inputs to the autocast dtype and return it, the ops torch
keeps in float32 (losses, ``prod``, ``cdist``, ...) cast theirs to float32, and every other op
runs in the dtype of its inputs. The casts are differentiable: gradients reach float32
parameters in float32. Which op does what is listed in :data:`mpitensor._core.autocast.POLICIES`
and in ``docs/amp.md``.

Example:
    >>> import mpitensor as torch
    >>> with torch.autocast(device_type="cpu"):
    ...     y = torch.ones(2, 3) @ torch.ones(3, 4)
    >>> y.dtype == torch.bfloat16
    True
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast

__all__ = [
    "autocast", "custom_fwd", "custom_bwd", "is_autocast_available", "is_autocast_enabled",
    "get_autocast_dtype", "set_autocast_enabled", "set_autocast_dtype",
    "is_autocast_cpu_enabled", "set_autocast_cpu_enabled", "get_autocast_cpu_dtype",
    "set_autocast_cpu_dtype", "get_autocast_gpu_dtype", "set_autocast_gpu_dtype",
    "is_autocast_cache_enabled", "set_autocast_cache_enabled", "clear_autocast_cache",
    "autocast_increment_nesting", "autocast_decrement_nesting",
]

_SUPPORTED = {"cpu": (_dt.bfloat16, _dt.float16),
              "cuda": (_dt.float16, _dt.bfloat16, _dt.float32)}


def _device_type(device_type: Any, what: str) -> str:
    """The device type named by ``device_type`` (``"cuda:0"`` names ``"cuda"``)."""
    if not isinstance(device_type, str):
        raise ValueError(f"{what}: device_type must be a str such as 'cpu' or 'cuda', got "
                         f"{type(device_type).__name__}")
    return _backend.device(device_type).type  # an unknown type raises a RuntimeError here


def is_autocast_available(device_type: str) -> bool:
    """Return whether autocast can act on ``device_type`` (``"cpu"`` and ``"cuda"`` here).

    Raises:
        RuntimeError: ``device_type`` names no device type mpitensor knows.

    Example:
        >>> import mpitensor as torch
        >>> torch.amp.is_autocast_available("cpu")
        True
    """
    return _device_type(device_type, "is_autocast_available()") in _SUPPORTED


def is_autocast_enabled(device_type: Optional[str] = None) -> bool:
    """Return whether autocast is on for ``device_type`` in this thread (None: ``"cuda"``)."""
    dev = "cuda" if device_type is None else _device_type(device_type, "is_autocast_enabled()")
    return _autocast.state().enabled[dev]


def get_autocast_dtype(device_type: str) -> _dt.dtype:
    """Return the dtype autocast casts to on ``device_type`` in this thread."""
    return _autocast.state().dtype[_device_type(device_type, "get_autocast_dtype()")]


def set_autocast_enabled(*args: Any) -> None:
    """``set_autocast_enabled(device_type, enabled)``, or ``(enabled)`` for ``"cuda"``."""
    if len(args) == 1:
        dev, enabled = "cuda", args[0]
    elif len(args) == 2:
        dev, enabled = _device_type(args[0], "set_autocast_enabled()"), args[1]
    else:
        raise TypeError(f"set_autocast_enabled() takes (device_type, enabled) or (enabled), got "
                        f"{len(args)} arguments")
    _autocast.set_enabled(dev, bool(enabled))


def set_autocast_dtype(device_type: str, dtype: _dt.dtype) -> None:
    """Set the dtype autocast casts to on ``device_type`` in this thread."""
    _autocast.set_dtype(_device_type(device_type, "set_autocast_dtype()"), _dt.to_dtype(dtype))


def _old_spelling(name: str, new: Callable, device: str, arg: str = "") -> Callable:
    """The deprecated function ``name``: ``new(device, *args)`` after a DeprecationWarning
    (``arg``: the one argument it takes, as its message shows it)."""
    new_call = f"{new.__name__}({device!r}{', ' + arg if arg else ''})"

    def old(*args: Any) -> Any:
        warnings.warn(f"mpitensor.{name}({arg}) is deprecated, as in torch; call "
                      f"mpitensor.{new_call} instead", DeprecationWarning, stacklevel=2)
        return new(device, *args)

    old.__name__ = old.__qualname__ = name
    old.__doc__ = f"Deprecated spelling of ``{new_call}``."
    return old


is_autocast_cpu_enabled = _old_spelling("is_autocast_cpu_enabled", is_autocast_enabled, "cpu")
set_autocast_cpu_enabled = _old_spelling("set_autocast_cpu_enabled", set_autocast_enabled, "cpu",
                                         "enabled")
get_autocast_cpu_dtype = _old_spelling("get_autocast_cpu_dtype", get_autocast_dtype, "cpu")
set_autocast_cpu_dtype = _old_spelling("set_autocast_cpu_dtype", set_autocast_dtype, "cpu",
                                       "dtype")
get_autocast_gpu_dtype = _old_spelling("get_autocast_gpu_dtype", get_autocast_dtype, "cuda")
set_autocast_gpu_dtype = _old_spelling("set_autocast_gpu_dtype", set_autocast_dtype, "cuda",
                                       "dtype")


def is_autocast_cache_enabled() -> bool:
    """Return the cache flag of this thread (casts are not cached here; see ``docs/amp.md``)."""
    return _autocast.state().cache_enabled


def set_autocast_cache_enabled(enabled: bool) -> None:
    """Set the cache flag of this thread (kept for ``is_autocast_cache_enabled``)."""
    _autocast.state().cache_enabled = bool(enabled)


def clear_autocast_cache() -> None:
    """Drop cached casts: there are none, as each op casts its inputs afresh."""


def autocast_increment_nesting() -> int:
    """Count one more autocast region entered in this thread; return the new depth."""
    st = _autocast.state()
    st.nesting += 1
    return st.nesting


def autocast_decrement_nesting() -> int:
    """Count one autocast region left in this thread; return the new depth."""
    st = _autocast.state()
    st.nesting -= 1
    return st.nesting


class autocast:  # noqa: N801 - torch's name
    """A context manager (and decorator) in which listed ops run in a lower precision.

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (the tensors it acts on).
        dtype: the lower precision: bfloat16 or float16 on the CPU; None: bfloat16 on the
            CPU, float16 on CUDA.
        enabled: False makes the region one without autocast (also inside another).
        cache_enabled: accepted as in torch; casts are not cached (see ``docs/amp.md``).

    Raises:
        ValueError: ``device_type`` is not a str.
        RuntimeError: an unknown device type, or one autocast does not support here.

    Warns:
        UserWarning: (and disables itself) a CPU dtype other than bfloat16/float16, or
            ``"cuda"`` where no GPU can be used, as torch does.

    Example:
        >>> import mpitensor as torch
        >>> lin = torch.nn.Linear(3, 2)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     out = lin(torch.ones(4, 3))
        >>> out.dtype == torch.bfloat16, lin.weight.dtype == torch.float32
        (True, True)
    """

    def __init__(self, device_type: str, dtype: Optional[_dt.dtype] = None,
                 enabled: bool = True, cache_enabled: Optional[bool] = None) -> None:
        dev = _device_type(device_type, "autocast()")
        if dev not in _SUPPORTED:
            raise RuntimeError(f"autocast(): device_type {device_type!r} is not supported; "
                               f"mpitensor's autocast acts on 'cpu' and 'cuda'")
        self.device = dev
        self.fast_dtype = get_autocast_dtype(dev) if dtype is None else _dt.to_dtype(dtype)
        self._enabled = bool(enabled)
        self._cache_enabled = (is_autocast_cache_enabled() if cache_enabled is None
                               else bool(cache_enabled))
        if self._enabled and dev == "cuda" and not _backend.cupy_available():
            warnings.warn("autocast('cuda') was asked for, but no GPU can be used here; the "
                          "region runs without autocast", UserWarning, stacklevel=2)
            self._enabled = False
        if self._enabled and self.fast_dtype not in _SUPPORTED[dev]:
            names = ", ".join(_dt.dt_repr(d) for d in _SUPPORTED[dev])
            warnings.warn(f"autocast({dev!r}) supports the dtypes {names}, not "
                          f"{_dt.dt_repr(self.fast_dtype)}; the region runs without autocast",
                          UserWarning, stacklevel=2)
            self._enabled = False
        self._saved: list = []

    def __enter__(self) -> autocast:
        st = _autocast.state()
        self._saved.append((st.enabled[self.device], st.dtype[self.device], st.cache_enabled))
        st.dtype[self.device] = self.fast_dtype
        st.cache_enabled = self._cache_enabled
        autocast_increment_nesting()
        _autocast.set_enabled(self.device, self._enabled)
        return self

    def __exit__(self, *exc: Any) -> bool:
        st = _autocast.state()
        if autocast_decrement_nesting() == 0:
            clear_autocast_cache()
        enabled, dtype, cache = self._saved.pop()
        st.dtype[self.device] = dtype
        st.cache_enabled = cache
        _autocast.set_enabled(self.device, enabled)
        return False

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def run_in_autocast(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)
        return run_in_autocast


def _cast_inputs(v: Any, dtype: _dt.dtype) -> Any:
    from mpitensor.tensor import Tensor

    if isinstance(v, Tensor):
        ok = v.is_floating_point() and v.dtype != _dt.float64
        return v.to(dtype) if ok and v.dtype != dtype else v
    if hasattr(v, "astype") and hasattr(v, "dtype"):  # a Function's forward sees the arrays
        ok = _dt.is_floating_dtype(v.dtype) and v.dtype not in (_dt.float64, dtype)
        return v.astype(dtype) if ok else v
    if isinstance(v, (list, tuple)):
        return type(v)(_cast_inputs(x, dtype) for x in v)
    if isinstance(v, dict):
        return {k: _cast_inputs(x, dtype) for k, x in v.items()}
    return v


def custom_fwd(fwd: Optional[Callable] = None, *, device_type: str,
               cast_inputs: Optional[_dt.dtype] = None) -> Callable:
    """Decorate an ``autograd.Function``'s ``forward`` for use inside autocast regions.

    Without ``cast_inputs`` the forward runs under the caller's autocast state, and
    :func:`custom_bwd` gives the backward the same state. With ``cast_inputs``, inside an
    autocast region for ``device_type`` the forward's floating inputs (not float64) are cast
    to ``cast_inputs`` and the forward runs with autocast off; outside one it runs as is.

    Example:
        >>> import mpitensor as torch
        >>> class Double(torch.autograd.Function):
        ...     @staticmethod
        ...     @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
        ...     def forward(ctx, x):
        ...         return x * 2
        ...     @staticmethod
        ...     @torch.amp.custom_bwd(device_type="cpu")
        ...     def backward(ctx, g):
        ...         return g * 2
    """
    dev = _device_type(device_type, "custom_fwd()")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def forward(*args: Any, **kwargs: Any) -> Any:
        ctx = args[0]
        ctx._fwd_used_autocast = is_autocast_enabled(dev)
        ctx._autocast_dtype = get_autocast_dtype(dev)
        if cast_inputs is None or not ctx._fwd_used_autocast:
            return fwd(*args, **kwargs)
        with autocast(device_type=dev, enabled=False):
            return fwd(*_cast_inputs(args, cast_inputs), **_cast_inputs(kwargs, cast_inputs))
    return forward


def custom_bwd(bwd: Optional[Callable] = None, *, device_type: str) -> Callable:
    """Decorate an ``autograd.Function``'s ``backward``: it runs under the autocast state its
    forward (decorated with :func:`custom_fwd`) ran under."""
    dev = _device_type(device_type, "custom_bwd()")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def backward(*args: Any, **kwargs: Any) -> Any:
        ctx = args[0]
        with autocast(device_type=dev, enabled=ctx._fwd_used_autocast,
                      dtype=ctx._autocast_dtype):
            return bwd(*args, **kwargs)
    return backward
