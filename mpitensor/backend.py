"""The array layer: which array module (NumPy or CuPy) a buffer lives in, and devices.

This module knows NumPy and CuPy and nothing about MPI or autograd. CuPy is optional: it is
imported lazily, the first time a GPU is asked for, and a missing CuPy only fails when used, with
a message that says how to install it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Optional, Union

import numpy as np

from mpitensor._base import gpu_memory as _gpu_memory

__all__ = [
    "device",
    "cupy_available",
    "get_cupy",
    "is_cupy_array",
    "is_array",
    "array_module",
    "device_of",
    "to_numpy",
    "get_default_device",
    "set_default_device",
]

_CUPY_HINT = (
    "install CuPy for your CUDA version: pip install 'mpitensor[cuda12]' (cupy-cuda12x) or "
    "'mpitensor[cuda13]' (cupy-cuda13x)"
)


@functools.cache
def _import_cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415 - optional dependency, imported on first use
    except Exception as exc:  # ImportError, or a broken CUDA runtime raising at import
        return exc
    _gpu_memory.install(cupy)  # count peaks from the first use on (torch.cuda's statistics)
    return cupy


def cupy_available() -> bool:
    """Return True when CuPy imports and sees at least one CUDA device."""
    cp = _import_cupy()
    if isinstance(cp, Exception):
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def cupy_unavailable_reason() -> str:
    """Say why GPU arrays cannot be used here ('' when they can)."""
    cp = _import_cupy()
    if isinstance(cp, Exception):
        return f"CuPy is not importable ({type(cp).__name__}: {cp}); {_CUPY_HINT}"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"CuPy imports but CUDA fails ({type(exc).__name__}: {exc})"
    return "" if n > 0 else "CuPy imports but no CUDA device is visible"


@functools.cache
def nccl_unavailable_reason() -> str:
    """Say why NCCL cannot be used here ('' when CuPy, its NCCL binding and a GPU are present).

    It lives here, not beside the NCCL group, so that asking (``dist.is_nccl_available()``)
    imports neither the communication layer nor MPI.
    """
    reason = cupy_unavailable_reason()
    if reason:
        return reason
    try:
        from cupy.cuda import nccl
    except Exception as exc:
        return f"CuPy is present but its NCCL binding is not ({type(exc).__name__}: {exc})"
    if not getattr(nccl, "available", True):
        return "CuPy was built without NCCL support"
    return ""


def get_cupy() -> Any:
    """Return the ``cupy`` module, or raise a RuntimeError that says how to get it."""
    cp = _import_cupy()
    if isinstance(cp, Exception):
        raise RuntimeError(f"a CUDA device was requested but CuPy is missing: {_CUPY_HINT}") from cp
    return cp


def is_cupy_array(x: Any) -> bool:
    """True when ``x`` is a ``cupy.ndarray`` (checked without importing CuPy)."""
    return type(x).__module__.startswith("cupy") and hasattr(x, "__cuda_array_interface__")


def is_array(x: Any) -> bool:
    """True for a NumPy or CuPy ndarray."""
    return isinstance(x, np.ndarray) or is_cupy_array(x)


def array_module(x: Any) -> Any:
    """Return ``numpy`` or ``cupy``: the module that owns array ``x``."""
    if is_cupy_array(x):
        return get_cupy()
    return np


class _BadDeviceError(ValueError, RuntimeError):
    """A device string or index that names no device: a ValueError by the house rule for bad
    arguments, and a RuntimeError because that is what torch raises for one."""


class device:  # noqa: N801 - named like torch.device
    """A device: ``device("cpu")``, ``device("cuda")``, ``device("cuda:1")``, ``device("cuda", 1)``.

    Example:
        >>> device("cuda:1").index
        1
    """

    __slots__ = ("type", "index")

    def __init__(self, type: Union[str, "device"], index: Union[int, None] = None) -> None:
        spec = type  # torch's argument name; ``spec`` keeps the builtin readable below
        if isinstance(spec, device):
            if index is not None:
                raise TypeError("device(device, index) is ambiguous: pass a string and an index")
            self.type, self.index = spec.type, spec.index
            return
        if not isinstance(spec, str):
            raise TypeError(f"device() takes a string such as 'cpu' or 'cuda:0', not {spec!r}")
        if index is not None and (isinstance(index, bool)
                                  or not isinstance(index, (int, np.integer))):
            raise TypeError(f"device index must be an int, got {index!r}")
        kind, sep, idx = spec.strip().partition(":")
        if kind not in ("cpu", "cuda", "meta"):
            raise _BadDeviceError(
                f"unknown device type {spec!r}: expected 'cpu', 'cuda', 'cuda:N' or 'meta'")
        if sep:
            if index is not None:
                raise _BadDeviceError(f"device({spec!r}, {index}) gives the index twice")
            if not (idx.isascii() and idx.isdigit()):
                raise _BadDeviceError(
                    f"bad device index in {spec!r}: expected a non-negative integer")
            index = int(idx)
        if index is not None:
            if index < 0:
                raise _BadDeviceError(f"device index must be a non-negative integer, got {index}")
            if kind != "cuda" and index != 0:
                raise _BadDeviceError(f"{kind} has no device {index}")
            index = int(index)
        self.type = kind
        self.index = index if kind == "cuda" else None

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except (TypeError, ValueError):
                return False
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __enter__(self) -> "device":
        """Make this the device that factories (``zeros``, ``randn``, ``tensor``, a module's
        parameters...) use when given none, until the block ends (per thread; blocks nest)."""
        _defaults.__dict__.setdefault("stack", []).append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _defaults.stack.pop()


CPU = device("cpu")

# the factories' device: the innermost ``with device(...)`` block of this thread, else the
# one set_default_device chose (None: the CPU, where nothing was asked for)
_defaults = threading.local()
_GLOBAL_DEFAULT: list = [None]


def default_factory_device() -> Optional[device]:
    """The device factories use for ``device=None``; None where nothing was chosen (CPU)."""
    stack = getattr(_defaults, "stack", None)
    return stack[-1] if stack else _GLOBAL_DEFAULT[0]


def get_default_device() -> device:
    """Return the device that factories use when given none (``cpu`` unless
    :func:`set_default_device` or a ``with device(...)`` block chose another).

    Example:
        >>> with device("cpu"):
        ...     get_default_device()
        device(type='cpu')
    """
    return default_factory_device() or CPU


def set_default_device(dev: Union[str, "device", int, None]) -> None:
    """Make ``dev`` the device factories use when given none, for the whole process (a
    ``with device(...)`` block still overrides it inside); None goes back to the CPU.

    Raises:
        TypeError, ValueError: ``dev`` is not a device (an int is a GPU number).
    """
    if dev is None or isinstance(dev, device):
        _GLOBAL_DEFAULT[0] = dev
    elif isinstance(dev, (int, np.integer)) and not isinstance(dev, bool):
        _GLOBAL_DEFAULT[0] = device("cuda", int(dev))
    else:
        _GLOBAL_DEFAULT[0] = device(dev)


META = device("meta")

class MetaArray(np.ndarray):
    """The meta device's arrays: a shape and a dtype without storage (every element is one
    shared slot). Views (reshape, transpose, indexing) stay meta, as in torch; arithmetic
    on them is refused, since there are no values to compute with (torch computes shapes
    only; here the op raises rather than return numbers that mean nothing)."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(_no_meta_values(ufunc.__name__))

    def item(self, *args: Any) -> Any:
        raise NotImplementedError(_no_meta_values("item()"))

    def tolist(self) -> Any:
        raise NotImplementedError(_no_meta_values("tolist()"))

    def tobytes(self, order: str = "C") -> bytes:
        raise NotImplementedError(_no_meta_values("tobytes()"))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func.__name__ in _META_VIEWS:  # a new shape over the same (absent) values
            return super().__array_function__(func, types, args, kwargs)
        raise NotImplementedError(_no_meta_values(func.__name__))


# NumPy's functions that give a view with another shape: meta in, meta out
_META_VIEWS = frozenset({
    "reshape", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze", "broadcast_to",
    "atleast_1d", "atleast_2d", "atleast_3d", "shape", "ndim", "size", "result_type"})


def _no_meta_values(what: str) -> str:
    return (f"{what} on a meta tensor: meta tensors have a shape and a dtype but no values; "
            f"give them memory first (Module.to_empty(device=...), then initialize them)")


def meta_array(shape: Any, dtype: Any) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` on the meta device (a :class:`MetaArray`): no
    memory behind its elements, they all share one slot."""
    slot = np.zeros(1, dtype=dtype)
    shape = tuple(int(s) for s in shape)
    a = np.lib.stride_tricks.as_strided(slot, shape, (0,) * len(shape), writeable=True)
    return a.view(MetaArray)


def is_meta_array(x: Any) -> bool:
    """True for an array of the meta device."""
    return isinstance(x, MetaArray)


def device_of(x: Any) -> device:
    """Return the device array ``x`` lives on."""
    if is_cupy_array(x):
        return device("cuda", int(x.device.id))
    return META if isinstance(x, MetaArray) else CPU


def to_numpy(x: Any) -> np.ndarray:
    """Return ``x`` as a NumPy array, copying device memory to the host where needed."""
    if is_cupy_array(x):
        return x.get()
    return np.asarray(x)
