"""torch's process-wide switches and odds and ends at its top level
(``use_deterministic_algorithms``, ``set_warn_always``, ``is_inference_mode_enabled``,
``typename``, ...) and the strided-view family (``as_strided``). ``mpitensor/__init__.py``
exports :data:`__all__`.

What each switch controls here:

- ``use_deterministic_algorithms``: on the CPU every op is deterministic already (see
  :mod:`mpitensor._base.determinism`); on a GPU the scatter-adds (``index_add_``,
  ``scatter_add_``, ``index_put_(accumulate=True)``, ``put_(accumulate=True)``, indexing's
  and embedding's gradients) add in a fixed order instead of with atomics, and the ops with no
  such way (``bincount`` with weights on a GPU; ``put_(accumulate=False)`` everywhere, as in
  torch) raise ``RuntimeError`` naming the op, or warn with ``warn_only=True``.
- ``set_warn_always``: warnings that are given once per process (``frombuffer`` on a
  read-only buffer) are given at every call.
- ``set_num_interop_threads``: mpitensor runs independent ops one after another on the calling
  thread (NumPy has no inter-op pool), so the number is kept and reported, as torch keeps it;
  like torch, it can be set once. Intra-op threads are :func:`mpitensor.set_num_threads`.
- ``set_anomaly_enabled``: :func:`mpitensor.autograd.set_detect_anomaly`'s mode.

Example:
    >>> import mpitensor as torch
    >>> torch.use_deterministic_algorithms(True)
    >>> torch.are_deterministic_algorithms_enabled()
    True
    >>> torch.use_deterministic_algorithms(False)
"""

from __future__ import annotations

import builtins
import threading
import warnings
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._base import threads as _threads
from mpitensor._core.devices import xp
from mpitensor._core.opkit import NO_RECORD, Function, grad_enabled_for, wrap
from mpitensor._ops import create as _create
from mpitensor._ops.numeric import gradient, histogramdd
from mpitensor._ops.strided import as_strided, as_strided_, as_strided_scatter
from mpitensor.autograd import anomaly as _anomaly
from mpitensor.autograd.grad_mode import _mode as _grad_mode
from mpitensor.tensor import Tensor

__all__ = [
    "use_deterministic_algorithms", "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled", "set_deterministic_debug_mode",
    "get_deterministic_debug_mode", "set_warn_always", "is_warn_always_enabled",
    "is_inference_mode_enabled", "is_inference", "typename", "is_storage", "get_device",
    "set_num_interop_threads", "get_num_interop_threads", "set_anomaly_enabled",
    "is_anomaly_enabled", "is_anomaly_check_nan_enabled", "frombuffer", "from_dlpack",
    "to_dlpack", "fill", "empty_permuted", "range", "gradient", "histogramdd", "as_strided",
    "as_strided_", "as_strided_scatter",
]


def _need_bool(value: Any, fname: str, arg: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fname}(): {arg} must be a bool, got {type(value).__name__}")
    return bool(value)


# --------------------------------------------------------------------------- determinism
def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Make the ops that could give a different result on each run take a deterministic way,
    and those without one raise ``RuntimeError`` naming the op (``warn_only``: warn).

    Args:
        mode: on (True) or off (False).
        warn_only: with ``mode``, warn instead of raising.

    Raises:
        TypeError: ``mode`` or ``warn_only`` is not a bool.

    Example:
        >>> import mpitensor as torch
        >>> torch.use_deterministic_algorithms(True, warn_only=True)
        >>> torch.is_deterministic_algorithms_warn_only_enabled()
        True
        >>> torch.use_deterministic_algorithms(False)
    """
    mode = _need_bool(mode, "use_deterministic_algorithms", "mode")
    warn_only = _need_bool(warn_only, "use_deterministic_algorithms", "warn_only")
    _determinism.set_mode(mode, warn_only)


def are_deterministic_algorithms_enabled() -> bool:
    """Whether :func:`use_deterministic_algorithms` is on."""
    return _determinism.state.enabled


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """Whether :func:`use_deterministic_algorithms` is on with ``warn_only``."""
    return _determinism.state.warn_only


_py_range = builtins.range

_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_deterministic_debug_mode(debug_mode: Any) -> None:
    """:func:`use_deterministic_algorithms` by level: ``"default"``/0 off, ``"warn"``/1 on
    with warnings, ``"error"``/2 on.

    Raises:
        TypeError: neither a str nor an int.
        RuntimeError: a name or level not among those.
    """
    if isinstance(debug_mode, str):
        if debug_mode not in _DEBUG_MODES:
            raise RuntimeError(f"set_deterministic_debug_mode(): {debug_mode!r} is not one of "
                               f"'default', 'warn', 'error'")
        level = _DEBUG_MODES[debug_mode]
    elif isinstance(debug_mode, int) and not isinstance(debug_mode, bool):
        if debug_mode not in (0, 1, 2):
            raise RuntimeError(f"set_deterministic_debug_mode(): level {debug_mode} is not one "
                               f"of 0, 1, 2")
        level = debug_mode
    else:
        raise TypeError(f"set_deterministic_debug_mode(): expected a str or an int, got "
                        f"{type(debug_mode).__name__}")
    _determinism.set_mode(level > 0, level == 1)


def get_deterministic_debug_mode() -> int:
    """The level :func:`set_deterministic_debug_mode` takes: 0 off, 1 warn, 2 error."""
    if not _determinism.state.enabled:
        return 0
    return 1 if _determinism.state.warn_only else 2


# ----------------------------------------------------------------------- warnings, modes
class _Once:
    """Which warnings given once per process were given (and whether to give them always)."""

    def __init__(self) -> None:
        self.always = False
        self.given: set = set()
        self.lock = threading.Lock()


_once = _Once()


def set_warn_always(b: bool) -> None:
    """Give the warnings that are given once per process at every call instead (True).

    Raises:
        RuntimeError: ``b`` is not a bool (as torch).
    """
    if not isinstance(b, (bool, np.bool_)):
        raise RuntimeError(f"set_warn_always(): expected a bool, got {type(b).__name__}")
    _once.always = bool(b)


def is_warn_always_enabled() -> bool:
    """Whether :func:`set_warn_always` is on."""
    return _once.always


def warn_once(key: str, text: str, stacklevel: int = 3) -> None:
    """Warn ``text`` the first time ``key`` comes up in this process (every time with
    :func:`set_warn_always`)."""
    with _once.lock:
        first = key not in _once.given
        _once.given.add(key)
    if first or _once.always:
        warnings.warn(text, UserWarning, stacklevel=stacklevel)


def is_inference_mode_enabled() -> bool:
    """Whether the calling thread is inside :class:`mpitensor.inference_mode` (enabled)."""
    return _grad_mode.inference


def is_inference(input: Tensor) -> bool:  # noqa: A002 - torch's name
    """Whether ``input`` is an inference tensor (see :meth:`Tensor.is_inference`)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"is_inference(): expected a Tensor, got {type(input).__name__}")
    return input.is_inference()


def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
    """Turn autograd's anomaly mode on or off (:func:`mpitensor.autograd.set_detect_anomaly`).

    Example:
        >>> import mpitensor as torch
        >>> torch.set_anomaly_enabled(True); torch.is_anomaly_enabled()
        True
        >>> torch.set_anomaly_enabled(False)
    """
    _anomaly.set_detect_anomaly(enabled, check_nan)


def is_anomaly_enabled() -> bool:
    """Whether autograd's anomaly mode is on."""
    return _anomaly.is_anomaly_enabled()


def is_anomaly_check_nan_enabled() -> bool:
    """Whether anomaly mode, when on, fails a backward on a NaN gradient (the flag
    :func:`set_anomaly_enabled` keeps, read with the mode off too, as torch's)."""
    return _anomaly._state.check_nan


# ------------------------------------------------------------------------ small queries
def typename(obj: Any, /) -> str:
    """The type's name: a tensor's legacy type name (``"mpitensor.FloatTensor"``, as
    ``t.type()``); a class or function names itself (``"mpitensor.nn.modules.linear.Linear"``);
    any other object its class. Builtins are named bare (``"int"``, ``"len"``)."""
    if isinstance(obj, Tensor):
        return obj.type()
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(name, str):
        name = type(obj).__qualname__
    if not isinstance(module, str) or module in ("", "builtins"):
        return name
    return f"{module}.{name}"


def is_storage(obj: Any, /) -> bool:
    """Whether ``obj`` is a storage object. mpitensor has no separate storage type (a tensor's
    memory is its NumPy or CuPy array's), so nothing is: tensors and arrays are not."""
    return False


def get_device(input: Tensor) -> int:  # noqa: A002 - torch's name
    """The GPU index of a CUDA tensor, -1 for a CPU tensor.

    Raises:
        TypeError: ``input`` is not a Tensor.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"get_device(): expected a Tensor, got {type(input).__name__}")
    return input.get_device()


class _Interop:
    """The inter-op thread count: kept and reported (there is no inter-op pool to size)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Optional[int] = None


_interop = _Interop()


def set_num_interop_threads(n: int) -> None:
    """Set the inter-op thread count, once per process (as torch: a second call raises).

    mpitensor runs independent ops one after another on the calling thread, so the number
    changes no pool; it is what :func:`get_num_interop_threads` reports. Intra-op threads
    (BLAS, split elementwise passes) are :func:`mpitensor.set_num_threads`'s.

    Raises:
        RuntimeError: ``n`` is not a positive int, or the count was set before (as torch).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise RuntimeError(f"set_num_interop_threads(): expected an int, got "
                           f"{type(n).__name__}")
    if n < 1:
        raise RuntimeError(f"set_num_interop_threads(): expected a positive integer, got {n}")
    with _interop.lock:
        if _interop.count is not None:
            raise RuntimeError("set_num_interop_threads(): the inter-op thread count was set "
                               "already; it can be set once per process, before it is used")
        _interop.count = int(n)


def get_num_interop_threads() -> int:
    """The inter-op thread count: the one set, else the cores this process may run on."""
    if _interop.count is not None:
        return _interop.count
    return max(1, len(_threads.affinity()))


# ----------------------------------------------------------------------------- creation
def frombuffer(buffer: Any, *, dtype: Any, count: int = -1, offset: int = 0,
               requires_grad: bool = False) -> Tensor:
    """A 1-D tensor over the memory of an object with the buffer protocol (``bytes``,
    ``bytearray``, ``array.array``, ``memoryview``, ...), without copying: writes through the
    tensor change the buffer. ``offset`` bytes are skipped, then ``count`` elements are read
    (-1: all that remain).

    Raises:
        ValueError: an empty buffer, an offset past its end, a remainder that is not whole
            elements, or ``count`` elements that do not fit.

    Example:
        >>> import mpitensor as torch
        >>> torch.frombuffer(bytearray(b"\\x01\\x00\\x02\\x00"), dtype=torch.int16)
        tensor([1, 2], dtype=mpitensor.int16)
    """
    dt = _dt.to_dtype(dtype)
    view = memoryview(buffer).cast("B")
    size, item = view.nbytes, dt.itemsize
    if size == 0 or count == 0:
        raise ValueError(f"frombuffer(): the buffer ({size} bytes) and count ({count}) must "
                         f"not be empty")
    if offset < 0 or offset >= size:
        raise ValueError(f"frombuffer(): offset {offset} must lie in the buffer of {size} "
                         f"bytes (0 to {size - 1})")
    if count < 0:
        if (size - offset) % item:
            raise ValueError(f"frombuffer(): the {size - offset} bytes after offset {offset} "
                             f"are not a whole number of {item}-byte elements; give count")
        count = (size - offset) // item
    elif offset + count * item > size:
        raise ValueError(f"frombuffer(): {count} elements of {item} bytes from offset {offset} "
                         f"need {offset + count * item} bytes; the buffer has {size}")
    if view.readonly:
        warn_once("frombuffer:readonly",
                  "frombuffer(): the buffer is read-only; the tensor over it is read-only too "
                  "(copy it, or pass a bytearray, to write)")
    arr = np.frombuffer(view, dtype=dt, count=count, offset=offset)
    t = wrap(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


class _Capsule:
    """A DLPack capsule handed to NumPy or CuPy, which take objects with ``__dlpack__``."""

    def __init__(self, capsule: Any, device: tuple) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple:
        return self.device


def _capsule_device(capsule: Any) -> tuple:
    """``(device type, index)`` read from a DLPack capsule's tensor (DLPack's ABI: the data
    pointer, then the device as two 32-bit ints)."""
    import ctypes  # noqa: PLC0415 - only for raw capsules

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    try:
        ptr = get(capsule, b"dltensor")
    except ValueError:
        raise RuntimeError("from_dlpack(): the capsule was used already (a DLPack capsule "
                           "can be consumed once); make a new one with to_dlpack()") from None
    dev = (ctypes.c_int32 * 2).from_address(ptr + ctypes.sizeof(ctypes.c_void_p))
    return int(dev[0]), int(dev[1])


_DL_CPU, _DL_CUDA_HOST = 1, 3


class _Writable:
    """``a``'s memory, writable: a raw capsule (DLPack before version 1) carries no read-only
    flag, so NumPy marks what it makes of one read-only; its producer (torch's
    ``to_dlpack``, ...) hands out memory that may be written, as torch's ``from_dlpack``
    assumes."""

    def __init__(self, a: np.ndarray) -> None:
        face = dict(a.__array_interface__)
        face["data"] = (face["data"][0], False)
        self.__array_interface__ = face
        self.keep = a


def from_dlpack(ext_tensor: Any) -> Tensor:
    """A tensor sharing the memory of ``ext_tensor``: any object with ``__dlpack__`` (a NumPy
    or CuPy array, a torch tensor, a JAX array, ...) or a DLPack capsule (consumed).

    Raises:
        RuntimeError: device memory without CuPy, or a used capsule.

    Example:
        >>> import numpy as np, mpitensor as torch
        >>> a = np.arange(3.0)
        >>> t = torch.from_dlpack(a); t[0] = 7.0; a[0]
        np.float64(7.0)
    """
    if isinstance(ext_tensor, Tensor):
        return wrap(ext_tensor._data)
    if hasattr(ext_tensor, "__dlpack__"):
        dev = tuple(ext_tensor.__dlpack_device__())
        src = ext_tensor
    else:
        dev = _capsule_device(ext_tensor)
        src = _Capsule(ext_tensor, dev)
    if dev[0] in (_DL_CPU, _DL_CUDA_HOST):
        arr = np.from_dlpack(src)
        if isinstance(src, _Capsule) and not arr.flags.writeable:
            arr = np.asarray(_Writable(arr))
    else:
        arr = _backend.get_cupy().from_dlpack(src)
    _dt.to_dtype(arr.dtype)
    return wrap(arr)


def to_dlpack(data: Tensor) -> Any:
    """A DLPack capsule over the tensor ``data``'s memory (no copy), for another library's
    ``from_dlpack`` (the argument is named ``data``, as torch's call takes it by keyword)."""
    if not isinstance(data, Tensor):
        raise TypeError(f"to_dlpack(): expected a Tensor, got {type(data).__name__}")
    return data._data.__dlpack__()


class Fill(Function):
    """A tensor shaped like ``x`` holding ``value`` (a 0-d array); no gradient for ``x``,
    the sum of the gradient for ``value``."""

    @staticmethod
    def forward(ctx: Any, x: Any, value: Any) -> Any:
        ctx.meta = (x.shape, x.dtype, value.dtype)
        out = xp(x).empty(x.shape, dtype=x.dtype)
        out[...] = value.astype(x.dtype) if value.dtype != x.dtype else value
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, vdtype = ctx.meta
        return xp(g).zeros(shape, dtype=dtype), g.sum().astype(vdtype)


def fill(input: Tensor, value: Any) -> Tensor:  # noqa: A002 - torch's name
    """A new tensor shaped like ``input``, in its dtype and device, every element ``value``
    (a number or a 0-d tensor); ``input`` is unchanged (``input.fill_(value)`` writes it).

    Raises:
        RuntimeError: ``value`` is a tensor with dimensions.

    Example:
        >>> import mpitensor as torch
        >>> torch.fill(torch.zeros(2, dtype=torch.int64), 2.7)
        tensor([2, 2])
    """
    x = input._data
    if isinstance(value, Tensor):
        if value._data.ndim:
            raise RuntimeError(f"fill(): value must be a number or a 0-d tensor, got a tensor "
                               f"with {value._data.ndim} dimensions")
        v = xp(x).asarray(value._data)
        if grad_enabled_for(input, value):
            return Fill.apply(input, value)
    else:
        v = xp(x).asarray(value)
        if grad_enabled_for(input):
            return Fill.apply(input, v)
    return wrap(Fill.forward(NO_RECORD, x, v))


def empty_permuted(size: Any, physical_layout: Any, *, dtype: Any = None, layout: Any = None,
                   device: Any = None, requires_grad: bool = False,
                   pin_memory: bool = False) -> Tensor:
    """An uninitialized tensor of shape ``size`` whose dimensions lie in memory in the order
    ``physical_layout`` names (outermost first): ``empty_permuted((2, 3, 4), (0, 2, 1))`` has
    strides ``(12, 1, 3)``.

    Raises:
        RuntimeError: ``physical_layout`` is not a permutation of the dimensions.
    """
    size, order = tuple(size), [int(d) for d in physical_layout]
    if len(order) != len(size):
        raise RuntimeError(f"empty_permuted(): physical_layout has {len(order)} dimensions, "
                           f"size {len(size)}")
    if sorted(order) != list(_py_range(len(size))):
        raise RuntimeError(f"empty_permuted(): physical_layout {order} is not a permutation "
                           f"of the dimensions 0..{len(size) - 1}")
    phys = _create.empty(*[size[d] for d in order], dtype=dtype, layout=layout, device=device,
                         pin_memory=pin_memory)
    out = phys.permute(*[order.index(d) for d in _py_range(len(size))])
    if requires_grad:
        out.requires_grad_(True)
    return out


def range(start: Any = 0, end: Any = None, step: Any = 1, *, out: Optional[Tensor] = None,  # noqa: A001
          dtype: Any = None, layout: Any = None, device: Any = None,
          requires_grad: bool = False) -> Tensor:
    """Deprecated, as in torch: the values ``start, start + step, ...`` up to ``end``
    *included*, in the default float dtype (or ``dtype``); prefer :func:`mpitensor.arange`,
    which stops before ``end``. Warns ``UserWarning`` at each call.

    Raises:
        TypeError: ``end`` is missing.
        RuntimeError: ``step`` is 0 or points away from ``end``.

    Example:
        >>> import warnings, mpitensor as torch
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     torch.range(1, 4)
        tensor([1., 2., 3., 4.])
    """
    warnings.warn("range() is deprecated: its end is included, unlike Python's range; use "
                  "arange(), which stops before end", UserWarning, stacklevel=2)
    if end is None:
        raise TypeError("range() missing 1 required positional argument: 'end'")
    lo, hi, st = (float(v.item()) if isinstance(v, Tensor) else float(v)
                  for v in (start, end, step))
    if st == 0:
        raise RuntimeError("range(): step must not be 0")
    if (hi - lo) * st < 0:
        raise RuntimeError(f"range(): step {st} points away from end {hi} (start {lo})")
    n = int(np.floor((hi - lo) / st)) + 1
    dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
    values = lo + np.arange(n, dtype=np.float64) * st
    r = _create.tensor(values, dtype=dt, device=device)
    if out is not None:
        out.resize_(n).copy_(r)
        return out
    if requires_grad:
        r.requires_grad_(True)
    return r
