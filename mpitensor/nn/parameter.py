"""``nn.Parameter``: the Tensor subclass that marks a value as learnable.

Assigning a Parameter as a Module attribute registers it (see ``Module.__setattr__``); a plain
Tensor assigned the same way stays an ordinary attribute. Apart from that registration a
Parameter behaves exactly like the Tensor it wraps.
"""

from __future__ import annotations

import copy
from typing import Any

from mpitensor.tensor import Tensor

__all__ = ["Parameter"]


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
