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
from mpitensor._base import meta_shapes as _meta_shapes

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
    """Return ``numpy`` or ``cupy``: the module that owns array ``x`` (for a meta array,
    NumPy whose array makers make meta arrays: :data:`META_NUMPY`)."""
    if is_cupy_array(x):
        return get_cupy()
    return META_NUMPY if isinstance(x, MetaArray) else np


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


def _refused(what: str) -> Any:
    """A method that gives a value out, on a meta array: it raises."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(_no_meta_values(what))

    method.__name__ = what
    return method


class MetaArray(_meta_shapes.NoValues):
    """The meta device's arrays: a shape and a dtype without storage (every element is one
    shared slot, all strides 0). Views (reshape, transpose, basic indexing) stay meta, as in
    torch; every other NumPy operation on one (ufuncs, NumPy's functions, the array methods)
    gives a meta array of the shape and dtype NumPy would give, worked out by
    :mod:`mpitensor._base.meta_shapes` without computing values or allocating the result.
    Values never come out: ``item``, ``tolist``, ``tobytes``, ``bool``, ``float``... raise
    ``NotImplementedError``."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out") or ()
        specs = _meta_shapes.ufunc_specs(ufunc, method, inputs, kwargs)
        if method == "at":
            _writes_meta(inputs[0], f"{ufunc.__name__}.at")
            return None
        made = []
        for i, spec in enumerate(specs):
            o = out[i] if i < len(out) else None
            if o is not None:
                _writes_meta(o, ufunc.__name__)
            made.append(o if o is not None else meta_array(*spec))
        return made[0] if len(made) == 1 else tuple(made)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func in _meta_shapes.VIEWS or func in _meta_shapes.THROUGH:
            return _kept_meta(super().__array_function__(func, types, args, kwargs))
        rule = _meta_shapes.function_rule(func)
        if rule is None:
            raise NotImplementedError(
                f"numpy.{func.__name__} on a meta tensor: there is no shape rule for it "
                f"(mpitensor/_base/meta_shapes.py); compute on a real device")
        spec = rule(*args, **kwargs)
        if func is np.copyto or func is np.put_along_axis:
            _writes_meta(args[0], func.__name__)
            return None
        out = kwargs.get("out")
        if out is not None:
            _writes_meta(out, func.__name__)
            return out
        return _made(spec)

    # values out: refused
    item = _refused("item()")
    tolist = _refused("tolist()")
    tobytes = _refused("tobytes()")
    tofile = _refused("tofile()")
    __bool__ = _refused("bool()")
    __float__ = _refused("float()")
    __int__ = _refused("int()")
    __complex__ = _refused("complex()")
    __index__ = _refused("an index")

    def __repr__(self) -> str:
        return f"MetaArray(shape={tuple(self.shape)}, dtype={self.dtype})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if spec:  # a number's format: there is no number
            raise NotImplementedError(_no_meta_values(f"format(..., {spec!r})"))
        return repr(self)

    # the methods that NumPy computes in C without asking __array_ufunc__/__array_function__
    def __getitem__(self, index: Any) -> Any:
        idx = index if isinstance(index, tuple) else (index,)
        if all(i is None or i is Ellipsis or isinstance(i, (slice, int, np.integer))
               and not isinstance(i, (bool, np.bool_)) for i in idx):
            r = super().__getitem__(index)  # basic indexing: a view, still meta
            return r if isinstance(r, MetaArray) else meta_array((), self.dtype)  # not a number
        return meta_array(_meta_shapes.index_shape(self.shape, idx), self.dtype)

    def __iter__(self) -> Any:
        if not self.ndim:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))  # meta rows, never numbers

    def __setitem__(self, index: Any, value: Any) -> None:
        idx = index if isinstance(index, tuple) else (index,)
        target = _meta_shapes.index_shape(self.shape, idx)
        _meta_shapes._check_fits(np.shape(value), target, "setitem")  # no values to write

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe", subok: bool = True,
               copy: bool = True) -> np.ndarray:
        dt = np.dtype(dtype)
        if not np.can_cast(self.dtype, dt, casting):
            raise TypeError(f"Cannot cast array data from {self.dtype!r} to {dt!r} according "
                            f"to the rule {casting!r}")
        return self if not copy and dt == self.dtype else meta_array(self.shape, dt)

    def copy(self, order: str = "C") -> np.ndarray:
        return meta_array(self.shape, self.dtype)

    def byteswap(self, inplace: bool = False) -> np.ndarray:
        return self if inplace else meta_array(self.shape, self.dtype)

    def round(self, decimals: int = 0, out: Any = None) -> Any:
        if out is not None:
            _writes_meta(out, "round")
            return out
        return meta_array(self.shape, self.dtype)

    def __copy__(self) -> np.ndarray:
        return meta_array(self.shape, self.dtype)

    def __deepcopy__(self, memo: Any) -> np.ndarray:
        return meta_array(self.shape, self.dtype)

    def __reduce__(self) -> tuple:
        return meta_array, (tuple(self.shape), self.dtype.str if self.dtype.names is None
                            else self.dtype)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return self.__reduce__()

    def flatten(self, order: str = "C") -> np.ndarray:
        return meta_array((self.size,), self.dtype)

    def ravel(self, order: str = "C") -> np.ndarray:
        return meta_array((self.size,), self.dtype)

    def view(self, *args: Any, **kwargs: Any) -> Any:
        dtype = kwargs.get("dtype", args[0] if args else None)
        if dtype is None or isinstance(dtype, type) and issubclass(dtype, np.ndarray):
            return super().view(*args, **kwargs)
        dt = np.dtype(dtype)
        if dt.itemsize == self.dtype.itemsize:
            return super().view(dt)
        if not self.ndim or (self.shape[-1] * self.dtype.itemsize) % dt.itemsize:
            raise ValueError("To change to a dtype of a different size, the last axis must "
                             "be contiguous and fit the new dtype's size")
        last = self.shape[-1] * self.dtype.itemsize // dt.itemsize
        return meta_array(self.shape[:-1] + (last,), dt)

    def dot(self, b: Any, out: Any = None) -> Any:
        return np.dot(self, b, out=out)

    def take(self, indices: Any, axis: Any = None, out: Any = None, mode: str = "raise") -> Any:
        return np.take(self, indices, axis=axis, out=out, mode=mode)

    def repeat(self, repeats: Any, axis: Any = None) -> Any:
        return np.repeat(self, repeats, axis=axis)

    def argmax(self, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        return np.argmax(self, axis=axis, out=out, keepdims=keepdims)

    def argmin(self, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        return np.argmin(self, axis=axis, out=out, keepdims=keepdims)

    def argsort(self, axis: Any = -1, kind: Any = None, order: Any = None, **kw: Any) -> Any:
        return np.argsort(self, axis=axis, kind=kind, order=order, **kw)

    def searchsorted(self, v: Any, side: str = "left", sorter: Any = None) -> Any:
        return np.searchsorted(self, v, side=side, sorter=sorter)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        return np.trace(self, *args, **kwargs)

    def cumsum(self, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
        return np.cumsum(self, axis=axis, dtype=dtype, out=out)

    def cumprod(self, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
        return np.cumprod(self, axis=axis, dtype=dtype, out=out)

    def sort(self, axis: Any = -1, kind: Any = None, order: Any = None, **kw: Any) -> None:
        """In place: there are no values to order."""

    def fill(self, value: Any) -> None:
        """In place: there are no values to set."""

    def put(self, *args: Any, **kwargs: Any) -> None:
        """In place: there are no values to set."""

    nonzero = _meta_shapes.data_dependent("nonzero()")
    compress = _meta_shapes.data_dependent("compress()")

    def partition(self, *args: Any, **kwargs: Any) -> None:
        """In place: there are no values to order."""


def _writes_meta(dst: Any, what: str) -> None:
    """Refuse to write a meta result into an array with storage (it would get no values)."""
    if not isinstance(dst, MetaArray):
        raise NotImplementedError(
            f"{what}: a result computed from meta tensors cannot be written into an array "
            f"with storage (it has no values); make the destination on the meta device too")


def _made(spec: Any) -> Any:
    if isinstance(spec, list):
        return tuple(_made(s) for s in spec)
    return meta_array(*spec)


def _kept_meta(r: Any) -> Any:
    """A NumPy function's result on meta arrays: its arrays, meta (a view NumPy built as a
    base-class array over the shared slot is one)."""
    if isinstance(r, MetaArray) or not isinstance(r, (np.ndarray, list, tuple)):
        return r
    if isinstance(r, (list, tuple)):
        return type(r)(_kept_meta(x) for x in r)
    return meta_array(r.shape, r.dtype)


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


def _shape_arg(shape: Any) -> tuple:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)


class _MetaStrideTricks:
    """``numpy.lib.stride_tricks`` on the meta device."""

    sliding_window_view = staticmethod(np.lib.stride_tricks.sliding_window_view)

    @staticmethod
    def as_strided(x: Any, shape: Any = None, strides: Any = None, **kwargs: Any) -> Any:
        return meta_array(x.shape if shape is None else shape, x.dtype)


class _MetaLib:
    stride_tricks = _MetaStrideTricks()

    def __getattr__(self, name: str) -> Any:
        return getattr(np.lib, name)


class _MetaNumpy:
    """NumPy as a meta array's array module (``array_module``): its array makers (``zeros``,
    ``empty``, ``full``, ``arange``, ``asarray``...) make meta arrays, as cupy's make arrays on
    the GPU; every other name is NumPy's, which answers meta arrays with meta arrays."""

    lib = _MetaLib()

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def empty(shape: Any, dtype: Any = float, order: str = "C", **kwargs: Any) -> Any:
        return meta_array(_shape_arg(shape), dtype)

    zeros = ones = empty

    @staticmethod
    def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C",
             **kwargs: Any) -> Any:
        return meta_array(_shape_arg(shape), dtype if dtype is not None
                          else np.asarray(fill_value).dtype)

    @staticmethod
    def arange(*args: Any, dtype: Any = None, **kwargs: Any) -> Any:
        start, stop, step = (0, args[0], 1) if len(args) == 1 else (tuple(args) + (1,))[:3]
        n = max(0, int(np.ceil((stop - start) / step)))
        return meta_array((n,), np.arange(start, start + step, step, dtype=dtype).dtype)

    @staticmethod
    def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True,
                 retstep: bool = False, dtype: Any = None, axis: int = 0) -> Any:
        if retstep or np.ndim(start) or np.ndim(stop):
            raise NotImplementedError("linspace with array ends or retstep on a meta tensor")
        return meta_array((int(num),), dtype if dtype is not None else np.result_type(
            start, stop, float))

    @staticmethod
    def eye(n: int, m: Any = None, k: int = 0, dtype: Any = float, **kwargs: Any) -> Any:
        return meta_array((n, n if m is None else m), dtype)

    @staticmethod
    def identity(n: int, dtype: Any = float, **kwargs: Any) -> Any:
        return meta_array((n, n), dtype)

    @staticmethod
    def asarray(a: Any, dtype: Any = None, order: Any = None, **kwargs: Any) -> Any:
        if isinstance(a, MetaArray):
            return a if dtype is None else a.astype(dtype, copy=False)
        dt = np.dtype(dtype) if dtype is not None else np.asarray(a).dtype
        return meta_array(np.shape(a), dt)

    array = asanyarray = ascontiguousarray = asfortranarray = asarray


#: NumPy for the meta device (see :class:`_MetaNumpy`).
META_NUMPY = _MetaNumpy()


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
