"""Names of operations as torch's programs write them (``torch.ops.c10d_functional.all_reduce``,
``torch.ops.aten.mm.default``), for :class:`CommDebugMode`'s keys and ``register_sharding``.

mpitensor has no operator registry: these are names only. A collective's key is a ``str``
(``"c10d_functional.all_reduce"``), so a count can be looked up by the string too; an aten
overload names the Tensor method or function mpitensor runs for it (``aten.mm.default`` ->
``"mm"``).
"""

from __future__ import annotations

from typing import Dict

__all__ = ["CommOp", "AtenOp", "ops", "FUNCOL", "C10D"]


class CommOp(str):
    """A collective as counted by CommDebugMode: equal to (and hashed as) its name."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<OpOverloadPacket(op='{str.__str__(self)}')>"


#: the functional collectives DTensor issues (torch's ``c10d_functional`` namespace)
FUNCOL = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
          "broadcast")
#: torch.distributed's collectives by their c10d op names, keyed by the public function
C10D: Dict[str, str] = {
    "all_reduce": "allreduce_", "broadcast": "broadcast_", "reduce": "reduce_",
    "all_gather": "allgather_", "all_gather_into_tensor": "_allgather_base_",
    "gather": "gather_", "scatter": "scatter_", "reduce_scatter": "reduce_scatter_",
    "reduce_scatter_tensor": "_reduce_scatter_base_", "all_to_all": "alltoall_",
    "all_to_all_single": "alltoall_base_"}


class AtenOp:
    """``aten.<name>.<overload>``: the operation mpitensor knows as ``name`` (a Tensor method,
    or a function's dotted path given to ``register_sharding``)."""

    def __init__(self, name: str, overload: str = "default") -> None:
        self.name, self.overload = name, overload

    def __getattr__(self, overload: str) -> "AtenOp":
        if overload.startswith("__") or self.overload != "default" or "." in self.name:
            raise AttributeError(overload)
        return AtenOp(self.name, overload)

    def __repr__(self) -> str:
        return f"aten.{self.name}.{self.overload}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AtenOp) and (self.name, self.overload) == (other.name,
                                                                           other.overload)

    def __hash__(self) -> int:
        return hash((self.name, self.overload))


class _Namespace:
    def __init__(self, name: str, members: tuple) -> None:
        self._name, self._members = name, members

    def __getattr__(self, name: str) -> CommOp:
        if name not in self._members:
            raise AttributeError(f"ops.{self._name} has no collective {name!r} here (known: "
                                 f"{', '.join(self._members)})")
        return CommOp(f"{self._name}.{name}")


class _Aten:
    def __getattr__(self, name: str) -> AtenOp:
        if name.startswith("__"):
            raise AttributeError(name)
        return AtenOp(name)


class _Ops:
    """``torch.ops`` as far as mpitensor names operations: ``c10d_functional``, ``c10d``,
    ``_c10d_functional`` (the same keys as ``c10d_functional``) and ``aten``."""

    c10d_functional = _Namespace("c10d_functional", FUNCOL)
    _c10d_functional = c10d_functional
    c10d = _Namespace("c10d", tuple(C10D.values()))
    aten = _Aten()


ops = _Ops()
