"""Changing a tensor's dtype or device (``to``, ``cpu``, ``cuda``, ``float``, ``type``, ...),
and the gradient of that change.

Every form returns the tensor itself when nothing would change (as torch does, unless a copy is
asked for), and otherwise a new tensor through :class:`ToCopy`, whose gradient is cast back to
the input's dtype and moved back to its device. A cast to an integer or bool dtype is not
recorded: such tensors cannot require grad.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([1.0, 2.0], dtype=mt.float64, requires_grad=True)
    >>> x.float().grad_fn.name()
    'ToCopyBackward'
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import (
    DeviceLike,
    device_or_dtype,
    is_cupy,
    is_on,
    move,
    parse_device,
)
from mpitensor._core.legacy_types import parse_type, type_name
from mpitensor._core.opkit import NO_RECORD, tensor_methods, wrap
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

_ndarray = np.ndarray
_grad_mode = _autograd._mode
_F16, _BF16, _F32, _F64 = _dt.float16, _dt.bfloat16, _dt.float32, _dt.float64

DTypeLike = Any


class ToCopy(Function):
    """``x`` moved to device ``dev`` and/or cast to ``dtype`` (None keeps either), always a
    new array: the gradient goes back to ``x``'s device and dtype."""

    @staticmethod
    def forward(ctx: Any, x: Any, dev: Optional[_backend.device], dtype: Any) -> Any:
        out = x if dev is None else move(x, dev)
        if dtype is not None:
            if dtype == _F16 or dtype == _BF16:  # overflow to inf is silent in torch
                with np.errstate(over="ignore"):
                    if out.dtype == _F64 and dtype == _F16:
                        # torch rounds a double to float first, then to half; match its bits
                        out = out.astype(_F32)
                    out = out.astype(dtype, copy=False)
            else:
                out = out.astype(dtype, copy=False)
        if out is x:  # nothing changed, and the caller asked for a copy all the same
            out = x.copy()
        ToCopy.remember(ctx, x, out)
        return out

    @staticmethod
    def remember(ctx: Any, x: Any, out: Any) -> None:
        """Keep what backward needs: ``x``'s dtype, and its device where ``out`` may be on
        another one."""
        both_host = isinstance(x, _ndarray) and isinstance(out, _ndarray)
        ctx.origin = (x.dtype, None if both_host else _backend.device_of(x))

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        dtype, device = ctx.origin
        if device is not None:
            g = move(g, device)
        if g.dtype.kind == "c" and dtype.kind != "c":
            g = g.real  # a real input made complex: its gradient is the real part
        return (g.astype(dtype) if g.dtype != dtype else g), None, None


def _converted(t: Tensor, dev: Optional[_backend.device], dtype: Optional[np.dtype]) -> Tensor:
    """``t`` on ``dev`` with ``dtype`` (None keeps either), as a new tensor."""
    out_kind = _dt.kind_of(t._data.dtype if dtype is None else dtype)
    if t._requires_grad and _grad_mode.enabled and out_kind in "fc":
        return ToCopy.apply(t, dev, dtype)
    return wrap(ToCopy.forward(NO_RECORD, t._data, dev, dtype))


def _cast(t: Tensor, dt: np.dtype) -> Tensor:
    """``t`` as ``dt``: itself when it already is."""
    return t if t._data.dtype == dt else _converted(t, None, dt)


def to_args(args: tuple, kwargs: dict) -> tuple:
    """``(device, dtype, copy)`` from the many call forms of ``Tensor.to``.

    Raises:
        TypeError: an argument that is neither a device, a dtype, a tensor nor a flag.
    """
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    copy = bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    flags = []  # positional (non_blocking, copy)
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, bool):
            flags.append(a)
        elif a is not None:
            is_device, v = device_or_dtype(a)
            if is_device:
                device = v
                continue
            try:
                dtype = _dt.to_dtype(v)
            except TypeError:
                raise TypeError(f"to() takes a device, a dtype or a tensor, got {a!r}") from None
    if len(flags) >= 2:
        copy = copy or flags[1]
    return device, dtype, copy


@tensor_methods
class _CastingMethods:
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
        device, dtype, copy = to_args(args, kwargs)
        dev = parse_device(device)
        dt = None if dtype is None else _dt.to_dtype(dtype)
        x = self._data
        if not copy and is_on(x, dev) and (dt is None or dt == x.dtype):
            return self
        return _converted(self, dev, dt)

    def cpu(self) -> Tensor:
        """Return the tensor in host memory (self when it already is)."""
        if isinstance(self._data, _ndarray):
            return self
        return _converted(self, _backend.CPU, None)

    def cuda(self, device: DeviceLike = None, non_blocking: bool = False) -> Tensor:
        """Return the tensor on a GPU (the current one by default); self when already there.

        Raises:
            RuntimeError: CuPy is not installed.
        """
        dev = parse_device(device) if device is not None else _backend.device("cuda")
        if dev.type != "cuda":
            raise ValueError(f"cuda() needs a CUDA device, got {dev}")
        if is_on(self._data, dev):
            return self
        return _converted(self, dev, None)

    def type(self, dtype: DTypeLike = None, non_blocking: bool = False) -> Any:
        """Return the type name (``"mpitensor.FloatTensor"``) or, given a dtype, a legacy
        class (``mpitensor.DoubleTensor``) or a name (``"torch.DoubleTensor"``,
        ``"torch.cuda.FloatTensor"``), the tensor in that type (self when it already is).

        Raises:
            ValueError: a name that is no tensor type.
            TypeError: ``dtype`` is none of these.
        """
        x = self._data
        if dtype is None:
            return type_name(x.dtype, is_cupy(x))
        dt, on_gpu = parse_type(dtype)
        if on_gpu is None or on_gpu == is_cupy(x):
            return _cast(self, dt)
        return _converted(self, _backend.device("cuda") if on_gpu else _backend.CPU, dt)

    def type_as(self, other: Tensor) -> Tensor:
        """Return the tensor cast to ``other``'s dtype."""
        return _cast(self, other.dtype)

    # dtype casts named as in torch (in this class body their names do not shadow builtins)
    def half(self) -> Tensor:
        """Return the tensor as float16 (self if it already is)."""
        return _cast(self, _dt.float16)

    def bfloat16(self) -> Tensor:
        """Return the tensor as bfloat16 (self if it already is), rounded to nearest even."""
        return _cast(self, _dt.bfloat16)

    def double(self) -> Tensor:
        """Return the tensor as float64 (self if it already is)."""
        return _cast(self, _dt.float64)

    def short(self) -> Tensor:
        """Return the tensor as int16 (self if it already is)."""
        return _cast(self, _dt.int16)

    def long(self) -> Tensor:
        """Return the tensor as int64 (self if it already is)."""
        return _cast(self, _dt.int64)

    def byte(self) -> Tensor:
        """Return the tensor as uint8 (self if it already is)."""
        return _cast(self, _dt.uint8)

    def char(self) -> Tensor:
        """Return the tensor as int8 (self if it already is)."""
        return _cast(self, _dt.int8)

    def cfloat(self) -> Tensor:
        """Return the tensor as complex64 (self if it already is)."""
        return _cast(self, _dt.complex64)

    def cdouble(self) -> Tensor:
        """Return the tensor as complex128 (self if it already is)."""
        return _cast(self, _dt.complex128)

    def float(self) -> Tensor:
        """Return the tensor as float32 (self if it already is); not a Python float."""
        return _cast(self, _dt.float32)

    def int(self) -> Tensor:
        """Return the tensor as int32 (self if it already is), like torch's ``Tensor.int()``."""
        return _cast(self, _dt.int32)

    def bool(self) -> Tensor:
        """Return the tensor as bool (self if it already is)."""
        return _cast(self, _dt.bool_)
