"""``nn.Parameter``: the Tensor subclass that marks a value as learnable; ``nn.Buffer``, its
counterpart for module state that is not trained; and the placeholders of the lazy modules,
``UninitializedParameter`` and ``UninitializedBuffer``.

Assigning a Parameter (or a Buffer) as a Module attribute registers it (see
``Module.__setattr__``); a plain Tensor assigned the same way stays an ordinary attribute.
Apart from that registration a Parameter behaves exactly like the Tensor it wraps.

An uninitialized parameter or buffer has a dtype and a device but no shape and no values:
any computation with it raises ValueError, and reading its shape RuntimeError, until
``materialize(shape)`` gives it an (uninitialised) array of that shape and turns it into a
plain Parameter (or Tensor) in place.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor

__all__ = ["Parameter", "Buffer", "UninitializedParameter", "UninitializedBuffer"]


class Parameter(Tensor):
    """A leaf Tensor that requires grad and that ``Module.__setattr__`` registers.

    Args:
        data: a Tensor or array to wrap (shared, not copied); None gives an empty tensor.
        requires_grad: whether the parameter is trained (default True).

    Example:
        >>> import mpitensor as mt
        >>> p = Parameter(mt.zeros(3))
        >>> p.requires_grad, p.is_leaf
        (True, True)
    """

    __slots__ = ()

    def __new__(cls, data: Any = None, requires_grad: bool = True, *rest: Any) -> Any:
        # rest: the placeholders' (device, dtype), which their own __init__ takes
        # a tensor subclass that is more than an array (a DTensor) makes its own parameter
        make = getattr(data, "_make_parameter", None)
        if make is not None:
            return make(requires_grad)
        return super().__new__(cls)

    def __init__(self, data: Any = None, requires_grad: bool = True) -> None:
        if isinstance(data, Tensor):
            # a Parameter starts a new graph: keep the storage, cut the history
            data = data.detach()
        super().__init__(() if data is None else data)
        if requires_grad:
            self.requires_grad = True

    def __repr__(self) -> str:
        # The values print as a plain tensor's would, under a one-line header, which is the
        # layout torch users read and that doctests compare against.
        shown = Tensor._wrap(self._data)
        shown._requires_grad = self._requires_grad
        return f"Parameter containing:\n{shown!r}"

    __str__ = __repr__

    def __reduce_ex__(self, proto: int) -> Any:
        # A pickled Parameter is rebuilt from its values and flag alone: gradients are
        # training-time scratch, and checkpoints of them would only grow files.
        return (type(self), (self._data, self._requires_grad))

    def __deepcopy__(self, memo: dict) -> Parameter:
        # An in-memory copy, unlike a pickle, keeps the gradient: deepcopy(model) mid-step
        # must give a model that an optimizer can step identically.
        twin = type(self)(copy.deepcopy(self._data, memo), self._requires_grad)
        memo[id(self)] = twin
        if self.grad is not None:
            twin.grad = copy.deepcopy(self.grad, memo)
        return twin


class Buffer(Tensor):
    """A marker for a Tensor that ``Module.__setattr__`` registers as a buffer.

    Args:
        data: a Tensor or array (shared, not copied).
        persistent: whether the buffer goes into ``state_dict()``.

    Example:
        >>> import mpitensor as mt, mpitensor.nn as nn
        >>> m = nn.Module()
        >>> m.steps = nn.Buffer(mt.zeros(1), persistent=False)
        >>> list(m.named_buffers()), list(m.state_dict())
        ([('steps', tensor([0.]))], [])
    """

    __slots__ = ("persistent",)

    def __init__(self, data: Any = None, *, persistent: bool = True) -> None:
        super().__init__(() if data is None else data)
        self.persistent = bool(persistent)

    def __repr__(self) -> str:
        # a buffer prints as the tensor it is (the class only marks it for registration)
        shown = Tensor._wrap(self._data)
        shown._requires_grad = self._requires_grad
        return repr(shown)

    __str__ = __repr__


_UNINIT = ("this parameter or buffer of a lazy module is not initialized yet: run the module "
           "once on a sample batch (or load a state dict) before using it")


class _Pending(np.ndarray):
    """The empty stand-in array of an uninitialized tensor: any computation on it fails."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise ValueError(f"{ufunc.__name__}: {_UNINIT}")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise ValueError(f"{func.__name__}: {_UNINIT}")

    def __getitem__(self, key: Any) -> Any:
        raise ValueError(f"indexing: {_UNINIT}")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise ValueError(f"writing: {_UNINIT}")

    def reshape(self, *shape: Any, **kwargs: Any) -> Any:
        raise ValueError(f"reshape: {_UNINIT}")


def _pending(dtype: Any) -> _Pending:
    return np.empty(0, dtype=dtype).view(_Pending)


class _UninitializedMixin:
    """What the uninitialized parameter and buffer share."""

    __slots__ = ()
    cls_to_become: type = Tensor

    @property
    def shape(self) -> Any:
        raise RuntimeError(f"the shape of an uninitialized {type(self).__name__} is unknown; "
                           f"{_UNINIT}")

    def size(self, dim: Optional[int] = None) -> Any:
        return self.shape

    def dim(self) -> int:
        raise RuntimeError(f"the rank of an uninitialized {type(self).__name__} is unknown; "
                           f"{_UNINIT}")

    ndim = property(dim)

    def numel(self) -> int:
        raise ValueError(f"numel: {_UNINIT}")

    def detach(self) -> Any:
        return self  # state_dict() hands the placeholder itself out, as torch does

    @property
    def data(self) -> Tensor:
        """An empty tensor, as torch's: in-place initialisation through ``.data`` before the
        first forward (``lazy.weight.data.normal_(0, 0.01)``) touches no element, and the
        first forward initialises as usual. Calling a function on the placeholder itself
        (``nn.init.normal_(lazy.weight)``) raises."""
        return Tensor._wrap(np.empty(0, dtype=self._data.dtype))

    @data.setter
    def data(self, value: Any) -> None:
        Tensor.data.fset(self, value)  # type: ignore[attr-defined]

    def materialize(self, shape: Any, device: Any = None, dtype: Any = None) -> None:
        """Give this placeholder an (uninitialised) array of ``shape`` and turn it into a
        plain ``cls_to_become`` in place.

        Args:
            shape: the size (an int or a tuple).
            device, dtype: override the ones given at construction.
        """
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dt = self._data.dtype if dtype is None else _dt.to_dtype(dtype)
        dev = self._data.device_wanted if device is None else _backend.device(device)
        arr = np.empty(shape, dtype=dt)
        if dev.type != "cpu":
            from mpitensor._core.devices import move  # noqa: PLC0415 - device moves on demand

            arr = move(arr, dev)
        self._data = arr
        self.__class__ = self.cls_to_become

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    __str__ = __repr__

    def __reduce_ex__(self, proto: int) -> Any:
        return (type(self), (self._requires_grad, str(self._data.device_wanted),
                             self._data.dtype))

    def __deepcopy__(self, memo: dict) -> Any:
        twin = type(self)(self._requires_grad, self._data.device_wanted, self._data.dtype)
        memo[id(self)] = twin
        return twin


def _init_pending(t: Tensor, device: Any, dtype: Any) -> None:
    dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
    t._data = _pending(dt)
    # the device a later materialize() allocates on (moves of the module update it)
    t._data.device_wanted = _backend.device("cpu" if device is None else device)


class UninitializedParameter(_UninitializedMixin, Parameter):
    """A parameter whose shape a lazy module learns at its first forward; see the module
    docstring.

    Example:
        >>> p = UninitializedParameter()
        >>> p.materialize((2, 3))
        >>> type(p).__name__, tuple(p.shape)
        ('Parameter', (2, 3))
    """

    __slots__ = ()
    cls_to_become = Parameter

    def __init__(self, requires_grad: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        Parameter.__init__(self, None, requires_grad)
        _init_pending(self, device, dtype)


class UninitializedBuffer(_UninitializedMixin, Tensor):
    """A buffer whose shape a lazy module learns at its first forward.

    Example:
        >>> b = UninitializedBuffer()
        >>> b.materialize(4)
        >>> type(b).__name__, tuple(b.shape)
        ('Tensor', (4,))
    """

    __slots__ = ()
    cls_to_become = Tensor

    def __init__(self, requires_grad: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        Tensor.__init__(self, ())
        if requires_grad:
            self.requires_grad = True
        _init_pending(self, device, dtype)


def is_lazy(t: Any) -> bool:
    """Whether ``t`` is an uninitialized parameter or buffer."""
    return isinstance(t, _UninitializedMixin)
