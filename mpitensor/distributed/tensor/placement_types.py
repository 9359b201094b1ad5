"""The placements of a DTensor: how a tensor lies along one mesh dimension.

* ``Shard(dim)``: split on tensor dimension ``dim`` into as many pieces as the mesh dimension
  has ranks, as ``torch.chunk`` splits (pieces of ``ceil(n / k)``; the last ranks may get a
  shorter or an empty piece).
* ``Replicate()``: every rank holds the whole tensor.
* ``Partial(reduce_op)``: every rank holds a term; the tensor is their reduction
  (``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or ``"product"``), not yet carried out.

A DTensor on an n-dimensional mesh has one placement per mesh dimension.
"""

from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["Placement", "Shard", "Replicate", "Partial"]


class Placement:
    """The base of the placements; tells them apart without isinstance checks."""

    __slots__ = ()

    def is_shard(self, dim: Optional[int] = None) -> bool:
        """Whether this is a Shard (on tensor dimension ``dim``, when given)."""
        return False

    def is_replicate(self) -> bool:
        """Whether this is a Replicate."""
        return False

    def is_partial(self, reduce_op: Optional[str] = None) -> bool:
        """Whether this is a Partial (with ``reduce_op``, when given)."""
        return False


class _OneValue(Placement):
    """A placement defined by one value (Shard's dim, Partial's reduce_op): immutable,
    compared, hashed and pickled by it."""

    __slots__ = ()
    _field = ""
    _short = ""

    def _value(self) -> object:
        return getattr(self, self._field)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"placements are immutable; make a new {type(self).__name__}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._value() == self._value()  # type: ignore

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._value()))

    def __str__(self) -> str:
        return f"{self._short}({self._value()})"

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self._value(),))


class Shard(_OneValue):
    """Split the tensor on dimension ``dim`` across a mesh dimension's ranks.

    Example:
        >>> Shard(0), str(Shard(1))
        (Shard(dim=0), 'S(1)')
    """

    __slots__ = ("dim",)
    _field, _short = "dim", "S"

    def __init__(self, dim: int = 0) -> None:
        try:
            object.__setattr__(self, "dim", dim.__index__())
        except AttributeError:
            raise TypeError(f"Shard: dim must be an int, got {dim!r}") from None

    def is_shard(self, dim: Optional[int] = None) -> bool:
        return dim is None or dim == self.dim

    @staticmethod
    def local_shard_size_and_offset(size: int, num_chunks: int, rank: int) -> Tuple[int, int]:
        """The length and start of piece ``rank`` of ``size`` elements split ``num_chunks``
        ways as ``torch.chunk`` splits (an empty piece starts at ``size``)."""
        return shard_size_and_offset(size, num_chunks, rank)

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"



class Replicate(Placement):
    """Every rank of the mesh dimension holds the whole tensor."""

    __slots__ = ()

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return type(other) is Replicate

    def __hash__(self) -> int:
        return hash("Replicate")

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"


#: the reductions a Partial may stand for, and (of those) the ones linear in each term
REDUCE_OPS = ("sum", "avg", "min", "max", "product")
LINEAR_REDUCE_OPS = ("sum", "avg")


class Partial(_OneValue):
    """Every rank holds a term; the value is their reduction with ``reduce_op``.

    Args:
        reduce_op: ``"sum"`` (default), ``"avg"``, ``"min"``, ``"max"`` or ``"product"``.

    Raises:
        ValueError: any other ``reduce_op``.
    """

    __slots__ = ("reduce_op",)
    _field, _short = "reduce_op", "P"

    ALL_REDUCE_OPS = REDUCE_OPS
    LINEAR_REDUCE_OPS = LINEAR_REDUCE_OPS

    def __init__(self, reduce_op: str = "sum") -> None:
        if reduce_op not in REDUCE_OPS:
            raise ValueError(f"Partial: reduce_op {reduce_op!r} is not one of {REDUCE_OPS}")
        object.__setattr__(self, "reduce_op", reduce_op)

    def is_partial(self, reduce_op: Optional[str] = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"



def shard_size_and_offset(size: int, num_chunks: int, index: int) -> Tuple[int, int]:
    """Length and start of piece ``index`` when ``size`` is cut as ``torch.chunk`` cuts."""
    chunk = -(-size // num_chunks) if num_chunks else 0
    start = min(index * chunk, size)
    return min(start + chunk, size) - start, start
