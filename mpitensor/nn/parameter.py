"""``nn.Parameter``: a Tensor that a Module registers as a learnable parameter."""

from __future__ import annotations

from typing import Any

from mpitensor.tensor import Tensor, _new

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
        if data is None:
            data = ()
        super().__init__(data.detach() if isinstance(data, Tensor) else data)
        if requires_grad:
            self.requires_grad = True

    def __repr__(self) -> str:
        # torch prints the values as a plain tensor: "Parameter containing:\ntensor([...], ...)"
        t = _new(self._data)
        t._requires_grad = self._requires_grad
        return "Parameter containing:\n" + repr(t)

    __str__ = __repr__

    def __reduce_ex__(self, proto: int) -> Any:
        return (_rebuild_parameter, (self._data, self._requires_grad))

    def __deepcopy__(self, memo: dict) -> Parameter:
        if id(self) in memo:
            return memo[id(self)]
        result = Parameter(self._data.copy(), self._requires_grad)
        memo[id(self)] = result
        if self.grad is not None:
            result.grad = _new(self.grad._data.copy())
        return result


def _rebuild_parameter(data: Any, requires_grad: bool) -> Parameter:
    return Parameter(data, requires_grad)
