"""``register_sharding(op)``: a user's sharding strategies for an operation, on mpitensor's
rule registry (``_dispatch.register_sharding_rule``).

The decorated function gets the op's arguments, each DTensor replaced by a :class:`TensorSpec`
(shape, ndim, dtype, placements, mesh), and returns the acceptable shardings for one mesh
dimension: pairs ``(output placements, input placements)``, one output placement per output
and one input placement per positional argument (None for a non-tensor). On a mesh of
several dimensions every combination is acceptable; the one that moves the fewest operands
through a collective is taken (ties: the first listed), the operands are redistributed to
it and the op runs on the local pieces.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Sequence, Tuple

from .. import _dispatch
from .._api import DTensor
from .._dispatch import OpCall, Sharding
from ..debug._op_names import AtenOp
from ..placement_types import Partial, Placement, Replicate, Shard, shard_size_and_offset

__all__ = ["register_sharding", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """A DTensor argument as a sharding function sees it (torch's DTensorSpec-like object)."""

    shape: Tuple[int, ...]
    dtype: Any
    placements: Tuple[Placement, ...]
    mesh: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device_mesh(self) -> Any:
        return self.mesh


#: where programs reach the functions that rules wrap (a rule wraps the attribute they call)
_PUBLIC = ("mpitensor.nn.functional", "mpitensor", "mpitensor.linalg")


def _op_name(op: Any) -> str:
    """The registry's name of ``op``: ``aten.mm.default`` -> ``"mm"``, a string as it is, a
    function by its module and name (``mpitensor.nn.functional.softmax``)."""
    if isinstance(op, AtenOp):
        return op.name
    if isinstance(op, str):
        return op
    name = getattr(op, "__name__", None)
    if callable(op) and name:
        for where in _PUBLIC + (getattr(op, "__module__", None),):
            module = sys.modules.get(where or "")
            if module is not None and getattr(module, name, None) is op:
                return f"{where}.{name}"
    raise TypeError(f"register_sharding: {op!r} is not an operation found in "
                    f"{', '.join(_PUBLIC)} (give aten.<name>.default, a Tensor method name, "
                    "or the function's dotted path as callers reach it)")


def _cost(have: Placement, want: Placement) -> int:
    """1 where moving ``have`` to ``want`` on one mesh dim takes a collective, else 0."""
    if have == want or isinstance(have, Replicate):
        return 0
    return 1


def _spec_args(call: OpCall) -> Tuple[List[Any], dict]:
    def spec(a: Any) -> Any:
        if isinstance(a, DTensor):
            return TensorSpec(tuple(a.shape), a.dtype, a.placements, a.device_mesh)
        return a
    return [spec(a) for a in call.args], {k: spec(v) for k, v in call.kwargs.items()}


def _choose(call: OpCall, strategies: Sequence[Tuple[Any, Any]]) -> Tuple[list, list]:
    """Per mesh dim the strategy index (cheapest combination), with per-operand placements."""
    positions = [i for i, a in enumerate(call.args) if isinstance(a, DTensor)]
    if len(positions) != len(call.dtensors):
        raise call.fail("register_sharding rules take DTensors as positional arguments only")
    for _outs, ins in strategies:
        if len(ins) != len(call.args):
            raise call.fail(f"a sharding strategy gives {len(ins)} input placements for "
                            f"{len(call.args)} positional arguments")
        if any(not isinstance(ins[i], Placement) for i in positions):
            raise call.fail(f"a sharding strategy gives {list(ins)}: each DTensor argument "
                            "needs a Placement")
    best, best_cost = None, None
    first = call.args[positions[0]] if positions else None
    for combo in itertools.product(range(len(strategies)), repeat=call.mesh.ndim):
        if _inplace(call.op) and first is not None and tuple(
                strategies[s][1][positions[0]] for s in combo) != first.placements:
            continue  # an in-place op cannot move the operand it writes
        cost = sum(_cost(call.args[i].placements[m], strategies[s][1][i])
                   for m, s in enumerate(combo) for i in positions)
        if best_cost is None or cost < best_cost:
            best, best_cost = combo, cost
    if best is None:
        raise call.fail(f"an in-place op keeps its operand's placements {first.placements}; "
                        "no strategy listed keeps them")
    inputs = [tuple(strategies[s][1][i] for s in best) for i in positions]
    return list(best), inputs


def _global_shape(local: Tuple[int, ...], placements: Tuple[Placement, ...], call: OpCall,
                  inputs: List[Tuple[Placement, ...]]) -> List[int]:
    """The output's global shape: along a sharded dim, an operand's global length where that
    operand is cut the same way and its piece has the output's length; else local x shards."""
    shape = list(local)
    for d in range(len(shape)):
        mdims = [m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim % max(
            len(shape), 1) == d]
        if not mdims:
            continue
        n = None
        for dt, want in zip(call.dtensors, inputs):
            cut = [m for m, p in enumerate(want) if isinstance(p, Shard)
                   and p.dim % max(dt.ndim, 1) == d]
            if cut == mdims and d < dt.ndim:
                if _local_length(dt.shape[d], call.mesh, mdims) == shape[d]:
                    n = dt.shape[d]
                    break
        if n is None:
            n = shape[d]
            for m in mdims:
                n *= call.mesh.size(m)
        shape[d] = n
    return shape


def _local_length(n: int, mesh: Any, mdims: List[int]) -> int:
    coord = mesh.get_coordinate()
    for m in mdims:
        n, _ = shard_size_and_offset(n, mesh.size(m), coord[m])
    return n


def _inplace(op: str) -> bool:
    """A Tensor method ending in ``_`` (``add_``) writes into its first operand."""
    return "." not in op and op.endswith("_") and not op.endswith("__")


def _rule(fn: Callable[..., Any]) -> Callable[[OpCall], Sharding]:
    def rule(call: OpCall) -> Sharding:
        args, kwargs = _spec_args(call)
        strategies = [(list(o), list(i)) for o, i in fn(*args, **kwargs)]
        if not strategies:
            raise call.fail("the registered sharding function returned no strategy")
        combo, inputs = _choose(call, strategies)
        n_out = len(strategies[0][0])
        outs = [tuple(strategies[s][0][k] for s in combo) for k in range(n_out)]
        for p in [p for o in outs for p in o]:
            if not isinstance(p, (Shard, Replicate, Partial)):
                raise call.fail(f"output placement {p!r} is not a Placement")
        sharding = Sharding(placements=outs[0] if n_out == 1 else outs, shape=None,
                            inputs=inputs, inplace=_inplace(call.op))
        if sharding.inplace and outs[0] != call.dtensors[0].placements:
            raise call.fail(f"an in-place op's output is its operand, placed "
                            f"{call.dtensors[0].placements}; the strategy gives {outs[0]}")

        def run(*a: Any, **kw: Any) -> Any:
            out = _RUNNING[call.op](*a, **kw)
            many = isinstance(out, (list, tuple))
            locs = list(out) if many else [out]
            shapes = [_global_shape(tuple(o.shape), p, call, inputs) for o, p in zip(locs, outs)]
            sharding.shape = shapes if many else shapes[0]
            return out

        sharding.fn = run
        return sharding

    return rule


#: the plain op behind each registered name (set at registration)
_RUNNING: dict = {}


def register_sharding(op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function's sharding strategies for ``op`` (or a list of ops),
    replacing mpitensor's own rule for it, as torch's ``register_sharding``.

    ``op``: ``ops.aten.<name>.default`` (the Tensor method ``<name>``), a Tensor method name
    (``"softmax"``), or a function's dotted path or the function itself
    (``mpitensor.nn.functional.softmax``).

    Example::

        @register_sharding(torch.ops.aten.softmax.default)
        def softmax_sharding(x, dim):
            d = dim % x.ndim
            return [([Replicate()], [Replicate(), None])] + [
                ([Shard(k)], [Shard(k), None]) for k in range(x.ndim) if k != d]
    """
    ops = op if isinstance(op, list) else [op]
    names = [_op_name(o) for o in ops]

    def wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            _RUNNING[name] = _plain_op(name)
            _dispatch.register_sharding_rule(name, _rule(fn))
        return fn

    return wrapper


def _plain_op(name: str) -> Callable[..., Any]:
    """The op run on local tensors: the Tensor method, or the function (unwrapped)."""
    import importlib

    from mpitensor.tensor import Tensor

    if "." not in name:
        original = getattr(Tensor, name, None)
        if original is None:
            raise ValueError(f"register_sharding: Tensor has no method {name!r} (torch's aten "
                             "name may differ from mpitensor's: give the method or function)")
        return original
    modname, _, attr = name.rpartition(".")
    f = getattr(importlib.import_module(modname), attr)
    return getattr(f, "__dtensor_original__", f)
