"""Padding modules with ``torch.nn``'s names: ``ConstantPad{1,2,3}d``, ``ZeroPad{1,2,3}d``,
``ReflectionPad{1,2,3}d``, ``ReplicationPad{1,2,3}d``, ``CircularPad{1,2,3}d``.

Each holds its ``padding`` as a tuple of 2, 4 or 6 ints (an int is used on every side) and
calls :func:`mpitensor.nn.functional.pad`.

Example:
    >>> import mpitensor as mt
    >>> ZeroPad2d(1)(mt.ones(1, 1, 1)).shape
    mpitensor.Size([1, 3, 3])
"""

from __future__ import annotations

from typing import Any

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.checks import is_int, is_number
from .module import Module

__all__ = [
    "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
    "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d",
    "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d", "CircularPad2d", "CircularPad3d",
]


def _amounts(cls: str, padding: Any, dims: int) -> tuple:
    if is_int(padding):
        return (int(padding),) * (2 * dims)
    if isinstance(padding, (tuple, list)) and len(padding) == 2 * dims and \
            all(is_int(p) for p in padding):
        return tuple(int(p) for p in padding)
    raise ValueError(f"{cls}: padding must be an int or a tuple of {2 * dims} ints, got "
                     f"{padding!r}")


class _Pad(Module):
    _mode = "constant"
    _dims = 1

    def __init__(self, padding: Any) -> None:
        super().__init__()
        self.padding = _amounts(type(self).__name__, padding, self._dims)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPad(_Pad):
    def __init__(self, padding: Any, value: float) -> None:
        super().__init__(padding)
        if not is_number(value):
            raise TypeError(f"{type(self).__name__}: value must be a number, got {value!r}")
        self.value = value

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class _ZeroPad(_ConstantPad):
    def __init__(self, padding: Any) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


def _family(base: type, mode: str, doc: str) -> tuple:
    out = []
    for dims in (1, 2, 3):
        name = f"{base.__name__.lstrip('_')}{dims}d"
        cls = type(name, (base,), {"_mode": mode, "_dims": dims, "__module__": __name__,
                                   "__qualname__": name,
                                   "__doc__": f"{doc} of the last {dims} dimension(s)."})
        out.append(cls)
    return tuple(out)


ConstantPad1d, ConstantPad2d, ConstantPad3d = _family(
    _ConstantPad, "constant", "Pad with a constant ``value``")
ZeroPad1d, ZeroPad2d, ZeroPad3d = _family(_ZeroPad, "constant", "Pad with zeros")


class _ReflectionPad(_Pad):
    pass


class _ReplicationPad(_Pad):
    pass


class _CircularPad(_Pad):
    pass


ReflectionPad1d, ReflectionPad2d, ReflectionPad3d = _family(
    _ReflectionPad, "reflect", "Pad with the reflection of the input (edge not repeated)")
ReplicationPad1d, ReplicationPad2d, ReplicationPad3d = _family(
    _ReplicationPad, "replicate", "Pad by repeating the edge values")
CircularPad1d, CircularPad2d, CircularPad3d = _family(
    _CircularPad, "circular", "Pad by wrapping the input around")
