"""The Tensor: a thin, fast wrapper around a NumPy array (CPU) or a CuPy array (GPU).

``Tensor._data`` is the array itself. The communication layer reads and writes it in place, so a
Tensor never copies on wrapping, views share storage, and in-place operators write into
``_data``. Operations take their array module (NumPy or CuPy) from their input; CuPy is never
imported here at module level.

Semantics follow PyTorch where that is practical: dtype defaults (Python floats -> float32),
torch's type promotion (a Python scalar keeps a float tensor's dtype, ``int / int`` -> float32,
zero-dim tensors do not widen dimensioned ones), views, ``repr`` and printing options.

Autograd: when an input requires grad and grad mode is on, an operation is recorded through the
differentiable ``Function`` of the same name in ``mpitensor._ops`` (forward and backward side by
side); otherwise it runs the plain code here, behind one cheap check. In-place changes of a
tensor that requires grad are refused while grad mode is on (use ``no_grad()``, as optimisers do).

Example:
    >>> import mpitensor as mt
    >>> t = mt.tensor([[1., 2.], [3., 4.]])
    >>> t[0] += 10
    >>> t
    tensor([[11., 12.],
            [ 3.,  4.]])
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import os
import sys
from collections import namedtuple
from collections.abc import Iterator, Sequence
from typing import Any, Optional, Union

import numpy as np

from mpitensor import _printing
from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._printing import get_printoptions, printoptions, set_printoptions

__all__ = [
    "Tensor",
    "Size",
    "tensor",
    "as_tensor",
    "from_numpy",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "linspace",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "Generator",
    "default_generator",
    "manual_seed",
    "seed",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "cat",
    "concat",
    "stack",
    "where",
    "allclose",
    "equal",
    "is_tensor",
    "is_floating_point",
    "is_complex",
    "numel",
    "set_printoptions",
    "get_printoptions",
    "printoptions",
    # torch-style functions of one tensor (``mt.exp(x)`` is ``x.exp()``)
    "exp",
    "log",
    "sqrt",
    "relu",
    "sigmoid",
    "tanh",
    "clamp",
    "clip",
    "matmul",
    "mean",
    "argmax",
    "argmin",
    "flatten",
    "reshape",
    "transpose",
    "permute",
    "squeeze",
    "unsqueeze",
    "softmax",
    "log_softmax",
    # served by __getattr__ below, so that this module's own code keeps the builtins
    "sum",
    "max",
    "min",
    "abs",
]

DeviceLike = Union[str, int, "_backend.device", None]
DTypeLike = Any

_ndarray = np.ndarray
_object_new = object.__new__
_NOPE = object()  # "not an operand": the binary operator returns NotImplemented
_INT64 = _dt.int64
_BOOL = _dt.bool_
_grad_mode = _autograd._mode  # thread-local; .enabled is False under no_grad()


# --------------------------------------------------------------------------------------------
# Size


class Size(tuple):
    """The shape of a tensor: a tuple of ints, printed as ``mpitensor.Size([2, 3])``.

    Example:
        >>> Size([2, 3]).numel()
        6
    """

    __slots__ = ()

    def __new__(cls, sizes: Sequence[int] = ()) -> Size:
        try:
            return tuple.__new__(cls, [operator.index(s) for s in sizes])
        except TypeError:
            raise TypeError(f"Size() takes a sequence of ints, got {sizes!r}") from None

    def __repr__(self) -> str:
        return f"mpitensor.Size({list(self)})"

    __str__ = __repr__

    def __getitem__(self, key: Any) -> Any:
        r = tuple.__getitem__(self, key)
        return tuple.__new__(Size, r) if isinstance(key, slice) else r

    def __add__(self, other: Any) -> Size:
        if not isinstance(other, tuple):
            return NotImplemented
        return tuple.__new__(Size, tuple.__add__(self, other))

    def __reduce__(self) -> Any:
        return (Size, (tuple(self),))

    def numel(self) -> int:
        """Return the number of elements a tensor of this shape holds."""
        return math.prod(self)


# --------------------------------------------------------------------------------------------
# Small helpers


def _new(arr: Any) -> Tensor:
    """Wrap an array in a plain Tensor without copying or checking (the internal fast path)."""
    if isinstance(arr, np.generic):  # NumPy returns scalars from ops on 0-d arrays
        arr = np.asarray(arr)
    t = _object_new(Tensor)
    t._data = arr
    t._requires_grad = False
    t.grad = None
    t.grad_fn = None
    return t


def _xp(x: Any) -> Any:
    return np if isinstance(x, _ndarray) else _backend.array_module(x)


def _is_cupy(x: Any) -> bool:
    return not isinstance(x, _ndarray) and _backend.is_cupy_array(x)


def _dev_str(x: Any) -> str:
    return str(_backend.device_of(x))


def _parse_device(device: DeviceLike) -> Optional[_backend.device]:
    if device is None or isinstance(device, _backend.device):
        return device
    if isinstance(device, str):
        return _backend.device(device)
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return _backend.device("cuda", int(device))
    raise TypeError(
        f"device must be 'cpu', 'cuda', 'cuda:N', a GPU index or a mpitensor.device, "
        f"got {device!r}"
    )


def _cuda_index(dev: _backend.device) -> int:
    cp = _backend.get_cupy()
    if dev.index is not None:
        return dev.index
    return int(cp.cuda.runtime.getDevice())


def _is_cpu(dev: Optional[_backend.device]) -> bool:
    return dev is None or dev.type == "cpu"


def _move(arr: Any, dev: Optional[_backend.device]) -> Any:
    """Return ``arr`` on device ``dev``: the same array when it is already there."""
    if dev is None:
        return arr
    if dev.type == "cpu":
        return arr.get() if _is_cupy(arr) else arr
    cp = _backend.get_cupy()
    idx = _cuda_index(dev)
    if _is_cupy(arr):
        if int(arr.device.id) == idx:
            return arr
        with cp.cuda.Device(idx):
            return arr.copy()  # CuPy copies onto the current device
    with cp.cuda.Device(idx):
        return cp.asarray(arr)


def _create(dev: Optional[_backend.device], name: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``numpy.<name>`` or, for a CUDA device, ``cupy.<name>`` on that device."""
    if _is_cpu(dev):
        return getattr(np, name)(*args, **kwargs)
    cp = _backend.get_cupy()
    with cp.cuda.Device(_cuda_index(dev)):
        return getattr(cp, name)(*args, **kwargs)


def _dtype_or(dtype: DTypeLike, default: np.dtype) -> np.dtype:
    return default if dtype is None else _dt.to_dtype(dtype)


def _size_from(args: tuple, fname: str, allow_minus_one: bool = False) -> tuple:
    """Parse ``f(2, 3)`` / ``f((2, 3))`` / ``f([2, 3])`` sizes into a tuple of ints."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    try:
        shape = tuple([operator.index(s) for s in args])
    except TypeError:
        raise TypeError(
            f"{fname}(): size must be ints or one tuple of ints, got {args!r}"
        ) from None
    for s in shape:
        if s < 0 and not (allow_minus_one and s == -1):
            raise ValueError(
                f"{fname}(): negative dimension {s} in size {list(shape)}; sizes must be >= 0"
            )
    return shape


def _wrap_dim(dim: Any, ndim: int) -> int:
    """Normalize a possibly negative dimension index; 0-d tensors accept 0 and -1, like torch."""
    try:
        d = operator.index(dim)
    except TypeError:
        raise TypeError(f"dim must be an int, got {dim!r}") from None
    n = ndim if ndim > 0 else 1
    if d < -n or d >= n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})"
        )
    return d % n


def _axes(dim: Any, ndim: int) -> Any:
    """Turn ``dim`` (None, int, tuple or list) into a NumPy ``axis`` argument."""
    if dim is None:
        return None
    if isinstance(dim, (tuple, list)):
        axes = tuple(_wrap_dim(d, ndim) for d in dim)
        if len(set(axes)) != len(axes):
            raise ValueError(f"dim {dim!r} names a dimension twice")
        return None if ndim == 0 else axes
    d = _wrap_dim(dim, ndim)
    return None if ndim == 0 else d


def _scalar_dtype(s: Any) -> np.dtype:
    """The dtype torch gives a Python scalar taking part in an operation."""
    if isinstance(s, bool):
        return _BOOL
    if isinstance(s, int):
        return _INT64
    if isinstance(s, float):
        return _dt.get_default_dtype()
    return _dt.default_complex_dtype()


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """torch.promote_types: an integer meeting a float takes the float type (NumPy widens)."""
    if a == b:
        return a
    ka, kb = a.kind, b.kind
    if ka == "b":
        return b
    if kb == "b":
        return a
    if ka in "iu" and kb in "fc":
        return b
    if kb in "iu" and ka in "fc":
        return a
    return np.promote_types(a, b)


def _to_complex(d: np.dtype) -> np.dtype:
    return _dt.complex128 if d == _dt.float64 else _dt.complex64


def _combine(higher: Optional[np.dtype], lower: Optional[np.dtype]) -> Optional[np.dtype]:
    """torch's combine_categories: a lower priority class only widens across categories."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    kh, kl = higher.kind, lower.kind
    if kh == "c":
        return higher
    if kl == "c":
        return _to_complex(higher) if kh == "f" else lower
    if kh == "f":
        return higher
    if kh == "b" or kl == "f":
        return _promote(higher, lower)
    return higher


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (bool, int, float, complex))


def _result_type(*ops: Any) -> np.dtype:
    """The dtype torch gives an operation on these arrays and Python scalars."""
    dim = zero = wrapped = None
    for o in ops:
        if _is_scalar(o):
            d = _scalar_dtype(o)
            wrapped = d if wrapped is None else _promote(wrapped, d)
        elif o.ndim:
            dim = o.dtype if dim is None else _promote(dim, o.dtype)
        else:
            zero = o.dtype if zero is None else _promote(zero, o.dtype)
    return _combine(dim, _combine(zero, wrapped))


def _can_cast(frm: np.dtype, to: np.dtype) -> bool:
    """torch's canCast for in-place results: no float->int, complex->real or number->bool."""
    kf, kt = frm.kind, to.kind
    if kf == "c" and kt != "c":
        return False
    if kf == "f" and kt in "biu":
        return False
    return not (kf != "b" and kt == "b")


def _operand(other: Any) -> Any:
    """An array or Python scalar for an operator's other side, or ``_NOPE``."""
    if isinstance(other, Tensor):
        return other._data
    t = type(other)
    if t is float or t is int or t is bool or t is complex:
        return other
    if isinstance(other, np.generic):
        v = other.item()
        return v if _is_scalar(v) else _NOPE
    if isinstance(other, _ndarray) or _backend.is_cupy_array(other):
        return other
    if isinstance(other, (bool, int, float, complex)):  # subclasses such as IntEnum
        for base in (bool, int, float, complex):
            if isinstance(other, base):
                return base(other)
    return _NOPE


def _same_device(x: Any, y: Any) -> tuple:
    """Bring two operands to one device; a CPU 0-d array meeting a GPU array acts as a scalar."""
    if _is_scalar(x) or _is_scalar(y):
        return x, y
    xc, yc = _is_cupy(x), _is_cupy(y)
    if xc == yc:
        return x, y
    if not yc and y.ndim == 0:
        return x, y.item()
    if not xc and x.ndim == 0:
        return x.item(), y
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{_dev_str(x)} and {_dev_str(y)}! Move one with .to(device) first."
    )


def _cast(v: Any, rt: np.dtype) -> Any:
    if _is_scalar(v) or v.dtype == rt:
        return v
    return v.astype(rt)


# Operation kinds for _binary / _inplace.
_ARITH, _TRUEDIV, _COMPARE, _DIVLIKE = 0, 1, 2, 3


def _apply(op: Any, x: Any, y: Any, mode: int) -> Any:
    if mode == _TRUEDIV or mode == _DIVLIKE:
        if isinstance(x, _ndarray) or isinstance(y, _ndarray):
            # torch divides by zero silently (inf / nan) where NumPy warns. np.errstate costs
            # microseconds, so skip it for the common, warning-free "float tensor / number".
            ty = type(y)
            if (ty is float or ty is int) and y != 0 and x.dtype.kind == "f":
                return op(x, y)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return op(x, y)
    return op(x, y)


_SUB_OPS = (operator.sub, operator.isub)
_NO_BOOL_OPS = (operator.floordiv, operator.mod, operator.pow,
                operator.ifloordiv, operator.imod, operator.ipow)


def _check_bool(op: Any, x: Any, y: Any, rt: Optional[np.dtype]) -> None:
    """Refuse what torch refuses for bools: ``-`` with any bool, ``// % **`` on bools."""
    if op in _SUB_OPS and (
        (not _is_scalar(x) and x.dtype.kind == "b")
        or (not _is_scalar(y) and y.dtype.kind == "b")
        or type(x) is bool
        or type(y) is bool
    ):
        raise TypeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
            "trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )
    if rt is not None and rt.kind == "b" and op in _NO_BOOL_OPS:
        raise TypeError(
            f"{_OP_NAMES[op]} is not implemented for bool tensors; convert them first, "
            f"e.g. t.int()"
        )


def _wrap_int(v: Any, x: Any) -> Any:
    """An int scalar outside ``x``'s integer range, wrapped modulo 2**bits as torch does."""
    if type(v) is int and not _is_scalar(x) and x.dtype.kind in "iu":
        bits = 8 * x.dtype.itemsize
        return np.array(v % (1 << bits), dtype=np.uint64).astype(x.dtype)
    return v


def _binary(a: Tensor, other: Any, op: Any, mode: int = _ARITH, rev: bool = False) -> Any:
    x = a._data
    if isinstance(other, Tensor):
        if (a._requires_grad or other._requires_grad) and _grad_mode.enabled and mode != _COMPARE:
            return _ops.binary(a, other, op, mode, rev)
        y = other._data
        # hot path: two tensors of one array type and dtype, no promotion or bool rules
        if (
            type(y) is type(x)
            and y.dtype == x.dtype
            and (mode == _ARITH or mode == _COMPARE)
            and x.dtype.kind != "b"
        ):
            r = op(y, x) if rev else op(x, y)
            if type(r) is not _ndarray:
                r = np.asarray(r) if isinstance(r, np.generic) else r
            t = _object_new(Tensor)
            t._data = r
            t._requires_grad = False
            t.grad = None
            t.grad_fn = None
            return t
    else:
        if a._requires_grad and _grad_mode.enabled and mode != _COMPARE:
            return _ops.binary(a, other, op, mode, rev)
        y = _operand(other)
        if y is _NOPE:
            return NotImplemented
    if op is operator.sub:
        _check_bool(op, x, y, None)
    y0 = y
    ty = type(y)
    if ty is float or ty is int or ty is bool or ty is complex:
        k = x.dtype.kind
        fast = (
            mode == _COMPARE
            or k in "fc"
            or (mode != _TRUEDIV and (ty is int or ty is bool) and k in "iu")
        )
    elif type(y) is type(x):
        k = x.dtype.kind
        fast = mode == _COMPARE or (
            y.dtype == x.dtype and k != "b" and (mode != _TRUEDIV or k in "fc")
        )
    else:
        fast = False
    if not fast:
        x, y = _same_device(x, y)
        if mode != _COMPARE:
            rt = _result_type(x, y)
            if mode == _TRUEDIV and rt.kind in "biu":
                rt = _dt.get_default_dtype()
            _check_bool(op, x, y, rt)
            x, y = _cast(x, rt), _cast(y, rt)
    try:
        try:
            r = _apply(op, y, x, mode) if rev else _apply(op, x, y, mode)
        except OverflowError:  # a Python int outside the tensor's integer range
            if mode == _COMPARE:
                raise
            y = _wrap_int(y, x)
            r = _apply(op, y, x, mode) if rev else _apply(op, x, y, mode)
    except TypeError as exc:
        xd = getattr(x, "dtype", type(x).__name__)
        yd = getattr(y, "dtype", type(y).__name__)
        raise TypeError(
            f"unsupported operand dtypes for {_OP_NAMES.get(op, op)}: {xd} and {yd} ({exc})"
        ) from exc
    if r is NotImplemented:
        return NotImplemented
    if mode != _COMPARE and not isinstance(r, _ndarray) and _is_cupy(r):
        # CuPy may apply value-based casting to Python scalars (uint8 + 300 -> uint16)
        rt = _result_type(a._data, y0)
        if mode == _TRUEDIV and rt.kind in "biu":
            rt = _dt.get_default_dtype()
        if r.dtype != rt and op is not operator.matmul:
            r = r.astype(rt)
    return _new(r)


def _inplace(a: Tensor, other: Any, iop: Any, mode: int = _ARITH) -> Any:
    if (
        a._requires_grad or (isinstance(other, Tensor) and other._requires_grad)
    ) and _grad_mode.enabled:
        _check_inplace(a, other, _OP_NAMES.get(iop, "in-place operator"))
    x = a._data
    y = _operand(other)
    if y is _NOPE:
        return NotImplemented
    ty = type(y)
    if ty is type(x):
        k = x.dtype.kind
        if y.dtype == x.dtype and k != "b" and (mode != _TRUEDIV or k in "fc"):
            _apply(iop, x, y, mode)  # same dtype: NumPy's in-place operator casts nothing
            return a
    elif (ty is float or ty is int) and x.dtype.kind in "fc":
        _apply(iop, x, y, mode)
        return a
    if not _is_scalar(y):
        if _is_cupy(x) != _is_cupy(y):
            if y.ndim != 0:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, {_dev_str(x)} and {_dev_str(y)}! Move one with .to(device) first."
                )
            y = y.item()
    rt = _result_type(x, y)
    if mode == _TRUEDIV and rt.kind in "biu":
        rt = _dt.get_default_dtype()
    _check_bool(iop, x, y, rt)
    if not _can_cast(rt, x.dtype):
        raise TypeError(
            f"result type {_dt.dt_repr(rt)} can't be cast to the desired output type "
            f"{_dt.dt_repr(x.dtype)} of this in-place {_OP_NAMES.get(iop, iop)}; use the "
            f"out-of-place operator or convert the tensor first, e.g. t = t.float()"
        )
    # Cast the result unsafely (uint8 += int64 wraps, as in torch); _can_cast vetted the kinds.
    ufunc = getattr(_xp(x), _UFUNC_OF[iop])
    try:
        _apply(functools.partial(ufunc, out=x, casting="unsafe"), x, y, mode)
    except OverflowError:
        _apply(functools.partial(ufunc, out=x, casting="unsafe"), x, _wrap_int(y, x), mode)
    return a


_UFUNC_OF = {
    operator.iadd: "add",
    operator.isub: "subtract",
    operator.imul: "multiply",
    operator.itruediv: "true_divide",
    operator.ifloordiv: "floor_divide",
    operator.imod: "remainder",
    operator.ipow: "power",
    operator.iand: "bitwise_and",
    operator.ior: "bitwise_or",
    operator.ixor: "bitwise_xor",
    operator.ilshift: "left_shift",
    operator.irshift: "right_shift",
}


_OP_NAMES = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
    operator.mod: "%",
    operator.pow: "**",
    operator.matmul: "@",
    operator.and_: "&",
    operator.or_: "|",
    operator.xor: "^",
    operator.lshift: "<<",
    operator.rshift: ">>",
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
    operator.iadd: "+=",
    operator.isub: "-=",
    operator.imul: "*=",
    operator.itruediv: "/=",
    operator.ifloordiv: "//=",
    operator.imod: "%=",
    operator.ipow: "**=",
    operator.iand: "&=",
    operator.ior: "|=",
    operator.ixor: "^=",
    operator.ilshift: "<<=",
    operator.irshift: ">>=",
}


def _check_inplace(a: Tensor, src: Any, what: str) -> None:
    """Refuse an in-place change that autograd would have to record (grad mode on).

    Under ``no_grad()`` it is allowed, as optimisers update parameters in place.
    """
    if not _grad_mode.enabled:
        return
    if a._requires_grad:
        if a.grad_fn is None:
            raise RuntimeError(
                f"a leaf Variable that requires grad is being used in an in-place operation. "
                f"({what}; wrap parameter updates in `with mpitensor.no_grad():`, or write to "
                f"`t.data`)"
            )
        raise RuntimeError(
            f"in-place operation {what} on a tensor produced by a recorded operation "
            f"({a.grad_fn.name()}) is not supported: mpitensor's autograd has no version "
            f"counters, so the change could silently corrupt gradients. Use the out-of-place "
            f"form (e.g. `y = y + 1` instead of `y += 1`), or clone() first and do it under "
            f"no_grad()"
        )
    if isinstance(src, Tensor) and src._requires_grad:
        raise RuntimeError(
            f"in-place operation {what} writes a tensor that requires grad into one that does "
            f"not; mpitensor's autograd cannot record that. Build the result out of place "
            f"(e.g. `a = a + b`, `mpitensor.cat`, `mpitensor.where`), or detach() the source"
        )


def _index_key(key: Any) -> Any:
    if isinstance(key, Tensor):
        return key._data
    if type(key) is tuple:
        return tuple(k._data if isinstance(k, Tensor) else k for k in key)
    return key


def _need_dims(x: Any, fname: str) -> None:
    if x.ndim == 0:
        raise IndexError(f"{fname}() needs a tensor with at least one dimension, got a 0-d one")


def _check_one_element(t: Tensor) -> Any:
    x = t._data
    if x.size != 1:
        raise ValueError("only one element tensors can be converted to Python scalars")
    return x.item()


# --------------------------------------------------------------------------------------------
# Tensor


_TYPE_NAMES = {
    "float32": "FloatTensor",
    "float64": "DoubleTensor",
    "float16": "HalfTensor",
    "int64": "LongTensor",
    "int32": "IntTensor",
    "int16": "ShortTensor",
    "int8": "CharTensor",
    "uint8": "ByteTensor",
    "uint16": "UInt16Tensor",
    "uint32": "UInt32Tensor",
    "uint64": "UInt64Tensor",
    "bool": "BoolTensor",
    "complex64": "ComplexFloatTensor",
    "complex128": "ComplexDoubleTensor",
}

_MaxResult = namedtuple("max", ["values", "indices"])
_MinResult = namedtuple("min", ["values", "indices"])


def _return_types_repr(self: Any) -> str:
    return (
        f"mpitensor.return_types.{type(self).__name__}(\n"
        f"values={self.values!r},\nindices={self.indices!r})"
    )


_MaxResult.__repr__ = _return_types_repr
_MinResult.__repr__ = _return_types_repr


class Tensor:
    """An n-dimensional array on the CPU (NumPy) or a GPU (CuPy), with PyTorch's interface.

    ``Tensor(array)`` wraps a NumPy or CuPy array without copying; ``Tensor(list)`` copies it to a
    tensor of the default float dtype and ``Tensor(2, 3)`` makes an uninitialized 2x3 one, like
    ``torch.Tensor``. Prefer :func:`tensor`, which infers the dtype.

    Attributes:
        _data: the underlying ``numpy.ndarray`` or ``cupy.ndarray`` (read and written in place by
            the communication layer).
        requires_grad: whether autograd should record operations on this tensor.
        grad: the accumulated gradient (None until autograd fills it).
        grad_fn: the autograd node that made this tensor (None for leaves).

    Example:
        >>> import numpy as np
        >>> a = np.zeros(3, dtype=np.float32)
        >>> Tensor(a)._data is a
        True
    """

    __slots__ = ("_data", "_requires_grad", "grad", "grad_fn", "_hooks", "__weakref__")

    __array_priority__ = 1000  # ndarray <op> Tensor defers to Tensor's reflected operator

    def __init__(self, data: Any = (), *sizes: int, requires_grad: bool = False) -> None:
        if sizes or (isinstance(data, (int, np.integer)) and not isinstance(data, bool)):
            arr = np.empty(_size_from((data, *sizes), "Tensor"), dtype=_dt.get_default_dtype())
        elif isinstance(data, Tensor):
            arr = data._data
        elif isinstance(data, _ndarray):
            arr = data if type(data) is _ndarray else data.view(_ndarray)
            _dt.to_dtype(arr.dtype)
        elif _backend.is_cupy_array(data):
            arr = data
            _dt.to_dtype(arr.dtype)
        else:
            arr = _from_data(data, _dt.get_default_dtype())
        self._data = arr
        self._requires_grad = False
        self.grad = None
        self.grad_fn = None
        if requires_grad:
            self.requires_grad = True

    @classmethod
    def _wrap(cls, arr: Any) -> Tensor:
        """Wrap an array without copying or validation (internal fast constructor)."""
        if isinstance(arr, np.generic):
            arr = np.asarray(arr)
        t = _object_new(cls)
        t._data = arr
        t._requires_grad = False
        t.grad = None
        t.grad_fn = None
        return t

    # ---- autograd -------------------------------------------------------------------------

    @property
    def requires_grad(self) -> bool:
        """Whether autograd records operations on this tensor (float/complex tensors only)."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        value = bool(value)
        if self.grad_fn is not None and not value:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use a "
                "computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach()."
            )
        if value and self._data.dtype.kind not in "fc":
            raise RuntimeError(
                f"only tensors of floating point and complex dtype can require gradients, this "
                f"one is {_dt.dt_repr(self._data.dtype)}; convert it first, e.g. t.float()"
            )
        self._requires_grad = value

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` in place and return self."""
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        """True for tensors not made by a recorded operation (``grad_fn`` is None)."""
        return self.grad_fn is None

    def backward(
        self, gradient: Any = None, retain_graph: Optional[bool] = None,
        create_graph: bool = False, inputs: Any = None,
    ) -> None:
        """Accumulate the gradient of this tensor into the ``.grad`` of the graph's leaves.

        Args:
            gradient: d(something)/d(self), shaped like self; may be omitted for one element.
            retain_graph: keep the graph's saved arrays for another backward.
            create_graph: unsupported (no higher-order gradients).
            inputs: restrict accumulation to these leaves.

        Example:
            >>> x = tensor([2.0], requires_grad=True)
            >>> (x * x).backward(ones(1))
            >>> x.grad
            tensor([4.])
        """
        _autograd.tensor_backward(self, gradient, retain_graph, create_graph, inputs)

    def register_hook(self, hook: Any) -> Any:
        """Run ``hook(grad)`` when this tensor's gradient is computed; see ``autograd``."""
        return _autograd.register_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        """Run ``hook(self)`` right after this leaf's ``.grad`` has been accumulated."""
        return _autograd.register_post_accumulate_grad_hook(self, hook)

    def detach(self) -> Tensor:
        """Return a tensor sharing this one's storage, outside autograd.

        Example:
            >>> w = ones(2, requires_grad=True)
            >>> w.detach().requires_grad
            False
        """
        return _new(self._data)

    def detach_(self) -> Tensor:
        """Detach this tensor from the graph in place (it becomes a leaf without grad)."""
        self.grad_fn = None
        self._requires_grad = False
        return self

    def retain_grad(self) -> None:
        """Keep the gradient of this non-leaf tensor in ``.grad`` during backward.

        Raises:
            RuntimeError: the tensor does not require grad.
        """
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        node = self.grad_fn
        if node is None or getattr(node, "retains_grad", False):
            return
        node.retains_grad = True

        def keep(g: Tensor) -> None:
            if self.grad is None:
                self.grad = _new(g._data.copy())
            else:
                self.grad._data += g._data

        _autograd.register_hook(self, keep)

    @property
    def data(self) -> Tensor:
        """A tensor sharing this one's storage, outside autograd (torch's ``.data``).

        In-place arithmetic on it changes this tensor, as the tutorials'
        ``param.grad.data /= world_size`` expects; assigning ``t.data = other`` replaces this
        tensor's storage with ``other``'s.
        """
        return _new(self._data)

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, Tensor):
            self._data = value._data
        elif _backend.is_array(value):
            self._data = value
        else:
            raise TypeError(f"Tensor.data must be set to a Tensor or an array, got "
                            f"{type(value).__name__}")

    # ---- metadata --------------------------------------------------------------------------

    @property
    def shape(self) -> Size:
        """The shape, as a :class:`Size`."""
        return tuple.__new__(Size, self._data.shape)

    def size(self, dim: Optional[int] = None) -> Any:
        """Return the shape, or the length of dimension ``dim``.

        Raises:
            IndexError: ``dim`` is out of range.
        """
        if dim is None:
            return tuple.__new__(Size, self._data.shape)
        x = self._data
        if x.ndim == 0:
            raise IndexError(f"dimension specified as {dim} but tensor has no dimensions")
        return x.shape[_wrap_dim(dim, x.ndim)]

    def dim(self) -> int:
        """Return the number of dimensions."""
        return self._data.ndim

    ndimension = dim

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self._data.ndim

    @property
    def dtype(self) -> np.dtype:
        """The element type (a ``numpy.dtype``, equal to e.g. ``mpitensor.float32``)."""
        return self._data.dtype

    @property
    def device(self) -> _backend.device:
        """The device the data lives on: ``device(type='cpu')`` or ``device(type='cuda', ...)``."""
        x = self._data
        if isinstance(x, _ndarray):
            return _backend.CPU
        return _backend.device_of(x)

    @property
    def is_cuda(self) -> bool:
        """True when the data is a CuPy array on a GPU."""
        return _is_cupy(self._data)

    @property
    def is_cpu(self) -> bool:
        """True when the data is a NumPy array."""
        return isinstance(self._data, _ndarray)

    def numel(self) -> int:
        """Return the number of elements."""
        return self._data.size

    nelement = numel

    def element_size(self) -> int:
        """Return the size of one element in bytes."""
        return self._data.itemsize

    @property
    def itemsize(self) -> int:
        """The size of one element in bytes."""
        return self._data.itemsize

    @property
    def nbytes(self) -> int:
        """The number of bytes the elements take (``numel() * element_size()``)."""
        return self._data.nbytes

    def stride(self, dim: Optional[int] = None) -> Any:
        """Return the strides in elements (a tuple), or the stride of dimension ``dim``."""
        x = self._data
        st = tuple(s // x.itemsize for s in x.strides)
        return st if dim is None else st[_wrap_dim(dim, x.ndim)]

    def data_ptr(self) -> int:
        """Return the address of the first element (host or device memory)."""
        x = self._data
        if isinstance(x, _ndarray):
            return x.__array_interface__["data"][0]
        return int(x.data.ptr)

    def is_contiguous(self) -> bool:
        """True when the elements are laid out in C (row-major) order without gaps."""
        return bool(self._data.flags.c_contiguous)

    def is_floating_point(self) -> bool:
        """True for float16/32/64 tensors."""
        return self._data.dtype.kind == "f"

    def is_complex(self) -> bool:
        """True for complex64/128 tensors."""
        return self._data.dtype.kind == "c"

    # ---- conversion to Python ----------------------------------------------------------------

    def item(self) -> Any:
        """Return the value of a one-element tensor as a Python number.

        Raises:
            RuntimeError: the tensor does not have exactly one element.

        Example:
            >>> tensor([2.5]).item()
            2.5
        """
        x = self._data
        if x.size != 1:
            raise RuntimeError(
                f"a Tensor with {x.size} elements cannot be converted to Scalar; index one "
                f"element first or use .tolist()"
            )
        return x.item()

    def tolist(self) -> Any:
        """Return the elements as (nested) Python lists, or a number for a 0-d tensor."""
        return self._data.tolist()

    def __float__(self) -> float:
        return float(_check_one_element(self))

    def __int__(self) -> int:
        return int(_check_one_element(self))

    def __complex__(self) -> complex:
        return complex(_check_one_element(self))

    def __bool__(self) -> bool:
        x = self._data
        if x.size != 1:
            what = "no values" if x.size == 0 else "more than one value"
            raise RuntimeError(
                f"Boolean value of Tensor with {what} is ambiguous; use .any() or .all()"
            )
        return bool(x.item())

    def __index__(self) -> int:
        x = self._data
        if x.size != 1 or x.dtype.kind not in "iub":
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(x.item())

    def __len__(self) -> int:
        x = self._data
        if x.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return x.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        x = self._data
        if x.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        if self._requires_grad and _grad_mode.enabled:
            return (self[i] for i in range(x.shape[0]))
        return (_new(x[i, ...]) for i in range(x.shape[0]))

    def __contains__(self, element: Any) -> bool:
        y = _operand(element)
        if y is _NOPE:
            raise TypeError(
                f"Tensor.__contains__ only supports a Tensor or a number, got "
                f"{type(element).__name__}"
            )
        x, y = _same_device(self._data, y)
        return bool((x == y).any())

    # Identity hash (C-level: autograd keys its per-backward tables by leaf tensors).
    __hash__ = object.__hash__

    # ---- array protocols ---------------------------------------------------------------------

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """Return the data as a NumPy array, sharing memory (CPU tensors only unless ``force``).

        Args:
            force: copy a GPU tensor to the host instead of raising.

        Raises:
            TypeError: the tensor is on a GPU (use ``.cpu()`` first, or ``force=True``).
            RuntimeError: the tensor requires grad (use ``.detach().numpy()``).

        Example:
            >>> t = zeros(2); t.numpy()[0] = 1; t
            tensor([1., 0.])
        """
        x = self._data
        if isinstance(x, _ndarray):
            if self._requires_grad and not force:
                raise RuntimeError(
                    "Can't call numpy() on Tensor that requires grad. "
                    "Use tensor.detach().numpy() instead."
                )
            return x
        if force:
            return x.get()
        raise TypeError(
            f"can't convert {_dev_str(x)} device type tensor to numpy. Use Tensor.cpu() to copy "
            f"the tensor to host memory first."
        )

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        x = self._data
        if not isinstance(x, _ndarray):
            raise TypeError(
                f"can't convert {_dev_str(x)} device type tensor to numpy. Use Tensor.cpu() to "
                f"copy the tensor to host memory first."
            )
        if dtype is not None and np.dtype(dtype) != x.dtype:
            if copy is False:
                raise ValueError(
                    f"converting a {x.dtype} tensor to {np.dtype(dtype)} needs a copy, "
                    f"but copy=False was passed"
                )
            return x.astype(dtype)
        return x.copy() if copy else x

    @property
    def __cuda_array_interface__(self) -> dict:
        x = self._data
        if isinstance(x, _ndarray):
            raise AttributeError(
                "a CPU tensor has no __cuda_array_interface__; move it with .cuda() first"
            )
        return x.__cuda_array_interface__

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        kwargs = {}
        if stream is not None:
            kwargs["stream"] = stream
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple:
        return self._data.__dlpack_device__()

    def __getstate__(self) -> dict:
        return {"data": self._data, "requires_grad": self._requires_grad, "grad": self.grad}

    def __setstate__(self, state: dict) -> None:
        self._data = state["data"]
        self._requires_grad = state.get("requires_grad", False)
        self.grad = state.get("grad")
        self.grad_fn = None

    # ---- printing ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return _printing.tensor_repr(self)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        x = self._data
        if x.ndim == 0 and type(self) is Tensor:
            return x.item().__format__(spec)
        if spec:
            raise TypeError("unsupported format string passed to Tensor.__format__")
        return _printing.tensor_repr(self)

    # ---- indexing ----------------------------------------------------------------------------

    def __getitem__(self, key: Any) -> Tensor:
        x = self._data
        key = _index_key(key)
        r = x[key]
        if isinstance(r, np.generic):  # a single element: torch returns a 0-d view
            key = (*key, Ellipsis) if type(key) is tuple else (key, Ellipsis)
            r = x[key]
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Index.apply(self, r, key)
        return _new(r)

    def __setitem__(self, key: Any, value: Any) -> None:
        if (
            self._requires_grad or (isinstance(value, Tensor) and value._requires_grad)
        ) and _grad_mode.enabled:
            _check_inplace(self, value, "__setitem__")
        x = self._data
        key = _index_key(key)
        if isinstance(value, Tensor):
            value = value._data
        if isinstance(x, _ndarray):
            if _backend.is_cupy_array(value):
                value = value.get()
        elif isinstance(value, _ndarray):
            value = _move(value, _backend.device_of(x))
        x[key] = value

    # ---- arithmetic --------------------------------------------------------------------------

    def __add__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.add)

    def __radd__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.add, rev=True)

    def __iadd__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.iadd)

    def __sub__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.sub)

    def __rsub__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.sub, rev=True)

    def __isub__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.isub)

    def __mul__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.mul)

    def __rmul__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.mul, rev=True)

    def __imul__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.imul)

    def __truediv__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.truediv, _TRUEDIV)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.truediv, _TRUEDIV, rev=True)

    def __itruediv__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.itruediv, _TRUEDIV)

    def __floordiv__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.floordiv, _DIVLIKE)

    def __rfloordiv__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.floordiv, _DIVLIKE, rev=True)

    def __ifloordiv__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.ifloordiv, _DIVLIKE)

    def __mod__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.mod, _DIVLIKE)

    def __rmod__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.mod, _DIVLIKE, rev=True)

    def __imod__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.imod, _DIVLIKE)

    def __pow__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.pow, _DIVLIKE)

    def __rpow__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.pow, _DIVLIKE, rev=True)

    def __ipow__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.ipow, _DIVLIKE)

    def __matmul__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.matmul)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.matmul, rev=True)

    def __and__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.and_)

    def __rand__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.and_, rev=True)

    def __iand__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.iand)

    def __or__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.or_)

    def __ror__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.or_, rev=True)

    def __ior__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.ior)

    def __xor__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.xor)

    def __rxor__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.xor, rev=True)

    def __ixor__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.ixor)

    def __lshift__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.lshift)

    def __rlshift__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.lshift, rev=True)

    def __ilshift__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.ilshift)

    def __rshift__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.rshift)

    def __rrshift__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.rshift, rev=True)

    def __irshift__(self, other: Any) -> Tensor:
        return _inplace(self, other, operator.irshift)

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        if other is None:
            return False
        return _binary(self, other, operator.eq, _COMPARE)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        if other is None:
            return True
        return _binary(self, other, operator.ne, _COMPARE)

    def __lt__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.lt, _COMPARE)

    def __le__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.le, _COMPARE)

    def __gt__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.gt, _COMPARE)

    def __ge__(self, other: Any) -> Tensor:
        return _binary(self, other, operator.ge, _COMPARE)

    def __neg__(self) -> Tensor:
        x = self._data
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Neg.apply(self)
        if x.dtype.kind == "b":
            raise TypeError(
                "Negation, the `-` operator, on a bool tensor is not supported. If you are "
                "trying to invert a mask, use the `~` operator instead."
            )
        return _new(-x)

    def __pos__(self) -> Tensor:
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Alias.apply(self, self._data)
        return _new(self._data)

    def __abs__(self) -> Tensor:
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Abs.apply(self)
        return _new(abs(self._data))

    def __invert__(self) -> Tensor:
        x = self._data
        if x.dtype.kind not in "biu":
            raise TypeError(
                f"~ (bitwise not) needs an integer or bool tensor, got {_dt.dt_repr(x.dtype)}"
            )
        return _new(~x)

    # Named forms of the operators, as in torch.
    def add(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """Return ``self + alpha * other``."""
        return self + (other if alpha == 1 else other * alpha)

    def sub(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """Return ``self - alpha * other``."""
        return self - (other if alpha == 1 else other * alpha)

    def mul(self, other: Any) -> Tensor:
        """Return ``self * other``."""
        return self * other

    def div(self, other: Any, *, rounding_mode: Optional[str] = None) -> Tensor:
        """Return ``self / other``; ``rounding_mode`` ``"trunc"`` or ``"floor"`` rounds it.

        Raises:
            ValueError: unknown ``rounding_mode``.
        """
        if rounding_mode is None:
            return self / other
        if rounding_mode == "floor":
            return self // other
        if rounding_mode == "trunc":
            return _binary(self, other, _trunc_divide, _DIVLIKE)
        raise ValueError(
            f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
            f"{rounding_mode!r}"
        )

    true_divide = __truediv__
    floor_divide = __floordiv__
    remainder = __mod__
    pow = __pow__
    matmul = __matmul__
    eq = __eq__
    ne = __ne__
    lt = __lt__
    le = __le__
    gt = __gt__
    ge = __ge__
    neg = __neg__
    negative = __neg__

    def add_(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """In place: ``self += alpha * other``; returns self."""
        return _inplace(self, other if alpha == 1 else other * alpha, operator.iadd)

    def sub_(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """In place: ``self -= alpha * other``; returns self."""
        return _inplace(self, other if alpha == 1 else other * alpha, operator.isub)

    def mul_(self, other: Any) -> Tensor:
        """In place: ``self *= other``; returns self."""
        return _inplace(self, other, operator.imul)

    def div_(self, other: Any) -> Tensor:
        """In place: ``self /= other``; returns self."""
        return _inplace(self, other, operator.itruediv, _TRUEDIV)

    def pow_(self, other: Any) -> Tensor:
        """In place: ``self **= other``; returns self."""
        return _inplace(self, other, operator.ipow, _DIVLIKE)

    def abs(self) -> Tensor:
        """Return the element-wise absolute value."""
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Abs.apply(self)
        return _new(abs(self._data))

    def sqrt(self) -> Tensor:
        """Return the element-wise square root (integers are promoted to the default dtype)."""
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Sqrt.apply(self)
        return _float_unary(self, "sqrt")

    def exp(self) -> Tensor:
        """Return the element-wise exponential."""
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Exp.apply(self)
        return _float_unary(self, "exp")

    def log(self) -> Tensor:
        """Return the element-wise natural logarithm."""
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Log.apply(self)
        return _float_unary(self, "log")

    def relu(self) -> Tensor:
        """Return ``max(self, 0)`` element-wise.

        Example:
            >>> tensor([-1.0, 2.0]).relu()
            tensor([0., 2.])
        """
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Relu.apply(self)
        x = self._data
        if x.dtype.kind == "b":
            raise TypeError("relu() is not implemented for bool tensors; convert first, "
                            "e.g. t.float()")
        return _new(_ops.relu_forward(x))

    def sigmoid(self) -> Tensor:
        """Return the logistic function ``1 / (1 + exp(-self))`` element-wise."""
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Sigmoid.apply(self)
        x = self._data
        if x.dtype.kind not in "fc":
            x = x.astype(_dt.get_default_dtype())
        return _new(_ops.sigmoid_forward(x))

    def tanh(self) -> Tensor:
        """Return the hyperbolic tangent element-wise."""
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Tanh.apply(self)
        return _float_unary(self, "tanh")

    def softmax(self, dim: int, dtype: DTypeLike = None) -> Tensor:
        """Return ``exp(self) / exp(self).sum(dim)`` (see ``mpitensor.nn.functional.softmax``)."""
        from mpitensor.nn import functional as F  # noqa: PLC0415, N812 - nn imports tensor

        if dtype is None:
            return F.softmax(self, dim=dim)
        return F.softmax(self, dim=dim, dtype=dtype)

    def log_softmax(self, dim: int, dtype: DTypeLike = None) -> Tensor:
        """Return ``log(softmax(self, dim))``, computed stably (``nn.functional.log_softmax``)."""
        from mpitensor.nn import functional as F  # noqa: PLC0415, N812 - nn imports tensor

        if dtype is None:
            return F.log_softmax(self, dim=dim)
        return F.log_softmax(self, dim=dim, dtype=dtype)

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - torch names
        """Return the elements limited to ``[min, max]`` (either bound may be None).

        Raises:
            ValueError: both bounds are None.
        """
        if min is None and max is None:
            raise ValueError("clamp() needs at least one of min or max")
        x = self._data
        lo = min._data if isinstance(min, Tensor) else min
        hi = max._data if isinstance(max, Tensor) else max
        r = x
        if lo is not None:
            r = _xp(x).maximum(r, lo)
        if hi is not None:
            r = _xp(x).minimum(r, hi)
        rt = _result_type(*(v for v in (x, lo, hi) if v is not None))
        r = r if r.dtype == rt else r.astype(rt)
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Clamp.apply(self, r, lo, hi)
        return _new(r)

    clip = clamp

    # ---- reductions --------------------------------------------------------------------------

    def sum(self, dim: Any = None, keepdim: bool = False, *, dtype: DTypeLike = None) -> Tensor:
        """Return the sum over ``dim`` (an int, a tuple, or None for all elements).

        Integer and bool tensors sum to int64, as in torch.

        Example:
            >>> tensor([[1, 2], [3, 4]]).sum(dim=0)
            tensor([4, 6])
        """
        x = self._data
        dt = _dt.to_dtype(dtype) if dtype is not None else _acc_dtype(x.dtype)
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Sum.apply(self, _axes(dim, x.ndim), keepdim, dt)
        return _new(x.sum(axis=_axes(dim, x.ndim), dtype=dt, keepdims=keepdim))

    def prod(self, dim: Any = None, keepdim: bool = False, *, dtype: DTypeLike = None) -> Tensor:
        """Return the product over ``dim`` (integers and bools multiply in int64)."""
        x = self._data
        dt = _dt.to_dtype(dtype) if dtype is not None else _acc_dtype(x.dtype)
        return _new(x.prod(axis=_axes(dim, x.ndim), dtype=dt, keepdims=keepdim))

    def mean(self, dim: Any = None, keepdim: bool = False, *, dtype: DTypeLike = None) -> Tensor:
        """Return the mean over ``dim``; the tensor (or ``dtype``) must be float or complex.

        Raises:
            TypeError: an integer or bool tensor without a float ``dtype``.
        """
        x = self._data
        dt = _dt.to_dtype(dtype) if dtype is not None else x.dtype
        if dt.kind not in "fc":
            raise TypeError(
                f"mean(): could not infer output dtype. Input dtype must be either a floating "
                f"point or complex dtype. Got: {_dt.dt_repr(dt)}; pass dtype=mpitensor.float32 "
                f"or call .float() first"
            )
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Mean.apply(self, _axes(dim, x.ndim), keepdim, dt)
        return _new(x.mean(axis=_axes(dim, x.ndim), dtype=dt, keepdims=keepdim))

    def var(
        self, dim: Any = None, *, correction: int = 1, keepdim: bool = False
    ) -> Tensor:
        """Return the variance over ``dim`` with Bessel's ``correction`` (1 = unbiased)."""
        x = self._data
        if x.dtype.kind not in "fc":
            raise TypeError(
                f"std and var only support floating point and complex dtypes, got "
                f"{_dt.dt_repr(x.dtype)}"
            )
        if self._requires_grad and _grad_mode.enabled:
            ax = _axes(dim, x.ndim)
            n = x.size if ax is None else math.prod(
                x.shape[a] for a in (ax if isinstance(ax, tuple) else (ax,)))
            d = self - self.mean(dim, keepdim=True)
            return (d * d).sum(dim, keepdim=keepdim) / max(0, n - correction)
        with np.errstate(divide="ignore", invalid="ignore"):
            return _new(x.var(axis=_axes(dim, x.ndim), ddof=correction, keepdims=keepdim))

    def std(
        self, dim: Any = None, *, correction: int = 1, keepdim: bool = False
    ) -> Tensor:
        """Return the standard deviation over ``dim`` with Bessel's ``correction``."""
        return self.var(dim, correction=correction, keepdim=keepdim).sqrt()

    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Return the maximum; with ``dim``, a ``(values, indices)`` named tuple.

        ``t.max(other_tensor)`` is the element-wise maximum, as in torch.

        Raises:
            ValueError: the tensor is empty and no ``dim`` is given.

        Example:
            >>> tensor([[1, 5], [7, 2]]).max(dim=1).indices
            tensor([1, 0])
        """
        return _minmax(self, dim, keepdim, True)

    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Return the minimum; with ``dim``, a ``(values, indices)`` named tuple."""
        return _minmax(self, dim, keepdim, False)

    def argmax(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """Return the index of the maximum (into the flattened tensor when ``dim`` is None)."""
        x = self._data
        ax = None if dim is None else _axes(dim, x.ndim)
        return _new(x.argmax(axis=ax, keepdims=keepdim).astype(_INT64, copy=False))

    def argmin(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """Return the index of the minimum (into the flattened tensor when ``dim`` is None)."""
        x = self._data
        ax = None if dim is None else _axes(dim, x.ndim)
        return _new(x.argmin(axis=ax, keepdims=keepdim).astype(_INT64, copy=False))

    def all(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """Return whether all elements (over ``dim``) are non-zero, as a bool tensor."""
        x = self._data
        return _new(x.all(axis=_axes(dim, x.ndim), keepdims=keepdim))

    def any(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """Return whether any element (over ``dim``) is non-zero, as a bool tensor."""
        x = self._data
        return _new(x.any(axis=_axes(dim, x.ndim), keepdims=keepdim))

    def allclose(
        self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
    ) -> bool:
        """True when ``|self - other| <= atol + rtol * |other|`` everywhere (:func:`allclose`)."""
        return allclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan)

    def equal(self, other: Any) -> bool:
        """True when ``other`` has the same shape and the same values (see :func:`equal`)."""
        return equal(self, other)

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        """Return the indices of non-zero elements: an ``(n, ndim)`` int64 tensor, or a tuple."""
        x = self._data
        xp = _xp(x)
        if as_tuple:
            return tuple(_new(i.astype(_INT64, copy=False)) for i in xp.nonzero(xp.atleast_1d(x)))
        return _new(xp.argwhere(x).astype(_INT64, copy=False))

    def where(self, condition: Any, other: Any) -> Tensor:
        """Return ``self`` where ``condition`` holds and ``other`` elsewhere."""
        return where(condition, self, other)

    # ---- copies, views and shapes ------------------------------------------------------------

    def clone(self) -> Tensor:
        """Return a copy with its own storage (keeping the memory layout, as torch does)."""
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Clone.apply(self, self._data.copy(order="K"))
        return _new(self._data.copy(order="K"))

    def contiguous(self) -> Tensor:
        """Return self when C-contiguous, else a C-contiguous copy."""
        x = self._data
        if x.flags.c_contiguous:
            return self
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Clone.apply(self, _xp(x).ascontiguousarray(x))
        return _new(_xp(x).ascontiguousarray(x))

    def reshape(self, *shape: Any) -> Tensor:
        """Return the elements in a new shape: a view when possible, else a copy.

        Args:
            shape: ints or one tuple; one entry may be -1 (inferred).

        Raises:
            ValueError: the shape does not hold ``numel()`` elements.

        Example:
            >>> arange(6).reshape(2, -1).shape
            mpitensor.Size([2, 3])
        """
        x = self._data
        r = x.reshape(_infer_shape(shape, x.size, "reshape"))
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Reshape.apply(self, r)
        return _new(r)

    def view(self, *shape: Any) -> Tensor:
        """Return a view with a new shape (or a new dtype), never a copy.

        Args:
            shape: ints or one tuple (one entry may be -1), or a single dtype to reinterpret
                the bytes, like ``torch.Tensor.view(dtype)``.

        Raises:
            ValueError: the shape does not hold ``numel()`` elements.
            RuntimeError: the memory layout cannot be viewed in that shape (use ``reshape``).

        Example:
            >>> t = zeros(2, 3); t.view(6)[0] = 1; t[0, 0]
            tensor(1.)
        """
        x = self._data
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list)):
            s = shape[0]
            if not isinstance(s, (int, np.integer, Tensor)) or isinstance(s, bool):
                if self._requires_grad and _grad_mode.enabled:
                    raise RuntimeError(
                        "view(dtype) of a tensor that requires grad is not differentiable; "
                        "call it on t.detach()"
                    )
                return _new(x.view(_dt.to_dtype(s)))
        new_shape = _infer_shape(shape, x.size, "view")
        if isinstance(x, _ndarray):
            try:
                r = x.reshape(new_shape, copy=False)
            except ValueError:
                r = None
            except TypeError:  # NumPy < 2.1 has no reshape(copy=)
                r = x.view()
                try:
                    r.shape = new_shape
                except AttributeError:
                    r = None
        else:
            r = x.reshape(new_shape)
            if r.size and int(r.data.ptr) != int(x.data.ptr):
                r = None
        if r is None:
            raise RuntimeError(
                "view size is not compatible with input tensor's size and stride (at least one "
                "dimension spans across two contiguous subspaces). Use .reshape(...) instead."
            )
        if self._requires_grad and _grad_mode.enabled:
            return _ops.View.apply(self, r)
        return _new(r)

    def view_as(self, other: Tensor) -> Tensor:
        """Return ``self.view(other.shape)``."""
        return self.view(other.shape)

    def reshape_as(self, other: Tensor) -> Tensor:
        """Return ``self.reshape(other.shape)``."""
        return self.reshape(other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Return dimensions ``start_dim..end_dim`` merged into one (a view when possible).

        Raises:
            ValueError: ``start_dim`` comes after ``end_dim``.
        """
        x = self._data
        if x.ndim == 0:
            if self._requires_grad and _grad_mode.enabled:
                return _ops.View.apply(self, x.reshape(1))
            return _new(x.reshape(1))
        s, e = _wrap_dim(start_dim, x.ndim), _wrap_dim(end_dim, x.ndim)
        if s > e:
            raise ValueError(
                f"flatten() has invalid args: start_dim ({start_dim}) cannot come after "
                f"end_dim ({end_dim})"
            )
        if s == e:
            return self
        shape = x.shape[:s] + (math.prod(x.shape[s : e + 1]),) + x.shape[e + 1 :]
        if self._requires_grad and _grad_mode.enabled:
            return _ops.View.apply(self, x.reshape(shape))
        return _new(x.reshape(shape))

    def squeeze(self, dim: Any = None) -> Tensor:
        """Return a view without size-1 dimensions (only those in ``dim`` when given).

        Dimensions in ``dim`` whose size is not 1 are left alone, as in torch.
        """
        x = self._data
        if dim is None:
            r = x.squeeze()
        else:
            dims = dim if isinstance(dim, (tuple, list)) else (dim,)
            wrapped = [_wrap_dim(d, x.ndim) for d in dims]
            if x.ndim == 0:
                r = x[...]
            else:
                axes = tuple(d for d in wrapped if x.shape[d] == 1)
                r = x.squeeze(axis=axes) if axes else x[...]
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Squeeze.apply(self, r)
        return _new(r)

    def unsqueeze(self, dim: int) -> Tensor:
        """Return a view with a size-1 dimension inserted at ``dim``."""
        x = self._data
        d = _wrap_dim(dim, x.ndim + 1)
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Unsqueeze.apply(self, _xp(x).expand_dims(x, d))
        return _new(_xp(x).expand_dims(x, d))

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Return a view with dimensions ``dim0`` and ``dim1`` swapped."""
        x = self._data
        if x.ndim == 0:
            _wrap_dim(dim0, 0), _wrap_dim(dim1, 0)
            return +self if self._requires_grad and _grad_mode.enabled else _new(x[...])
        d0, d1 = _wrap_dim(dim0, x.ndim), _wrap_dim(dim1, x.ndim)
        if self._requires_grad and _grad_mode.enabled:
            axes = list(range(x.ndim))
            axes[d0], axes[d1] = d1, d0
            return _ops.Transpose.apply(self, x.swapaxes(d0, d1), tuple(axes))
        return _new(x.swapaxes(d0, d1))

    swapaxes = transpose

    def t(self) -> Tensor:
        """Return the transpose of a tensor with at most 2 dimensions.

        Raises:
            ValueError: the tensor has more than 2 dimensions (use ``transpose`` or ``mT``).
        """
        x = self._data
        if x.ndim > 2:
            raise ValueError(
                f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D; "
                f"use transpose(dim0, dim1) or .mT"
            )
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Permute.apply(self, x.T, tuple(range(x.ndim))[::-1])
        return _new(x.T)

    @property
    def T(self) -> Tensor:  # noqa: N802 - torch's name
        """A view with the dimensions reversed."""
        x = self._data
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Permute.apply(self, x.T, tuple(range(x.ndim))[::-1])
        return _new(x.T)

    @property
    def mT(self) -> Tensor:  # noqa: N802 - torch's name
        """A view with the last two dimensions swapped.

        Raises:
            ValueError: the tensor has fewer than 2 dimensions.
        """
        x = self._data
        if x.ndim < 2:
            raise ValueError(f"tensor.mT is only supported on matrices or batches of matrices. "
                             f"Got {x.ndim}-D tensor.")
        if self._requires_grad and _grad_mode.enabled:
            return self.transpose(-2, -1)
        return _new(x.swapaxes(-1, -2))

    def permute(self, *dims: Any) -> Tensor:
        """Return a view with the dimensions reordered.

        Raises:
            ValueError: ``dims`` is not a permutation of ``range(ndim)``.
        """
        x = self._data
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        if len(dims) != x.ndim:
            raise ValueError(
                f"permute(): the number of dims ({len(dims)}) does not match the tensor's "
                f"dimensions ({x.ndim}): pass one index per dimension"
            )
        wrapped = tuple(_wrap_dim(d, x.ndim) for d in dims)
        if sorted(wrapped) != list(range(x.ndim)):
            raise ValueError(f"permute(): dims {list(dims)} are not a permutation of {x.ndim} dims")
        r = x.transpose(wrapped) if x.ndim else x[...]
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Permute.apply(self, r, wrapped)
        return _new(r)

    def expand(self, *sizes: Any) -> Tensor:
        """Return a read-only broadcast view with size-1 dimensions repeated to ``sizes``.

        -1 keeps a dimension's size; extra leading dimensions may be added.

        Raises:
            ValueError: a non-singleton dimension would change, or too few sizes are given.

        Example:
            >>> tensor([[1], [2]]).expand(2, 3)
            tensor([[1, 1, 1],
                    [2, 2, 2]])
        """
        x = self._data
        sizes = _size_from(sizes, "expand", allow_minus_one=True)
        if len(sizes) < x.ndim:
            raise ValueError(
                f"expand(): the number of sizes provided ({len(sizes)}) must be greater or equal "
                f"to the number of dimensions in the tensor ({x.ndim})"
            )
        lead = len(sizes) - x.ndim
        target = []
        for i, s in enumerate(sizes):
            if i < lead:
                if s < 0:
                    raise ValueError(
                        f"expand(): -1 is not allowed in a leading, non-existing dimension ({i})"
                    )
                target.append(s)
                continue
            cur = x.shape[i - lead]
            if s == -1:
                s = cur
            elif cur != 1 and s != cur:
                raise ValueError(
                    f"The expanded size of the tensor ({s}) must match the existing size ({cur}) "
                    f"at non-singleton dimension {i}.  Target sizes: {list(sizes)}.  "
                    f"Tensor sizes: {list(x.shape)}"
                )
            target.append(s)
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Expand.apply(self, _xp(x).broadcast_to(x, tuple(target)))
        return _new(_xp(x).broadcast_to(x, tuple(target)))

    def expand_as(self, other: Tensor) -> Tensor:
        """Return ``self.expand(other.shape)``."""
        return self.expand(other.shape)

    def repeat(self, *sizes: Any) -> Tensor:
        """Return a copy tiled ``sizes[i]`` times along each dimension (``numpy.tile``).

        Raises:
            ValueError: fewer sizes than dimensions.
        """
        x = self._data
        sizes = _size_from(sizes, "repeat")
        if len(sizes) < x.ndim:
            raise ValueError(
                "Number of dimensions of repeat dims can not be smaller than number of "
                f"dimensions of tensor ({len(sizes)} < {x.ndim})"
            )
        if self._requires_grad and _grad_mode.enabled:
            return _ops.Repeat.apply(self, _xp(x).tile(x, sizes), sizes)
        return _new(_xp(x).tile(x, sizes))

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """Split into at most ``chunks`` views of equal size along ``dim`` (the last smaller)."""
        x = self._data
        _need_dims(x, "chunk")
        if operator.index(chunks) <= 0:
            raise ValueError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
        d = _wrap_dim(dim, x.ndim)
        n = x.shape[d]
        step = max(1, -(-n // chunks))
        return self.split(step, d)

    def split(self, split_size_or_sections: Any, dim: int = 0) -> tuple:
        """Split into views along ``dim``: pieces of one size, or of the listed sizes.

        Raises:
            ValueError: listed sizes do not add up to the dimension's length.
            IndexError: the tensor is 0-d.
        """
        x = self._data
        _need_dims(x, "split")
        d = _wrap_dim(dim, x.ndim)
        n = x.shape[d]
        if isinstance(split_size_or_sections, (list, tuple)):
            sizes = [operator.index(s) for s in split_size_or_sections]
            if sum(sizes) != n:
                raise ValueError(
                    f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's "
                    f"size at dimension {d}), but got split_sizes={sizes}"
                )
        else:
            step = operator.index(split_size_or_sections)
            if step <= 0:
                raise ValueError(f"split_size must be positive, got {step}")
            sizes = [min(step, n - i) for i in range(0, n, step)] or [0]
        out, start = [], 0
        pre = (slice(None),) * d
        piece = self.__getitem__ if self._requires_grad and _grad_mode.enabled else (
            lambda k: _new(x[k]))
        for s in sizes:
            out.append(piece((*pre, slice(start, start + s))))
            start += s
        return tuple(out)

    def unbind(self, dim: int = 0) -> tuple:
        """Return the views along ``dim``, that dimension removed."""
        x = self._data
        _need_dims(x, "unbind")
        d = _wrap_dim(dim, x.ndim)
        pre = (slice(None),) * d
        if self._requires_grad and _grad_mode.enabled:
            return tuple(self[(*pre, i, Ellipsis)] for i in range(x.shape[d]))
        return tuple(_new(x[(*pre, i, Ellipsis)]) for i in range(x.shape[d]))

    # ---- in-place fills and copies ------------------------------------------------------------

    def copy_(self, src: Any, non_blocking: bool = False) -> Tensor:
        """Copy ``src`` (broadcast, cast and moved across devices as needed) into self.

        Example:
            >>> t = zeros(3); _ = t.copy_(tensor([1, 2, 3])); t
            tensor([1., 2., 3.])
        """
        if self._requires_grad or (isinstance(src, Tensor) and src._requires_grad):
            _check_inplace(self, src, "copy_()")
        x = self._data
        v = src._data if isinstance(src, Tensor) else src
        if isinstance(x, _ndarray):
            if _backend.is_cupy_array(v):
                v = v.get()
            np.copyto(x, v, casting="unsafe")
        else:
            if not _backend.is_cupy_array(v):
                v = _move(np.asarray(v), _backend.device_of(x))
            _backend.get_cupy().copyto(x, v, casting="unsafe")
        return self

    def fill_(self, value: Any) -> Tensor:
        """Set every element to ``value`` (a number or a one-element tensor); returns self."""
        if self._requires_grad:
            _check_inplace(self, None, "fill_()")
        if isinstance(value, Tensor):
            value = value.item()
        self._data.fill(value)
        return self

    def zero_(self) -> Tensor:
        """Set every element to zero; returns self."""
        if self._requires_grad:
            _check_inplace(self, None, "zero_()")
        self._data.fill(0)
        return self

    # ---- devices and dtypes ------------------------------------------------------------------

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the tensor on another device and/or with another dtype (self if unchanged).

        Accepts ``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(other_tensor)`` and
        the keywords ``device=``, ``dtype=``, ``non_blocking=``, ``copy=``.

        Raises:
            TypeError: an argument is neither a device, a dtype nor a tensor.
            RuntimeError: a CUDA device is asked for and CuPy is missing.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([1, 2]).to(mt.float64)
            tensor([1., 2.], dtype=mpitensor.float64)
        """
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        copy = bool(kwargs.pop("copy", False))
        kwargs.pop("non_blocking", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        flags = []
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, bool):
                flags.append(a)
            elif isinstance(a, (_backend.device, int, np.integer)):
                device = a
            elif isinstance(a, str):
                try:
                    device = _backend.device(a)
                except ValueError:
                    dtype = _dt.to_dtype(a)
            elif a is None:
                continue
            else:
                try:
                    dtype = _dt.to_dtype(a)
                except TypeError:
                    raise TypeError(
                        f"to() takes a device, a dtype or a tensor, got {a!r}"
                    ) from None
        if len(flags) >= 2:
            copy = copy or flags[1]
        x = self._data
        r = _move(x, _parse_device(device))
        if dtype is not None:
            r = r.astype(_dt.to_dtype(dtype), copy=False)
        if r is x:
            if not copy:
                return self
            r = x.copy()
        if self._requires_grad and _grad_mode.enabled and r.dtype.kind in "fc":
            return _ops.ToCopy.apply(self, r)
        return _new(r)

    def cpu(self) -> Tensor:
        """Return the tensor in host memory (self when it already is)."""
        x = self._data
        if isinstance(x, _ndarray):
            return self
        if self._requires_grad and _grad_mode.enabled:
            return _ops.ToCopy.apply(self, x.get())
        return _new(x.get())

    def cuda(self, device: DeviceLike = None, non_blocking: bool = False) -> Tensor:
        """Return the tensor on a GPU (the current one by default); self when already there.

        Raises:
            RuntimeError: CuPy is not installed.
        """
        dev = _parse_device(device) if device is not None else _backend.device("cuda")
        if dev.type != "cuda":
            raise ValueError(f"cuda() needs a CUDA device, got {dev}")
        r = _move(self._data, dev)
        if r is self._data:
            return self
        if self._requires_grad and _grad_mode.enabled:
            return _ops.ToCopy.apply(self, r)
        return _new(r)

    def type(self, dtype: DTypeLike = None) -> Any:
        """Return the type name (``"mpitensor.FloatTensor"``) or, given a dtype, a cast tensor."""
        x = self._data
        if dtype is None:
            name = _TYPE_NAMES[_dt.dtype_name(x.dtype)]
            return f"mpitensor.cuda.{name}" if _is_cupy(x) else f"mpitensor.{name}"
        return _cast_tensor(self, _dt.to_dtype(dtype))

    def type_as(self, other: Tensor) -> Tensor:
        """Return the tensor cast to ``other``'s dtype."""
        return _cast_tensor(self, other.dtype)

    def new_tensor(
        self, data: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,
        requires_grad: bool = False,
    ) -> Tensor:
        """Return ``tensor(data)`` with this tensor's dtype and device by default."""
        return tensor(
            data,
            dtype=self.dtype if dtype is None else dtype,
            device=self.device if device is None else device,
            requires_grad=requires_grad,
        )

    def new_zeros(self, *size: Any, dtype: DTypeLike = None, device: DeviceLike = None,
                  requires_grad: bool = False) -> Tensor:
        """Return zeros of ``size`` with this tensor's dtype and device by default."""
        return zeros(*size, dtype=self.dtype if dtype is None else dtype,
                     device=self.device if device is None else device,
                     requires_grad=requires_grad)

    def new_ones(self, *size: Any, dtype: DTypeLike = None, device: DeviceLike = None,
                 requires_grad: bool = False) -> Tensor:
        """Return ones of ``size`` with this tensor's dtype and device by default."""
        return ones(*size, dtype=self.dtype if dtype is None else dtype,
                    device=self.device if device is None else device,
                    requires_grad=requires_grad)

    def new_empty(self, *size: Any, dtype: DTypeLike = None, device: DeviceLike = None,
                  requires_grad: bool = False) -> Tensor:
        """Return an uninitialized tensor of ``size`` with this tensor's dtype and device."""
        return empty(*size, dtype=self.dtype if dtype is None else dtype,
                     device=self.device if device is None else device,
                     requires_grad=requires_grad)

    def new_full(self, size: Any, fill_value: Any, *, dtype: DTypeLike = None,
                 device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
        """Return ``size`` filled with ``fill_value``, this tensor's dtype and device by default."""
        return full(size, fill_value, dtype=self.dtype if dtype is None else dtype,
                    device=self.device if device is None else device,
                    requires_grad=requires_grad)

    # dtype casts named as in torch; defined last because their names shadow builtins in the
    # class body (method bodies still see the builtins).
    def half(self) -> Tensor:
        """Return the tensor as float16 (self if it already is)."""
        return _cast_tensor(self, _dt.float16)

    def double(self) -> Tensor:
        """Return the tensor as float64 (self if it already is)."""
        return _cast_tensor(self, _dt.float64)

    def short(self) -> Tensor:
        """Return the tensor as int16 (self if it already is)."""
        return _cast_tensor(self, _dt.int16)

    def long(self) -> Tensor:
        """Return the tensor as int64 (self if it already is)."""
        return _cast_tensor(self, _dt.int64)

    def byte(self) -> Tensor:
        """Return the tensor as uint8 (self if it already is)."""
        return _cast_tensor(self, _dt.uint8)

    def char(self) -> Tensor:
        """Return the tensor as int8 (self if it already is)."""
        return _cast_tensor(self, _dt.int8)

    def cfloat(self) -> Tensor:
        """Return the tensor as complex64 (self if it already is)."""
        return _cast_tensor(self, _dt.complex64)

    def cdouble(self) -> Tensor:
        """Return the tensor as complex128 (self if it already is)."""
        return _cast_tensor(self, _dt.complex128)

    def float(self) -> Tensor:
        """Return the tensor as float32 (self if it already is); not a Python float."""
        return _cast_tensor(self, _dt.float32)

    def int(self) -> Tensor:
        """Return the tensor as int32 (self if it already is), like torch's ``Tensor.int()``."""
        return _cast_tensor(self, _dt.int32)

    def bool(self) -> Tensor:
        """Return the tensor as bool (self if it already is)."""
        return _cast_tensor(self, _dt.bool_)


# --------------------------------------------------------------------------------------------
# Helpers that need Tensor


def _cast_tensor(t: Tensor, dt: np.dtype) -> Tensor:
    x = t._data
    if x.dtype == dt:
        return t
    if t._requires_grad and _grad_mode.enabled and dt.kind in "fc":
        return _ops.ToCopy.apply(t, x.astype(dt))
    return _new(x.astype(dt))


def _acc_dtype(dt: np.dtype) -> Optional[np.dtype]:
    return _INT64 if dt.kind in "biu" else None


def _float_unary(t: Tensor, name: str) -> Tensor:
    x = t._data
    if x.dtype.kind in "biu":
        x = x.astype(_dt.get_default_dtype())
    fn = getattr(_xp(x), name)
    if isinstance(x, _ndarray):
        with np.errstate(divide="ignore", invalid="ignore"):
            return _new(fn(x))
    return _new(fn(x))


def _trunc_divide(x: Any, y: Any) -> Any:
    xp = _xp(x) if not _is_scalar(x) else _xp(y)
    rt = _result_type(x, y)
    if rt.kind in "fc":
        return xp.trunc(xp.true_divide(x, y))
    # x - fmod(x, y) is an exact multiple of y, so floor division gives the truncated quotient
    return (x - xp.fmod(x, y)) // y


def _minmax(t: Tensor, dim: Any, keepdim: bool, is_max: bool) -> Any:
    x = t._data
    name = "max" if is_max else "min"
    if dim is not None and not isinstance(dim, (int, np.integer)):
        other = _operand(dim)
        if other is _NOPE:
            raise TypeError(f"{name}() takes an int dim or a tensor, got {dim!r}")
        fn = "maximum" if is_max else "minimum"
        return _binary(t, dim, getattr(_xp(x), fn))
    if x.size == 0 and (dim is None or x.ndim == 0 or x.shape[_wrap_dim(dim, x.ndim)] == 0):
        raise ValueError(
            f"{name}(): cannot reduce an empty tensor of shape {list(x.shape)}; "
            f"it has no {name}imum"
        )
    if dim is None:
        r = x.max() if is_max else x.min()
        if t._requires_grad and _grad_mode.enabled:
            return (_ops.MaxAll if is_max else _ops.MinAll).apply(t, _xp(x).asarray(r))
        return _new(r)
    ax = _axes(dim, x.ndim)
    if is_max:
        values = x.max(axis=ax, keepdims=keepdim)
        indices = x.argmax(axis=ax, keepdims=keepdim)
    else:
        values = x.min(axis=ax, keepdims=keepdim)
        indices = x.argmin(axis=ax, keepdims=keepdim)
    cls = _MaxResult if is_max else _MinResult
    indices = indices.astype(_INT64, copy=False)
    if t._requires_grad and _grad_mode.enabled and x.ndim == 0:
        return cls(_ops.Alias.apply(t, _xp(x).asarray(values)), _new(indices))
    if t._requires_grad and _grad_mode.enabled:
        fn = _ops.MaxDim if is_max else _ops.MinDim
        return cls(fn.apply(t, values, indices, _wrap_dim(ax, x.ndim), keepdim), _new(indices))
    return cls(_new(values), _new(indices))


def _infer_shape(shape: tuple, n: int, fname: str) -> tuple:
    shape = _size_from(shape, fname, allow_minus_one=True)
    if shape.count(-1) > 1:
        raise ValueError(f"{fname}(): only one dimension can be inferred (-1), got {list(shape)}")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or n % known:
            raise ValueError(f"shape '{list(shape)}' is invalid for input of size {n}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    elif known != n:
        raise ValueError(f"shape '{list(shape)}' is invalid for input of size {n}")
    return shape


def _first_leaf(data: Any) -> Any:
    """The first non-sequence element of nested lists/tuples (or the data itself)."""
    depth = 0
    while isinstance(data, (list, tuple)) and data and depth < 64:
        data = data[0]
        depth += 1
    return data


def _from_data(data: Any, dtype: Optional[np.dtype]) -> np.ndarray:
    """A fresh NumPy array from Python data, with torch's dtype inference when ``dtype`` is None."""
    if isinstance(data, np.generic):  # NumPy scalars keep their dtype (np.float64 -> float64)
        return np.array(data, dtype=dtype)
    if _is_scalar(data):
        return np.array(data, dtype=_scalar_dtype(data) if dtype is None else dtype)
    if isinstance(data, (str, bytes)):
        raise TypeError(f"tensor() cannot make a tensor from {type(data).__name__} {data!r}")
    try:
        arr = np.array(data, dtype=dtype)
    except ValueError as exc:
        raise ValueError(
            f"tensor() could not convert the data: {exc}; nested sequences must be rectangular"
        ) from None
    except TypeError as exc:
        raise TypeError(f"tensor() could not convert the data: {exc}") from None
    if arr.dtype.kind not in "biufc":
        raise TypeError(
            f"tensor() could not infer a numeric dtype from {type(data).__name__} data (NumPy "
            f"made {arr.dtype}); pass numbers, nested sequences of numbers, or arrays"
        )
    if dtype is None:
        leaf = _first_leaf(data)
        if _is_scalar(leaf) or (isinstance(leaf, (list, tuple)) and not leaf):
            kind = arr.dtype.kind
            if kind == "f":
                arr = arr.astype(_dt.get_default_dtype(), copy=False)
            elif kind == "c":
                arr = arr.astype(_dt.default_complex_dtype(), copy=False)
            elif kind == "i":
                arr = arr.astype(_INT64, copy=False)
    _dt.to_dtype(arr.dtype)
    return arr


def _finish(arr: Any, requires_grad: bool) -> Tensor:
    t = _new(arr)
    if requires_grad:
        t.requires_grad = True
    return t


# --------------------------------------------------------------------------------------------
# Constructors


def tensor(
    data: Any,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a new tensor holding a copy of ``data``, like ``torch.tensor``.

    Python floats become the default dtype (float32), ints int64, bools bool and complex numbers
    complex64; arrays and tensors keep their dtype.

    Args:
        data: a number, nested lists/tuples of numbers, a NumPy/CuPy array or a Tensor.
        dtype: the element type (default: inferred as above).
        device: ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or a :class:`device`.
        requires_grad: mark the result for autograd (float/complex only).

    Returns:
        A new Tensor that shares no memory with ``data``.

    Raises:
        TypeError: the data is not numeric, or ``dtype``/``device`` is not understood.
        ValueError: nested sequences are ragged.

    Example:
        >>> tensor([[1, 2], [3, 4]]).dtype
        dtype('int64')
    """
    dt = None if dtype is None else _dt.to_dtype(dtype)
    dev = _parse_device(device)
    if isinstance(data, Tensor):
        data = data._data
    if isinstance(data, _ndarray) or _backend.is_cupy_array(data):
        src_dev = _backend.device_of(data)
        arr = data.astype(dt if dt is not None else data.dtype, copy=True)
        if dev is not None and dev != src_dev:
            arr = _move(arr, dev)
        _dt.to_dtype(arr.dtype)
    else:
        arr = _move(_from_data(data, dt), dev)
    return _finish(arr, requires_grad)


def as_tensor(data: Any, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """Make a tensor from ``data`` sharing memory when possible (same dtype and device).

    Args:
        data: a Tensor, a NumPy/CuPy array, or Python data (copied, as in :func:`tensor`).
        dtype: the element type (default: keep or infer).
        device: the target device (default: keep, CPU for Python data).

    Returns:
        ``data`` itself for a Tensor that already matches; otherwise a new Tensor.

    Example:
        >>> import numpy as np
        >>> a = np.zeros(2); as_tensor(a)._data is a
        True
    """
    dt = None if dtype is None else _dt.to_dtype(dtype)
    dev = _parse_device(device)
    if isinstance(data, Tensor):
        x = data._data
        r = _move(x, dev)
        if dt is not None:
            r = r.astype(dt, copy=False)
        return data if r is x else _new(r)
    if isinstance(data, _ndarray) or _backend.is_cupy_array(data):
        if isinstance(data, _ndarray) and type(data) is not _ndarray:
            data = data.view(_ndarray)
        r = _move(data, dev)
        if dt is not None:
            r = r.astype(dt, copy=False)
        _dt.to_dtype(r.dtype)
        return _new(r)
    return tensor(data, dtype=dt, device=dev)


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """Wrap a NumPy array in a Tensor that shares its memory (writes go both ways).

    Args:
        ndarray: a ``numpy.ndarray`` of a supported dtype.

    Returns:
        A CPU Tensor whose ``_data`` is ``ndarray``.

    Raises:
        TypeError: not a NumPy array, or an unsupported dtype (object, strings, ...).

    Example:
        >>> import numpy as np
        >>> a = np.arange(3); t = from_numpy(a); a[0] = 7; t
        tensor([7, 1, 2])
    """
    if not isinstance(ndarray, _ndarray):
        raise TypeError(
            f"from_numpy() expects a numpy.ndarray, got {type(ndarray).__name__}; use "
            f"mpitensor.tensor() for other data"
        )
    _dt.to_dtype(ndarray.dtype)
    if type(ndarray) is not _ndarray:
        ndarray = ndarray.view(_ndarray)
    return _new(ndarray)


def _filled(name: str, size: tuple, fname: str, dtype: Any, device: Any, rg: bool) -> Tensor:
    shape = _size_from(size, fname)
    dt = _dtype_or(dtype, _dt.get_default_dtype())
    return _finish(_create(_parse_device(device), name, shape, dtype=dt), rg)


def zeros(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Make a tensor of zeros.

    Args:
        size: ints or one tuple/list, e.g. ``zeros(2, 3)`` or ``zeros((2, 3))``.
        dtype: element type (default float32, see :func:`get_default_dtype`).
        device: ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or a :class:`device`.
        requires_grad: mark the result for autograd.

    Raises:
        TypeError: sizes are not ints.
        ValueError: a size is negative.

    Example:
        >>> zeros(2, 3).shape
        mpitensor.Size([2, 3])
    """
    return _filled("zeros", size, "zeros", dtype, device, requires_grad)


def ones(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Make a tensor of ones (arguments as in :func:`zeros`).

    Example:
        >>> import mpitensor as mt
        >>> mt.ones(2, dtype=mt.int64)
        tensor([1, 1])
    """
    return _filled("ones", size, "ones", dtype, device, requires_grad)


def empty(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Make an uninitialized tensor (arguments as in :func:`zeros`).

    Example:
        >>> empty(4).numel()
        4
    """
    return _filled("empty", size, "empty", dtype, device, requires_grad)


def full(
    size: Any,
    fill_value: Any,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a tensor filled with ``fill_value``; the dtype follows the value as in torch.

    Args:
        size: an int or a tuple/list of ints.
        fill_value: a number or a one-element tensor (bool -> bool, int -> int64,
            float -> default dtype, complex -> default complex).
        dtype, device, requires_grad: as in :func:`zeros`.

    Example:
        >>> full((2,), 7)
        tensor([7, 7])
    """
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    elif isinstance(fill_value, np.generic):
        fill_value = fill_value.item()
    if not _is_scalar(fill_value):
        raise TypeError(f"full(): fill_value must be a number, got {fill_value!r}")
    shape = _size_from(size if isinstance(size, (tuple, list)) else (size,), "full")
    dt = _dtype_or(dtype, _scalar_dtype(fill_value))
    return _finish(_create(_parse_device(device), "full", shape, fill_value, dtype=dt),
                   requires_grad)


def _like_args(t: Any, dtype: Any, device: Any) -> tuple:
    x = t._data if isinstance(t, Tensor) else t
    if not (isinstance(x, _ndarray) or _backend.is_cupy_array(x)):
        raise TypeError(f"expected a Tensor or an array, got {type(t).__name__}")
    dt = x.dtype if dtype is None else _dt.to_dtype(dtype)
    dev = _backend.device_of(x) if device is None else _parse_device(device)
    return x.shape, dt, dev


def zeros_like(
    input: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,  # noqa: A002
    requires_grad: bool = False,
) -> Tensor:
    """Make zeros with the shape (and by default dtype and device) of ``input``.

    Example:
        >>> zeros_like(tensor([1, 2]))
        tensor([0, 0])
    """
    shape, dt, dev = _like_args(input, dtype, device)
    return _finish(_create(dev, "zeros", shape, dtype=dt), requires_grad)


def ones_like(
    input: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,  # noqa: A002
    requires_grad: bool = False,
) -> Tensor:
    """Make ones with the shape (and by default dtype and device) of ``input``.

    Example:
        >>> ones_like(zeros(2))
        tensor([1., 1.])
    """
    shape, dt, dev = _like_args(input, dtype, device)
    return _finish(_create(dev, "ones", shape, dtype=dt), requires_grad)


def empty_like(
    input: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,  # noqa: A002
    requires_grad: bool = False,
) -> Tensor:
    """Make an uninitialized tensor with the shape (dtype, device) of ``input``.

    Example:
        >>> empty_like(zeros(2, 3)).shape
        mpitensor.Size([2, 3])
    """
    shape, dt, dev = _like_args(input, dtype, device)
    return _finish(_create(dev, "empty", shape, dtype=dt), requires_grad)


def full_like(
    input: Any, fill_value: Any, *, dtype: DTypeLike = None,  # noqa: A002
    device: DeviceLike = None, requires_grad: bool = False,
) -> Tensor:
    """Make a tensor like ``input`` filled with ``fill_value`` (keeping ``input``'s dtype).

    Example:
        >>> full_like(zeros(2), 3)
        tensor([3., 3.])
    """
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    shape, dt, dev = _like_args(input, dtype, device)
    return _finish(_create(dev, "full", shape, fill_value, dtype=dt), requires_grad)


def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make ``[start, start + step, ...]`` up to (not including) ``end``, like ``torch.arange``.

    All-integer arguments give int64; any float gives the default dtype (float32). Values are
    computed as ``start + i * step`` in double precision.

    Args:
        start: first value (or ``end`` when it is the only argument).
        end: bound, excluded.
        step: increment, non-zero, with the sign of ``end - start``.
        dtype, device, requires_grad: as in :func:`zeros`.

    Raises:
        ValueError: ``step`` is zero or points away from ``end``.

    Example:
        >>> arange(5)
        tensor([0, 1, 2, 3, 4])
        >>> arange(0, 1, 0.25)
        tensor([0.0000, 0.2500, 0.5000, 0.7500])
    """
    if end is None:
        start, end = 0, start
    vals = []
    for v in (start, end, step):
        if isinstance(v, (Tensor, np.generic)):
            v = v.item()
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise TypeError(f"arange() takes real numbers, got {v!r}")
        vals.append(v)
    start, end, step = vals
    if step == 0:
        raise ValueError("arange(): step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise ValueError(
            f"arange(): upper bound and lower bound inconsistent with step sign "
            f"(start={start}, end={end}, step={step})"
        )
    all_int = all(isinstance(v, int) for v in vals)
    dt = _dtype_or(dtype, _INT64 if all_int else _dt.get_default_dtype())
    dev = _parse_device(device)
    if all_int:
        n = max(0, -((start - end) // step))
    else:
        n = max(0, math.ceil((end - start) / step))
    if all_int and dt.kind in "iu":
        arr = np.arange(start, start + n * step, step, dtype=dt)[:n]
    else:
        arr = (start + np.arange(n, dtype=np.float64) * step).astype(dt)
    return _finish(_move(arr, dev), requires_grad)


def linspace(
    start: Any,
    end: Any,
    steps: int,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make ``steps`` evenly spaced values from ``start`` to ``end`` inclusive.

    Raises:
        ValueError: ``steps`` is negative.

    Example:
        >>> linspace(0, 1, 3)
        tensor([0.0000, 0.5000, 1.0000])
    """
    steps = operator.index(steps)
    if steps < 0:
        raise ValueError(f"linspace(): number of steps must be non-negative, got {steps}")
    start = start.item() if isinstance(start, Tensor) else start
    end = end.item() if isinstance(end, Tensor) else end
    default = _dt.default_complex_dtype() if isinstance(start + end, complex) else None
    dt = _dtype_or(dtype, default or _dt.get_default_dtype())
    arr = np.linspace(start, end, steps, dtype=np.complex128 if dt.kind == "c" else np.float64)
    return _finish(_move(arr.astype(dt), _parse_device(device)), requires_grad)


def eye(
    n: int,
    m: Optional[int] = None,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make an ``n x m`` identity matrix (``m`` defaults to ``n``).

    Example:
        >>> eye(2)
        tensor([[1., 0.],
                [0., 1.]])
    """
    n = operator.index(n)
    m = n if m is None else operator.index(m)
    if n < 0 or m < 0:
        raise ValueError(f"eye(): n and m must be >= 0, got n={n}, m={m}")
    dt = _dtype_or(dtype, _dt.get_default_dtype())
    return _finish(_create(_parse_device(device), "eye", n, m, dtype=dt), requires_grad)


# --------------------------------------------------------------------------------------------
# Random numbers


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    seed = int(seed)
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed must fit in 64 bits ([-2**63, 2**64)), got {seed}")
    return seed & 0xFFFF_FFFF_FFFF_FFFF


class Generator:
    """A seeded source of random numbers for :func:`rand`, :func:`randn`, :func:`randperm`, ...

    CPU numbers come from a NumPy PCG64 generator; CUDA numbers from a CuPy generator seeded
    with the same seed (created on first use, so CuPy is not imported before it is needed).

    Example:
        >>> g = Generator().manual_seed(0)
        >>> bool((rand(3, generator=g) == rand(3, generator=Generator().manual_seed(0))).all())
        True
    """

    __slots__ = ("device", "_seed", "_rng", "_cuda")

    def __init__(self, device: DeviceLike = "cpu") -> None:
        self.device = _parse_device(device) or _backend.CPU
        self._cuda: dict = {}
        self._reseed(_fresh_seed())

    def _reseed(self, seed: int) -> None:
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._cuda = {}

    def manual_seed(self, seed: int) -> Generator:
        """Seed the generator (any 64-bit int) and return it.

        Raises:
            TypeError: ``seed`` is not an int.
        """
        self._reseed(_check_seed(seed))
        return self

    def seed(self) -> int:
        """Seed from OS entropy and return the seed used."""
        s = _fresh_seed()
        self._reseed(s)
        return s

    def initial_seed(self) -> int:
        """Return the seed last set."""
        return self._seed

    def get_state(self) -> dict:
        """Return the CPU state (a picklable dict) for :meth:`set_state`."""
        return {"seed": self._seed, "bit_generator": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> Generator:
        """Restore a state from :meth:`get_state` and return self.

        Raises:
            TypeError: ``state`` is not such a dict.
        """
        if not isinstance(state, dict) or "bit_generator" not in state:
            raise TypeError("set_state() takes a dict returned by Generator.get_state()")
        self._reseed(int(state.get("seed", self._seed)))
        self._rng.bit_generator.state = state["bit_generator"]
        return self

    def _cupy_state(self, dev: _backend.device) -> Any:
        cp = _backend.get_cupy()
        idx = _cuda_index(dev)
        rs = self._cuda.get(idx)
        if rs is None:
            with cp.cuda.Device(idx):
                rs = cp.random.RandomState(self._seed)
            self._cuda[idx] = rs
        return rs

    def __repr__(self) -> str:
        return f"<mpitensor.Generator device='{self.device}' initial_seed={self._seed}>"


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator (CPU, and CUDA through CuPy), like ``torch.manual_seed``.

    Args:
        seed: any int that fits in 64 bits.

    Returns:
        The default :class:`Generator`.

    Raises:
        TypeError: ``seed`` is not an int.

    Example:
        >>> _ = manual_seed(0); a = rand(2); _ = manual_seed(0); bool((a == rand(2)).all())
        True
    """
    seed = _check_seed(seed)
    default_generator._reseed(seed)
    cp = sys.modules.get("cupy")  # seed CuPy's own global generator only if it is loaded
    if cp is not None:
        with contextlib.suppress(Exception):  # CuPy present but no usable device
            cp.random.seed(seed)
    return default_generator


def seed() -> int:
    """Seed the default generator from OS entropy and return the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    """Return the default generator's seed."""
    return default_generator.initial_seed()


def get_rng_state() -> dict:
    """Return the default generator's CPU state (see :meth:`Generator.get_state`)."""
    return default_generator.get_state()


def set_rng_state(new_state: dict) -> None:
    """Restore the default generator's CPU state from :func:`get_rng_state`."""
    default_generator.set_state(new_state)


def _gen(generator: Any) -> Any:
    if generator is None:
        return default_generator
    if isinstance(generator, (Generator, np.random.Generator)):
        return generator
    raise TypeError(
        f"generator must be a mpitensor.Generator or a numpy.random.Generator, got {generator!r}"
    )


def _random(kind: str, shape: tuple, generator: Any, dt: np.dtype, device: Any) -> Any:
    """Draw on the generator's side: CuPy for CUDA devices with a mpitensor generator."""
    dev = _parse_device(device)
    gen = _gen(generator)
    if not _is_cpu(dev) and isinstance(gen, Generator):
        rs = gen._cupy_state(dev)
        with _backend.get_cupy().cuda.Device(_cuda_index(dev)):
            return _draw_cupy(rs, kind, shape, dt)
    rng = gen._rng if isinstance(gen, Generator) else gen
    return _move(_draw_numpy(rng, kind, shape, dt), dev)


def _draw_numpy(rng: np.random.Generator, kind: str, shape: tuple, dt: np.dtype) -> np.ndarray:
    if kind == "rand":
        fdt = dt if dt in (_dt.float32, _dt.float64) else _dt.float32
        return rng.random(shape, dtype=fdt).astype(dt, copy=False)
    if dt.kind == "c":  # torch: real and imaginary parts each N(0, 1/2)
        fdt = _dt.float64 if dt == _dt.complex128 else _dt.float32
        re = rng.standard_normal(shape, dtype=fdt)
        im = rng.standard_normal(shape, dtype=fdt)
        return ((re + 1j * im) * np.sqrt(0.5)).astype(dt)
    fdt = dt if dt in (_dt.float32, _dt.float64) else _dt.float32
    return rng.standard_normal(shape, dtype=fdt).astype(dt, copy=False)


def _draw_cupy(rs: Any, kind: str, shape: tuple, dt: np.dtype) -> Any:
    if kind == "rand":
        fdt = dt if dt in (_dt.float32, _dt.float64) else _dt.float32
        return rs.random_sample(size=shape, dtype=fdt).astype(dt, copy=False)
    if dt.kind == "c":
        fdt = _dt.float64 if dt == _dt.complex128 else _dt.float32
        re = rs.standard_normal(size=shape, dtype=fdt)
        im = rs.standard_normal(size=shape, dtype=fdt)
        return ((re + 1j * im) * math.sqrt(0.5)).astype(dt)
    fdt = dt if dt in (_dt.float32, _dt.float64) else _dt.float32
    return rs.standard_normal(size=shape, dtype=fdt).astype(dt, copy=False)


def _float_dtype(dtype: Any, fname: str, allow_complex: bool) -> np.dtype:
    dt = _dtype_or(dtype, _dt.get_default_dtype())
    if dt.kind != "f" and not (allow_complex and dt.kind == "c"):
        raise TypeError(
            f"{fname}() needs a floating point dtype{' or complex' if allow_complex else ''}, "
            f"got {_dt.dt_repr(dt)}"
        )
    return dt


def rand(
    *size: Any,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a tensor of uniform random numbers in ``[0, 1)``.

    Args:
        size: ints or one tuple/list.
        generator: a :class:`Generator` or ``numpy.random.Generator`` (default: the global one,
            seeded by :func:`manual_seed`).
        dtype: a float dtype (default float32).
        device, requires_grad: as in :func:`zeros`.

    Raises:
        TypeError: a non-float dtype.

    Example:
        >>> _ = manual_seed(0); float(rand(1)) < 1.0
        True
    """
    shape = _size_from(size, "rand")
    dt = _float_dtype(dtype, "rand", allow_complex=False)
    return _finish(_random("rand", shape, generator, dt, device), requires_grad)


def randn(
    *size: Any,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a tensor of standard normal random numbers (arguments as in :func:`rand`).

    Complex dtypes get real and imaginary parts each with variance 1/2, as in torch.

    Example:
        >>> randn(2, 3).shape
        mpitensor.Size([2, 3])
    """
    shape = _size_from(size, "randn")
    dt = _float_dtype(dtype, "randn", allow_complex=True)
    return _finish(_random("randn", shape, generator, dt, device), requires_grad)


def randint(
    low: int,
    high: Any = None,
    size: Any = None,
    *,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make random integers in ``[low, high)``: ``randint(high, size)`` or ``(low, high, size)``.

    Raises:
        ValueError: ``high <= low``.

    Example:
        >>> randint(0, 10, (3,)).dtype
        dtype('int64')
    """
    if size is None:
        low, high, size = 0, low, high
    if size is None:
        raise TypeError("randint() needs a size, e.g. randint(10, (3,))")
    low, high = operator.index(low), operator.index(high)
    if high <= low:
        raise ValueError(f"randint(): expected low < high, got low={low}, high={high}")
    shape = _size_from(size if isinstance(size, (tuple, list)) else (size,), "randint")
    dt = _dtype_or(dtype, _INT64)
    dev = _parse_device(device)
    gen = _gen(generator)
    if not _is_cpu(dev) and isinstance(gen, Generator):
        rs = gen._cupy_state(dev)
        with _backend.get_cupy().cuda.Device(_cuda_index(dev)):
            arr = rs.randint(low, high, size=shape, dtype=np.int64).astype(dt, copy=False)
    else:
        rng = gen._rng if isinstance(gen, Generator) else gen
        arr = _move(rng.integers(low, high, size=shape, dtype=np.int64).astype(dt, copy=False),
                    dev)
    return _finish(arr, requires_grad)


def randperm(
    n: int,
    *,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a random permutation of ``0 .. n-1`` (int64 by default).

    Raises:
        ValueError: ``n`` is negative.

    Example:
        >>> sorted(randperm(4).tolist())
        [0, 1, 2, 3]
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"randperm(): n must be non-negative, got {n}")
    dt = _dtype_or(dtype, _INT64)
    dev = _parse_device(device)
    gen = _gen(generator)
    if not _is_cpu(dev) and isinstance(gen, Generator):
        rs = gen._cupy_state(dev)
        with _backend.get_cupy().cuda.Device(_cuda_index(dev)):
            arr = rs.permutation(n).astype(dt)
    else:
        rng = gen._rng if isinstance(gen, Generator) else gen
        arr = _move(rng.permutation(n).astype(dt), dev)
    return _finish(arr, requires_grad)


def rand_like(
    input: Any, *, generator: Any = None, dtype: DTypeLike = None,  # noqa: A002
    device: DeviceLike = None, requires_grad: bool = False,
) -> Tensor:
    """Make uniform random numbers with the shape (dtype, device) of ``input``.

    Raises:
        TypeError: the dtype is not floating point.

    Example:
        >>> rand_like(zeros(2, 2)).shape
        mpitensor.Size([2, 2])
    """
    shape, dt, dev = _like_args(input, dtype, device)
    if dt.kind != "f":
        raise TypeError(f"rand_like() needs a floating point dtype, got {_dt.dt_repr(dt)}")
    return _finish(_random("rand", shape, generator, dt, dev), requires_grad)


def randn_like(
    input: Any, *, generator: Any = None, dtype: DTypeLike = None,  # noqa: A002
    device: DeviceLike = None, requires_grad: bool = False,
) -> Tensor:
    """Make standard normal numbers with the shape (dtype, device) of ``input``.

    Raises:
        TypeError: the dtype is neither floating point nor complex.

    Example:
        >>> randn_like(zeros(3)).dtype
        dtype('float32')
    """
    shape, dt, dev = _like_args(input, dtype, device)
    if dt.kind not in "fc":
        raise TypeError(f"randn_like() needs a floating point dtype, got {_dt.dt_repr(dt)}")
    return _finish(_random("randn", shape, generator, dt, dev), requires_grad)


# --------------------------------------------------------------------------------------------
# Functions on several tensors


def _arrays_of(tensors: Any, fname: str) -> list:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fname}() takes a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{fname}() expected a non-empty list of Tensors")
    arrays = []
    for i, t in enumerate(tensors):
        if isinstance(t, Tensor):
            arrays.append(t._data)
        elif isinstance(t, _ndarray) or _backend.is_cupy_array(t):
            arrays.append(t)
        else:
            raise TypeError(f"{fname}(): element {i} is a {type(t).__name__}, not a Tensor")
    on_gpu = {_is_cupy(a) for a in arrays}
    if len(on_gpu) > 1:
        raise RuntimeError(
            f"{fname}(): expected all tensors to be on the same device; move them with "
            f".to(device) first"
        )
    rt = arrays[0].dtype
    for a in arrays[1:]:
        rt = _promote(rt, a.dtype)
    return [a.astype(rt, copy=False) for a in arrays]


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate tensors along an existing dimension, promoting dtypes as torch does.

    Args:
        tensors: a non-empty list or tuple of tensors with equal shapes except along ``dim``.
        dim: the dimension to join along.

    Raises:
        ValueError: empty list or mismatched shapes.
        TypeError: not a list of tensors.

    Example:
        >>> cat([tensor([1, 2]), tensor([3])])
        tensor([1, 2, 3])
    """
    arrays = _arrays_of(tensors, "cat")
    nd = arrays[0].ndim
    if nd == 0:
        raise ValueError("cat(): zero-dimensional tensors cannot be concatenated; use stack()")
    d = _wrap_dim(dim, nd)
    try:
        r = _xp(arrays[0]).concatenate(arrays, axis=d)
    except ValueError as exc:
        shapes = [list(a.shape) for a in arrays]
        raise ValueError(f"cat(): shapes {shapes} do not match outside dim {d}: {exc}") from None
    if _grad_mode.enabled and any(getattr(t, "_requires_grad", False) for t in tensors):
        return _ops.Cat.apply(d, r, *tensors)
    return _new(r)


concat = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Stack same-shaped tensors along a new dimension ``dim``.

    Raises:
        ValueError: empty list or shapes differ.

    Example:
        >>> stack([tensor([1, 2]), tensor([3, 4])]).shape
        mpitensor.Size([2, 2])
    """
    arrays = _arrays_of(tensors, "stack")
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(
            f"stack expects each tensor to be equal size, got {[list(a.shape) for a in arrays]}"
        )
    d = _wrap_dim(dim, arrays[0].ndim + 1)
    r = _xp(arrays[0]).stack(arrays, axis=d)
    if _grad_mode.enabled and any(getattr(t, "_requires_grad", False) for t in tensors):
        return _ops.Stack.apply(d, r, *tensors)
    return _new(r)


def where(condition: Any, input: Any = None, other: Any = None) -> Any:  # noqa: A002
    """Pick ``input`` where ``condition`` is true and ``other`` elsewhere (broadcasting).

    With only ``condition``, return the tuple of index tensors of its true elements.

    Args:
        condition: a bool tensor (or array).
        input, other: tensors or numbers; their dtypes promote as in torch.

    Raises:
        TypeError: only one of ``input``/``other`` is given.

    Example:
        >>> where(tensor([True, False]), tensor([1., 2.]), 0.)
        tensor([1., 0.])
    """
    c = condition._data if isinstance(condition, Tensor) else condition
    if not (isinstance(c, _ndarray) or _backend.is_cupy_array(c)):
        c = np.asarray(c)
    if input is None and other is None:
        return _new(c).nonzero(as_tuple=True)
    if input is None or other is None:
        raise TypeError("where() takes either only condition, or condition, input and other")
    x, y = _operand(input), _operand(other)
    if x is _NOPE or y is _NOPE:
        raise TypeError(f"where(): input and other must be tensors or numbers, got "
                        f"{type(input).__name__} and {type(other).__name__}")
    rt = _result_type(x, y)
    gpu = next((a for a in (c, x, y) if not _is_scalar(a) and _is_cupy(a)), None)
    if gpu is not None:  # CPU 0-d values act as scalars next to GPU tensors
        x = x.item() if not _is_scalar(x) and not _is_cupy(x) and x.ndim == 0 else x
        y = y.item() if not _is_scalar(y) and not _is_cupy(y) and y.ndim == 0 else y
        for v in (c, x, y):
            if not _is_scalar(v) and not _is_cupy(v):
                raise RuntimeError(
                    f"where(): expected all tensors to be on the same device, found cpu and "
                    f"{_dev_str(gpu)}; move them with .to(device) first"
                )
    xp = _xp(gpu) if gpu is not None else np
    if c.dtype != _BOOL:
        c = c.astype(_BOOL)
    r = xp.where(c, _cast(x, rt), _cast(y, rt))
    r = r if r.dtype == rt else r.astype(rt)
    if _grad_mode.enabled and (
        getattr(input, "_requires_grad", False) or getattr(other, "_requires_grad", False)
    ):
        a = input if isinstance(input, Tensor) else x
        b = other if isinstance(other, Tensor) else y
        return _ops.Where.apply(c, a, b, r)
    return _new(r)


def allclose(
    input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
    equal_nan: bool = False,
) -> bool:
    """True when ``|input - other| <= atol + rtol * |other|`` for every element (broadcasting).

    Example:
        >>> allclose(tensor([1.0]), tensor([1.0 + 1e-9]))
        True
    """
    x = input._data if isinstance(input, Tensor) else input
    y = _operand(other)
    if y is _NOPE:
        y = np.asarray(other)
    if not isinstance(x, _ndarray) and not _backend.is_cupy_array(x):
        x = np.asarray(x)
    x, y = _same_device(x, y)
    xp = _xp(x) if not _is_scalar(x) else _xp(y)
    return bool(xp.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(input: Any, other: Any) -> bool:  # noqa: A002
    """True when both have the same shape and the same elements.

    Example:
        >>> equal(tensor([1, 2]), tensor([1, 2]))
        True
    """
    x = input._data if isinstance(input, Tensor) else input
    y = other._data if isinstance(other, Tensor) else other
    if not (isinstance(x, _ndarray) or _backend.is_cupy_array(x)):
        x = np.asarray(x)
    if not (isinstance(y, _ndarray) or _backend.is_cupy_array(y)):
        y = np.asarray(y)
    if x.shape != y.shape:
        return False
    x, y = _same_device(x, y)
    return bool((x == y).all())


def is_tensor(obj: Any) -> bool:
    """True when ``obj`` is a :class:`Tensor`."""
    return isinstance(obj, Tensor)


def numel(input: Tensor) -> int:  # noqa: A002
    """Return the number of elements of ``input``."""
    return input.numel()


def is_floating_point(input: Tensor) -> bool:  # noqa: A002
    """True when ``input`` has a float16/32/64 dtype."""
    return input.is_floating_point()


def is_complex(input: Tensor) -> bool:  # noqa: A002
    """True when ``input`` has a complex dtype."""
    return input.is_complex()


# --------------------------------------------------------------------------------------------
# torch-style functions (``mt.exp(x)``, ``mt.flatten(x, 1)``, ``mt.max(x, 1)``): each is the
# method of the same name, so it is differentiable wherever the method is.


def exp(input: Tensor) -> Tensor:  # noqa: A002 - torch's argument name
    """Return ``input.exp()``."""
    return input.exp()


def log(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.log()``."""
    return input.log()


def sqrt(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.sqrt()``."""
    return input.sqrt()


def relu(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.relu()``.

    Example:
        >>> relu(tensor([-1.0, 2.0]))
        tensor([0., 2.])
    """
    return input.relu()


def sigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.sigmoid()``."""
    return input.sigmoid()


def tanh(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.tanh()``."""
    return input.tanh()


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """Return ``input.clamp(min, max)``."""
    return input.clamp(min, max)


clip = clamp


def matmul(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Return ``input @ other``."""
    return input @ other


def mean(input: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
         dtype: DTypeLike = None) -> Tensor:
    """Return ``input.mean(dim, keepdim, dtype=dtype)``."""
    return input.mean(dim, keepdim, dtype=dtype)


def argmax(input: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """Return ``input.argmax(dim, keepdim)``."""
    return input.argmax(dim, keepdim)


def argmin(input: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """Return ``input.argmin(dim, keepdim)``."""
    return input.argmin(dim, keepdim)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:  # noqa: A002
    """Return ``input.flatten(start_dim, end_dim)`` (``torch.flatten(x, 1)`` in LeNet)."""
    return input.flatten(start_dim, end_dim)


def reshape(input: Tensor, shape: Sequence[int]) -> Tensor:  # noqa: A002
    """Return ``input.reshape(shape)``."""
    return input.reshape(shape)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:  # noqa: A002
    """Return ``input.transpose(dim0, dim1)``."""
    return input.transpose(dim0, dim1)


def permute(input: Tensor, dims: Sequence[int]) -> Tensor:  # noqa: A002
    """Return ``input.permute(dims)``."""
    return input.permute(dims)


def squeeze(input: Tensor, dim: Any = None) -> Tensor:  # noqa: A002
    """Return ``input.squeeze(dim)``."""
    return input.squeeze(dim)


def unsqueeze(input: Tensor, dim: int) -> Tensor:  # noqa: A002
    """Return ``input.unsqueeze(dim)``."""
    return input.unsqueeze(dim)


def softmax(input: Tensor, dim: int, dtype: DTypeLike = None) -> Tensor:  # noqa: A002
    """Return ``input.softmax(dim)`` (computed by ``mpitensor.nn.functional``)."""
    return input.softmax(dim, dtype)


def log_softmax(input: Tensor, dim: int, dtype: DTypeLike = None) -> Tensor:  # noqa: A002
    """Return ``input.log_softmax(dim)`` (computed by ``mpitensor.nn.functional``)."""
    return input.log_softmax(dim, dtype)


def _sum(input: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
         dtype: DTypeLike = None) -> Tensor:
    """Return ``input.sum(dim, keepdim, dtype=dtype)`` (``mpitensor.sum``)."""
    return input.sum(dim, keepdim, dtype=dtype)


def _max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A002
    """Return ``input.max(dim, keepdim)`` (``mpitensor.max``): a value, or (values, indices)."""
    return input.max(dim, keepdim)


def _min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A002
    """Return ``input.min(dim, keepdim)`` (``mpitensor.min``)."""
    return input.min(dim, keepdim)


def _abs(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.abs()`` (``mpitensor.abs``)."""
    return input.abs()


_BUILTIN_NAMED = {"sum": _sum, "max": _max, "min": _min, "abs": _abs}
for _f, _name in ((_sum, "sum"), (_max, "max"), (_min, "min"), (_abs, "abs")):
    _f.__name__ = _f.__qualname__ = _name


def __getattr__(name: str) -> Any:
    # mpitensor.sum/max/min/abs: defining them as globals here would shadow the builtins that
    # this module's own code calls, so they are looked up on attribute access only (PEP 562).
    f = _BUILTIN_NAMED.get(name)
    if f is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return f


# Differentiable forms of the operations above (imported last: _ops reads this module).
from mpitensor import _ops  # noqa: E402

_autograd._bind_tensor(Tensor, _new)
