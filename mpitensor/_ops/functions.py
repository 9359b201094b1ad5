"""torch-style functions of one tensor: ``mpitensor.exp(x)`` is ``x.exp()``,
``mpitensor.flatten(x, 1)`` is ``x.flatten(1)``, ``mpitensor.max(x, 1)`` is ``x.max(1)``.

Each calls the method of the same name, so it is differentiable wherever the method is, and
the op itself lives once, with its method. ``sum``, ``max``, ``min`` and ``abs`` are defined
here under the builtins' names; this module's own code uses none of those builtins.

Example:
    >>> import mpitensor as mt
    >>> mt.relu(mt.tensor([-1.0, 2.0]))
    tensor([0., 2.])
"""

from __future__ import annotations

import builtins as _builtins
import math
from collections.abc import Sequence
from typing import Any, Optional

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor import tensor as _t
from mpitensor._core.devices import xp
from mpitensor._core.opkit import serve, wrap
from mpitensor._core.promotion import can_cast as can_cast_dtype
from mpitensor._core.promotion import is_scalar
from mpitensor.tensor import Tensor

__all__ = [
    "exp", "log", "sqrt", "relu", "sigmoid", "tanh", "clamp", "clip", "matmul", "mean",
    "argmax", "argmin", "flatten", "reshape", "transpose", "permute", "squeeze", "unsqueeze",
    "softmax", "log_softmax", "sum", "max", "min", "abs", "sort", "argsort", "topk",
]

DTypeLike = Any


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
        >>> import mpitensor as mt
        >>> relu(mt.tensor([-1.0, 2.0]))
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
    """Return ``input.softmax(dim, dtype)``."""
    return input.softmax(dim, dtype)


def log_softmax(input: Tensor, dim: int, dtype: DTypeLike = None) -> Tensor:  # noqa: A002
    """Return ``input.log_softmax(dim, dtype)``."""
    return input.log_softmax(dim, dtype)


def sum(input: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
         dtype: DTypeLike = None) -> Tensor:
    """Return ``input.sum(dim, keepdim, dtype=dtype)``."""
    return input.sum(dim, keepdim, dtype=dtype)


def max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A002
    """Return ``input.max(dim, keepdim)``: a value, or (values, indices)."""
    return input.max(dim, keepdim)


def min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A002
    """Return ``input.min(dim, keepdim)``."""
    return input.min(dim, keepdim)


def abs(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.abs()``."""
    return input.abs()


def sort(input: Tensor, dim: int = -1, descending: bool = False, *,  # noqa: A002
         stable: bool = False) -> Any:
    """Return ``input.sort(dim, descending, stable=stable)``: ``(values, indices)``.

    Example:
        >>> import mpitensor as mt
        >>> sort(mt.tensor([2.0, 1.0])).indices
        tensor([1, 0])
    """
    return input.sort(dim, descending, stable=stable)


def argsort(input: Tensor, dim: int = -1, descending: bool = False,  # noqa: A002
            stable: bool = False) -> Tensor:
    """Return ``input.argsort(dim, descending, stable)``: the int64 positions in sorted order."""
    return input.argsort(dim, descending, stable)


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True,  # noqa: A002
         sorted: bool = True) -> Any:  # noqa: A002 - torch's argument name
    """Return ``input.topk(k, dim, largest, sorted)``: ``(values, indices)`` of the ``k``
    largest (or smallest) elements along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> topk(mt.tensor([1.0, 3.0, 2.0]), 1).values
        tensor([3.])
    """
    return input.topk(k, dim, largest, sorted)


# torch functions that are their Tensor method with the tensor first: ``torch.sin(x)`` is
# ``x.sin()``; each also takes ``out=``. The names live in mpitensor.tensor, beside the others
# it serves.
_FORWARDED = _t._FORWARDED_NAMES


def rsub(input: Any, other: Any, *, alpha: Any = 1) -> Any:  # noqa: A002
    """Return ``other - alpha * input``."""
    return other - (input if alpha == 1 else input * alpha)


def std_mean(input: Tensor, dim: Any = None, unbiased: Optional[bool] = None,  # noqa: A002
             keepdim: bool = False, *, correction: Any = None) -> tuple:
    """Return ``(std, mean)`` over ``dim`` (see ``Tensor.var``)."""
    if isinstance(dim, bool):  # std_mean(x, False): the form whose argument is unbiased
        dim, unbiased = None, dim
    return (input.std(dim, unbiased, keepdim, correction=correction),
            input.mean(dim, keepdim))


def var_mean(input: Tensor, dim: Any = None, unbiased: Optional[bool] = None,  # noqa: A002
             keepdim: bool = False, *, correction: Any = None) -> tuple:
    """Return ``(var, mean)`` over ``dim`` (see ``Tensor.var``)."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    return (input.var(dim, unbiased, keepdim, correction=correction),
            input.mean(dim, keepdim))


# math's constants under torch's names
pi = math.pi
e = math.e
inf = math.inf
nan = math.nan
newaxis = None


def result_type(tensor1: Any, tensor2: Any) -> Any:
    """Return the dtype of an arithmetic op on the two (tensors or numbers), as torch."""
    from mpitensor._core.promotion import result_type as _rt  # noqa: PLC0415 - light

    def operand(v: Any) -> Any:
        return v._data if isinstance(v, Tensor) else v

    return _rt(operand(tensor1), operand(tensor2))


def promote_types(type1: Any, type2: Any) -> Any:
    """Return the smallest dtype both dtypes convert to without losing their category."""
    from mpitensor._core.promotion import promote  # noqa: PLC0415 - light

    return promote(_dt.to_dtype(type1), _dt.to_dtype(type2))


def can_cast(from_: Any, to: Any) -> bool:
    """Whether torch's casting rules allow ``from_`` into ``to`` (no float into an integer,
    no complex into a real, nothing into bool but bool)."""
    return can_cast_dtype(_dt.to_dtype(from_), _dt.to_dtype(to))


def empty_strided(size: Any, stride: Any, *, dtype: Any = None, device: Any = None,
                  requires_grad: bool = False, **kwargs: Any) -> Tensor:
    """Make an uninitialized tensor of ``size`` (its strides are NumPy's C order)."""
    from mpitensor._ops.create import empty  # noqa: PLC0415 - imported by now

    return empty(tuple(size), dtype=dtype, device=device, requires_grad=requires_grad)


def scalar_tensor(s: Any, *, dtype: Any = None, device: Any = None,
                  requires_grad: bool = False) -> Tensor:
    """Make a 0-d tensor of the number ``s`` (of the default float dtype unless given)."""
    from mpitensor._ops.create import tensor  # noqa: PLC0415 - imported by now

    return tensor(s, dtype=_dt.get_default_dtype() if dtype is None else dtype,
                  device=device, requires_grad=requires_grad)


def logspace(start: Any, end: Any, steps: int, base: float = 10.0, *, dtype: Any = None,
             device: Any = None, requires_grad: bool = False) -> Tensor:
    """Make ``steps`` values ``base ** linspace(start, end, steps)``."""
    from mpitensor._ops.create import finish, linspace  # noqa: PLC0415 - imported by now

    exps = linspace(start, end, steps, dtype=_dt.float64, device=device)._data
    dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
    return finish((base ** exps).astype(dt), requires_grad)


def asarray(obj: Any, *, dtype: Any = None, device: Any = None, copy: Optional[bool] = None,
            requires_grad: bool = False) -> Tensor:
    """Make a tensor of ``obj``, sharing its memory where possible (``copy=True``: never)."""
    from mpitensor._ops.create import as_tensor  # noqa: PLC0415 - imported by now

    t = as_tensor(obj, dtype=dtype, device=device)
    if copy:
        t = t.detach().clone()
    if requires_grad:
        t.requires_grad_(True)
    return t


def write_out(out: Any, result: Any, name: str) -> Any:
    """Copy ``result`` into the ``out=`` tensor(s) of a torch function, resized (new storage)
    where its shape differs, as torch resizes; returns ``out``.

    Raises:
        TypeError: ``out`` is not a tensor (a tuple of them for tuple results), or cannot
            hold the result's dtype.
        RuntimeError: ``out`` requires grad (``out=`` is not differentiable).
    """
    if isinstance(result, tuple):
        if not isinstance(out, (tuple, list)) or len(out) != len(result):
            raise TypeError(f"{name}(): out must be a tuple of {len(result)} tensors")
        for o, r in zip(out, result):
            write_out(o, r, name)
        return out
    if not isinstance(out, Tensor):
        raise TypeError(f"{name}(): out must be a Tensor, got {type(out).__name__}")
    if out.requires_grad and _autograd.is_grad_enabled():
        raise RuntimeError(f"{name}(): functions with out=... arguments don't support "
                           f"automatic differentiation, but out requires grad")
    r = result._data if isinstance(result, Tensor) else result
    x = out._data
    if hasattr(r, "dtype") and not can_cast_dtype(r.dtype, x.dtype):
        raise TypeError(f"{name}(): the result's dtype {_dt.dt_repr(r.dtype)} can't be cast "
                        f"to out's dtype {_dt.dt_repr(x.dtype)}")
    if tuple(getattr(r, "shape", ())) != tuple(x.shape):
        out._data = xp(x).empty(tuple(getattr(r, "shape", ())), dtype=x.dtype)
    with _autograd.no_grad():
        out.copy_(result if isinstance(result, Tensor) else wrap(xp(x).asarray(r)))
    return out


def _forward_to_method(name: str) -> Any:
    def fn(input: Any, *args: Any, out: Any = None, **kwargs: Any) -> Any:  # noqa: A002
        if not isinstance(input, Tensor):
            if is_scalar(input) and _builtins.any(isinstance(a, Tensor) for a in args):
                from mpitensor._ops.create import tensor  # noqa: PLC0415 - imported by now

                input = tensor(input)  # noqa: A001 - a number first (torch.pow(2, t))
            else:
                raise TypeError(f"{name}(): argument 'input' must be a Tensor, got "
                                f"{type(input).__name__}")
        attr = getattr(input, name)
        r = attr(*args, **kwargs) if callable(attr) else attr  # real/imag are properties
        return r if out is None else write_out(out, r, name)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Return ``input.{name}(*args, **kwargs)`` (see ``Tensor.{name}``); "
                  f"``out=`` receives the result.")
    return fn


for _name in _FORWARDED:
    globals()[_name] = _forward_to_method(_name)

_OWN = ("rsub", "std_mean", "var_mean", "pi", "e", "inf", "nan", "newaxis", "result_type",
        "promote_types", "can_cast", "empty_strided", "scalar_tensor", "logspace", "asarray")

serve({name: globals()[name] for name in (*__all__, *_FORWARDED, *_OWN)})
