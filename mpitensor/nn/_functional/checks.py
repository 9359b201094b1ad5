"""Argument checks and small plumbing shared by ``nn.functional``'s ops.

The ops of :mod:`~mpitensor.nn._functional.activations`, :mod:`~mpitensor.nn._functional.losses` and
their siblings are re-exported by :mod:`mpitensor.nn.functional`, so they cannot import it back (the
package keeps its import graph free of cycles); what they share lives here instead.

Example:
    >>> import mpitensor as mt
    >>> as_tensor(mt.ones(2), "input", "gelu").shape
    mpitensor.Size([2])
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from typing import Any, Optional, Union

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._core import half as _half
from mpitensor._core.promotion import promote
from mpitensor._ops.math import run_inplace  # noqa: F401 - the one in-place runner, nn's kit
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

REDUCTIONS = ("mean", "sum", "none")


def arr(x: Any) -> Any:
    """The array behind a Tensor, or the value itself."""
    return x._data if isinstance(x, Tensor) else x


def xp_of(x: Any) -> Any:
    """NumPy or CuPy: the array module of ``x`` (a Tensor or an array)."""
    return _backend.array_module(arr(x))


def as_tensor(x: Any, name: str, fname: str) -> Tensor:
    """``x`` as a Tensor (a NumPy/CuPy array is wrapped, sharing memory).

    Raises:
        TypeError: ``x`` is neither a Tensor nor an array.
    """
    if isinstance(x, Tensor):
        return x
    if _backend.is_array(x):
        return _new(x)
    raise TypeError(
        f"{fname}(): argument '{name}' must be a Tensor or a NumPy/CuPy array, not "
        f"{type(x).__name__}; wrap it with mpitensor.tensor(...)"
    )


def dtype_name(dt: Any) -> str:
    """The dtype as torch names it in messages (``Float``, ``Long``...)."""
    names = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
             "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
             "uint8": "Byte", "bool": "Bool"}
    n = _dt.dtype_name(dt)
    return names.get(n, n)


def check_float(x: Any, name: str, fname: str) -> None:
    """Refuse a non-floating tensor, as torch's kernels do (they have no integer version).

    Raises:
        NotImplementedError: an integer or bool dtype (torch's error type here).
    """
    dt = arr(x).dtype
    if not _dt.is_floating_dtype(dt):
        raise NotImplementedError(
            f"{fname}(): '{name}' of dtype {dtype_name(dt)} is not supported: this operation "
            f"is defined for floating point tensors only; convert it first, e.g. x.float()"
        )


def check_same_device(fname: str, **arrays: Any) -> None:
    """All given tensors on one device (None entries are skipped).

    Raises:
        RuntimeError: two devices.
    """
    vals = [arr(a) for a in arrays.values() if a is not None]
    if all(isinstance(a, (np.ndarray, np.generic, numbers.Number)) for a in vals):
        return
    devs = {n: _backend.device_of(arr(a)) for n, a in arrays.items()
            if a is not None and _backend.is_array(arr(a))}
    if len({str(d) for d in devs.values()}) > 1:
        desc = ", ".join(f"{n} on {d}" for n, d in devs.items())
        raise RuntimeError(f"{fname}(): expected all tensors on the same device, got {desc}; "
                           f"move them with .to(device)")


def shape_str(shape: tuple) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def wrap_dim(dim: Any, ndim: int, fname: str) -> int:
    """``dim`` counted from the front (a 0-d tensor takes dims 0 and -1).

    Raises:
        TypeError: a non-integer dim. IndexError: out of range.
    """
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{fname}(): dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{fname}(): Dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {dim})")
    return int(dim) % n


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def reduction_of(reduction: str, size_average: Any, reduce: Any, fname: str) -> str:
    """torch's deprecated ``size_average``/``reduce`` flags folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction.
    """
    if size_average is not None or reduce is not None:
        sa = True if size_average is None else bool(size_average)
        rd = True if reduce is None else bool(reduce)
        reduction = "none" if not rd else ("mean" if sa else "sum")
        warnings.warn(f"size_average and reduce args will be deprecated, please use "
                      f"reduction='{reduction}' instead.", UserWarning, stacklevel=3)
    if reduction not in REDUCTIONS:
        raise ValueError(f"{fname}(): {reduction!r} is not a valid value for reduction; use one "
                         f"of 'mean', 'sum' or 'none'")
    return reduction


def quiet(xp: Any) -> Any:
    """Silence NumPy's floating point warnings: torch computes inf and nan silently."""
    return np.errstate(all="ignore") if xp is np else contextlib.nullcontext()


def reduce_loss(loss: Any, reduction: str) -> Any:
    """Apply ``reduction`` to an array of elementwise losses (a 0-d array for mean/sum)."""
    if reduction == "none":
        return loss
    xp = xp_of(loss)
    with quiet(xp):
        total = loss.sum()
        if reduction == "mean":
            total = total / loss.size if loss.size else total * xp.nan
    return xp.asarray(total, dtype=loss.dtype)


def loss_grad(g: Any, reduction: str, shape: tuple) -> Any:
    """The output gradient of a reduced elementwise loss, broadcastable to ``shape``."""
    if reduction == "mean":
        return g / max(math.prod(shape), 1)
    return g


def reduce_tensor(loss: Tensor, reduction: str) -> Tensor:
    """:func:`reduce_loss` for a Tensor built from differentiable ops."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.mean()


def warn_broadcast(fname: str, x: Any, y: Any) -> tuple:
    """The broadcast shape of input and target, with torch's warning when they differ.

    Raises:
        RuntimeError: shapes that do not broadcast.
    """
    xs, ys = tuple(arr(x).shape), tuple(arr(y).shape)
    if xs == ys:
        return xs
    try:
        shape = np.broadcast_shapes(xs, ys)
    except ValueError:
        raise RuntimeError(f"{fname}(): The size of tensor a ({shape_str(xs)}) must match the "
                           f"size of tensor b ({shape_str(ys)})") from None
    warnings.warn(
        f"Using a target size ({shape_str(ys)}) that is different to the input size "
        f"({shape_str(xs)}). This will likely lead to incorrect results due to broadcasting. "
        f"Please ensure they have the same size.", UserWarning, stacklevel=3)
    return tuple(shape)


def float_result(*xs: Any) -> np.dtype:
    """The promoted dtype of the arrays, the default float dtype if that is not floating."""
    dts = [arr(x).dtype for x in xs if x is not None and hasattr(arr(x), "dtype")]
    dt = _promote(*dts)
    return dt if _dt.is_floating_dtype(dt) else _dt.get_default_dtype()


def _promote(*dts: Any) -> np.dtype:
    out = dts[0]
    for d in dts[1:]:
        out = promote(out, d) if out != d else out
    return np.dtype(out)


def sum_to(g: Any, shape: tuple) -> Any:
    """``g`` summed down to ``shape`` (the adjoint of broadcasting)."""
    from mpitensor.autograd import _sum_to  # noqa: PLC0415 - same layer, named privately

    return _sum_to(g, tuple(shape))


class PassClamped(Function):
    """``max(v, low)`` whose gradient passes as if unclamped (torch's ``clamp_`` under
    ``no_grad`` on a clone, which some composite ops use to keep a divisor away from 0)."""

    @staticmethod
    def forward(ctx: Any, v: Any, low: float) -> Any:
        return xp_of(v).maximum(v, v.dtype.type(low))

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return g, None


def half_safe(cls: type) -> type:
    """:func:`mpitensor._core.half.computes_in_float32`, under the name the op files use."""
    return _half.computes_in_float32(cls)



def scatter_add_flat(xp: Any, size: int, positions: Any, values: Any) -> Any:
    """A flat array of ``size`` zeros with ``values[i]`` added at ``positions[i]`` (repeats
    summed), in ``values``' dtype. On the CPU it is one ``bincount`` (a single pass, several
    times faster than ``numpy.add.at``), summed in float64 and rounded once."""
    positions = positions.reshape(-1)
    values = values.reshape(-1)
    if xp is np:
        out = np.bincount(positions, weights=values.astype(np.float64, copy=False),
                          minlength=size)
        return out.astype(values.dtype, copy=False)
    out = xp.zeros(size, dtype=values.dtype)
    if _determinism.add_at(out, positions, values):  # atomics unless deterministic
        return out
    import cupyx  # noqa: PLC0415 - only on GPUs

    cupyx.scatter_add(out, positions, values)
    return out


def scatter_add_axis(g: Any, axis: int, idx: Any, n: int) -> Any:
    """The adjoint of ``take(x, idx, axis)`` for an ``x`` of size ``n`` along ``axis``:
    ``g`` summed back onto the positions ``idx`` names."""
    xp = xp_of(g)
    moved = xp.moveaxis(g, axis, -1)
    lead = moved.shape[:-1]
    rows = int(np.prod(lead)) if lead else 1
    pos = (xp.arange(rows, dtype=np.int64)[:, None] * n + idx.astype(np.int64)[None, :])
    pos = xp.broadcast_to(pos, (rows, idx.shape[0]))
    flat = scatter_add_flat(xp, rows * n, pos, xp.ascontiguousarray(moved).reshape(rows, -1))
    return xp.moveaxis(flat.reshape(*lead, n), -1, axis)


def real_number(v: Any, name: str, fname: str) -> float:
    """A real number argument as a float (a one-element tensor counts); TypeError otherwise."""
    if isinstance(v, Tensor) and v.numel() == 1:
        v = v.item()
    if not is_number(v):
        raise TypeError(f"{fname}(): {name} must be a real number, got {v!r}")
    return float(v)

# --------------------------------------------------------------------------------------------
# the checks nn.functional's own ops (functional.py and its split-off modules) share


_IntOrPair = Union[int, tuple, list]


def _arr(x: Any) -> Any:
    """The array behind a Tensor, or the array itself."""
    return x._data if isinstance(x, Tensor) else x


def _as_input(x: Any, name: str, fname: str) -> Any:
    """Accept a Tensor or a NumPy/CuPy array; reject anything else with a clear message."""
    if isinstance(x, Tensor) or _backend.is_array(x):
        return x
    raise TypeError(
        f"{fname}(): argument '{name}' must be a Tensor or a NumPy/CuPy array, not "
        f"{type(x).__name__}; wrap it with mpitensor.tensor(...)"
    )


def _dtype_name(dt: Any) -> str:
    return np.dtype(dt).name


def _check_float(x: Any, name: str, fname: str) -> None:
    if not _dt.is_floating_dtype(_arr(x).dtype):
        raise RuntimeError(
            f"{fname}(): '{name}' must have a floating point dtype, got "
            f"{_dtype_name(_arr(x).dtype)}; convert it first, e.g. x.float()"
        )


def _half_with_float_params(input: Any, *params: Any) -> bool:  # noqa: A002
    """A half-precision input with float32 parameters: torch's CPU norms accept the mix (as
    autocast makes it: a bfloat16 activation, float32 weights), compute in float32 and
    return the input's dtype."""
    given = [p for p in params if p is not None]
    return (isinstance(input, Tensor) and input.dtype in _half.REDUCED and bool(given)
            and all(_arr(p).dtype == _dt.float32 for p in given))


def _check_same_dtype(fname: str, **arrays: Any) -> None:
    items = [(n, _arr(a).dtype) for n, a in arrays.items() if a is not None]
    first_name, first = items[0]
    for n, dt in items[1:]:
        if dt != first:
            raise RuntimeError(
                f"{fname}(): {first_name} type ({_dtype_name(first)}) and {n} type "
                f"({_dtype_name(dt)}) should be the same; cast one of them, e.g. with .float()"
            )


def _check_same_device(fname: str, **arrays: Any) -> None:
    if all(a is None or isinstance(_arr(a), np.ndarray) for a in arrays.values()):
        return  # all on the CPU: the common case, checked without building device objects
    devs = {n: _backend.device_of(_arr(a)) for n, a in arrays.items() if a is not None}
    if len({str(d) for d in devs.values()}) > 1:
        desc = ", ".join(f"{n} on {d}" for n, d in devs.items())
        raise RuntimeError(
            f"{fname}(): expected all tensors on the same device, got {desc}; move them with "
            f".to(device)"
        )


def _pair(v: Any, name: str, fname: str, minimum: int) -> tuple:
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            v = (v[0], v[0])
        if len(v) != 2:
            raise ValueError(f"{fname}(): {name} must be an int or a pair of ints, got {v!r}")
        out = tuple(v)
    else:
        out = (v, v)
    for e in out:
        if isinstance(e, bool) or not isinstance(e, numbers.Integral):
            raise TypeError(f"{fname}(): {name} must be an int or a pair of ints, got {v!r}")
        if e < minimum:
            raise ValueError(
                f"{fname}(): {name} must be >= {minimum} in every dimension, got {v!r}"
            )
    return (int(out[0]), int(out[1]))


def pad_misfit(mode: str, lo: int, hi: int, n: int) -> Optional[str]:
    """Why padding ``(lo, hi)`` of a dimension of size ``n`` cannot be taken in ``mode``, or
    None: a reflection must stay inside the dimension, a circular wrap may go round once."""
    if mode == "reflect" and (lo >= n or hi >= n):
        return f"reflect needs padding smaller than the input size, got ({lo}, {hi}) for size {n}"
    if mode == "circular" and (lo > n or hi > n):
        return (f"circular needs padding at most the input size (one wrap), got ({lo}, {hi}) for "
                f"size {n}")
    return None


def _wrap_dim(dim: Any, ndim: int, fname: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{fname}(): dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"{fname}(): Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
            f"but got {dim})"
        )
    return int(dim) % n


def _shape_str(shape: tuple) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _reshape(x: Any, shape: tuple) -> Tensor:
    return (x if isinstance(x, Tensor) else _new(x)).reshape(tuple(shape))
