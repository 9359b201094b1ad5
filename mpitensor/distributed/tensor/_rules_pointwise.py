"""Sharding rules of the element-wise operations (unary, binary with broadcasting, and the
in-place forms optimizers use: ``add_``, ``mul_``, ``addcdiv_``, ``lerp_``, ...).

Per mesh dimension, the output takes:

* ``Shard(d)`` when an operand is sharded on a dimension that is not broadcast (the first
  such operand decides; in-place ops keep their own placement). Operands holding that
  dimension whole are cut to the same pieces (no communication; R -> S is a local chunk;
  P -> S a reduce_scatter); operands that broadcast along it stay replicated and their
  gradient is summed over the mesh dimension (``grad_sum``).
* ``Partial`` when an operand is Partial and the op is linear in it: ``P + P`` and
  ``P - P`` (same reduction), ``P * R``, ``P / R``, ``-P`` and copies. Replicate operands
  of it get ``grad_sum`` too.
* ``Replicate`` otherwise: partial operands are reduced first (all_reduce).
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

import mpitensor.nn.functional  # noqa: F401 - its functions get rules below
from mpitensor.tensor import Tensor

from ._dispatch import OpCall, Sharding, register_sharding_rule
from .placement_types import Partial, Placement, Replicate, Shard

# how an op treats Partial operands: "add" (P + P), "mul" (one P times others), "div"
# (P / others), "unary" (linear in its one operand), None (not linear)
UNARY = ("abs", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid",
         "relu", "sign", "sgn", "floor", "ceil", "round", "trunc", "frac", "reciprocal",
         "square", "erf", "erfc", "clamp", "clip", "clamp_min", "clamp_max", "pow",
         "float", "double", "half", "bfloat16", "int", "long", "bool", "to", "type",
         "logical_not", "isnan", "isinf", "isfinite", "nan_to_num", "bitwise_not",
         "__abs__", "__invert__", "hardtanh", "positive", "deg2rad", "rad2deg", "cpu",
         "cuda")
LINEAR_UNARY = ("neg", "negative", "__neg__", "clone", "contiguous", "__pos__")
BINARY = ("atan2", "maximum", "minimum", "fmax", "fmin", "floor_divide", "remainder",
          "fmod", "eq", "ne", "lt", "le", "gt", "ge", "greater", "less", "greater_equal",
          "less_equal", "not_equal", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor", "hypot", "copysign", "xlogy",
          "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__",
          "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__", "__or__",
          "__xor__", "__rtruediv__", "__rsub__", "rsub", "where", "lerp",
          "addcdiv", "addcmul", "masked_fill", "type_as")
ADDS = ("add", "sub", "subtract", "__add__", "__radd__", "__sub__")
MULS = ("mul", "multiply", "__mul__", "__rmul__")
DIVS = ("div", "divide", "true_divide", "__truediv__")
INPLACE = {"add_": "add", "sub_": "add", "mul_": "mul", "div_": "div", "neg_": "unary",
           "__iadd__": "add", "__isub__": "add", "__imul__": "mul", "__itruediv__": "div",
           "copy_": "unary", "zero_": "unary", "fill_": None, "addcdiv_": None,
           "addcmul_": None, "lerp_": None, "clamp_": None, "clip_": None, "sqrt_": None,
           "abs_": None, "exp_": None, "pow_": None, "sign_": None, "sigmoid_": None,
           "tanh_": None, "relu_": None, "floor_": None, "ceil_": None, "round_": None,
           "reciprocal_": None, "clamp_min_": None, "clamp_max_": None, "maximum_": None,
           "__ifloordiv__": None, "__ipow__": None, "masked_fill_": None}
FUNCTIONS = {f"mpitensor.nn.functional.{n}": None for n in (
    "relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "elu", "selu", "softplus",
    "mish", "hardswish", "hardsigmoid", "relu6", "logsigmoid", "hardtanh", "softsign")}
# Top-level functions (mpitensor.add, mpitensor.exp, ...) get no rule here: a wrapper would
# cost every plain call on small tensors ~0.1-0.3 us (measured); on a DTensor they raise,
# and the methods and operators (x.add(y), x.exp(), x + y) do the same work.


LINEAR_OPS = ("sum", "avg")


def _is_number(a: Any) -> bool:
    return isinstance(a, (int, float, complex, np.number)) and not isinstance(a, bool)


def _linear(call: OpCall, kind: Optional[str], m: int) -> bool:
    """Whether the op can keep its Partial operands on mesh dim ``m`` partial."""
    ps = [d.placements[m] for d in call.dtensors]
    partial = [p for p in ps if isinstance(p, Partial)]
    if kind is None or any(p.reduce_op not in LINEAR_OPS for p in partial):
        return False
    if kind == "unary":
        return len(call.dtensors) == 1
    if kind == "add":
        numbers = [a for a in call.args[1:] if _is_number(a)]
        return not numbers and len(partial) == len(ps) and len(set(partial)) == 1
    if kind == "mul":
        uses = sum(1 for a in call.args if any(a is d for d in call.dtensors))
        return (len(partial) == 1 and uses == len(ps)  # x * x is not linear in x
                and all(isinstance(p, (Partial, Replicate)) for p in ps))
    if kind == "div":
        first = call.args[0]
        return (len(partial) == 1 and first is call.dtensors[0] and isinstance(ps[0], Partial)
                and all(isinstance(p, Replicate) for p in ps[1:])
                and call.kwargs.get("rounding_mode") is None)
    return False


def _own_dim(d: Any, out_dim: int, nd: int) -> Optional[int]:
    """Operand ``d``'s dimension that lines up with output dim ``out_dim`` and is not
    broadcast along it; None when it broadcasts."""
    k = out_dim - (nd - d.ndim)
    return k if k >= 0 else None


def _decide(call: OpCall, kind: Optional[str], inplace: bool, out_shape: Tuple[int, ...],
            m: int) -> Tuple[Placement, List[Placement], List[bool]]:
    """The output placement on mesh dim ``m``, each operand's, and which get grad_sum."""
    nd = len(out_shape)
    dts = call.dtensors
    target: Placement = Replicate()
    first = dts[0].placements[m] if inplace else None
    for d in ([dts[0]] if inplace else dts):
        p = d.placements[m]
        od = p.dim + nd - d.ndim if isinstance(p, Shard) else -1
        if isinstance(p, Shard) and d.shape[p.dim] == out_shape[od]:
            target = Shard(od)
            break
    else:
        if any(isinstance(d.placements[m], Partial) for d in dts) and _linear(call, kind, m):
            target = next(d.placements[m] for d in dts if isinstance(d.placements[m], Partial))
        if inplace and isinstance(first, Partial) and target != first:
            raise call.fail(f"the in-place op would have to reduce its own {first!r} on mesh "
                            f"dim {m}; reduce it first (redistribute to Replicate)")
    wants: List[Placement] = []
    sums: List[bool] = []
    for d in dts:
        p = d.placements[m]
        if isinstance(target, Shard):
            k = _own_dim(d, target.dim, nd)
            if k is not None and d.shape[k] == out_shape[target.dim]:
                wants.append(Shard(k))
                sums.append(False)
                continue
            wants.append(Replicate())
            sums.append(True)
        elif isinstance(target, Partial):
            wants.append(p if isinstance(p, Partial) else Replicate())
            sums.append(not isinstance(p, Partial))
        else:
            wants.append(Replicate())
            sums.append(False)
    return target, wants, sums


def _out_shape(call: OpCall) -> Tuple[int, ...]:
    shapes = [tuple(d.shape) for d in call.dtensors]
    for a in call.args:  # a plain NumPy array operand broadcasts too
        if isinstance(a, np.ndarray):
            shapes.append(a.shape)
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise call.fail(f"the shapes {shapes} do not broadcast together") from None


def pointwise_sharding(call: OpCall, kind: Optional[str], inplace: bool = False) -> Sharding:
    """The sharding of an element-wise op (see the module's notes)."""
    out_shape = tuple(call.dtensors[0].shape) if inplace else _out_shape(call)
    n = call.mesh.ndim
    outs: List[Placement] = []
    wants: List[List[Placement]] = [[] for _ in call.dtensors]
    sums: List[List[int]] = [[] for _ in call.dtensors]
    for m in range(n):
        target, w, s = _decide(call, kind, inplace, out_shape, m)
        outs.append(target)
        for i in range(len(call.dtensors)):
            wants[i].append(w[i])
            if s[i]:
                sums[i].append(m)
    return Sharding(placements=tuple(outs), shape=out_shape,
                    inputs=[tuple(w) for w in wants], grad_sum=[tuple(s) for s in sums],
                    inplace=inplace)


def _rule(kind: Optional[str], inplace: bool = False) -> Any:
    def rule(call: OpCall) -> Sharding:
        return pointwise_sharding(call, kind, inplace)

    return rule


def _register() -> None:
    table: List[Tuple[str, Optional[str]]] = [(n, "unary") for n in LINEAR_UNARY]
    table += [(n, None) for n in UNARY + BINARY]
    table += [(n, "add") for n in ADDS] + [(n, "mul") for n in MULS]
    table += [(n, "div") for n in DIVS]
    for name, kind in table:
        if hasattr(Tensor, name):
            register_sharding_rule(name, _rule(kind))
    for name, kind in INPLACE.items():
        if hasattr(Tensor, name):
            register_sharding_rule(name, _rule(kind, inplace=True))
    for path, kind in FUNCTIONS.items():
        module, _, name = path.rpartition(".")
        if hasattr(sys.modules[module], name):
            register_sharding_rule(path, _rule(kind))


_register()

__all__: Sequence[str] = ["pointwise_sharding"]
