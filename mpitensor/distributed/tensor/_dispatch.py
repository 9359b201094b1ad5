"""How operations on DTensors are run: sharding rules, and a guard for everything else.

mpitensor has no ``__torch_function__``, so a DTensor gets its operations two ways, and
anything that reaches none of them fails loudly instead of computing on a piece:

1. **Rules.** ``register_sharding_rule(op, rule)`` names an operation and a function that
   decides its layout. ``op`` is a Tensor method or operator name (``"add"``,
   ``"__mul__"``, ``"view"``): the method is installed on :class:`DTensor` only, so plain
   Tensors never pay for it. Or ``op`` is a function's dotted path
   (``"mpitensor.nn.functional.linear"``): that module attribute is replaced by a wrapper
   that sends a call with a DTensor argument to the rule and any other call straight to the
   original (one ``isinstance`` per positional argument).
2. **The rule** gets an :class:`OpCall` (the op, its arguments, the mesh, the DTensor
   operands in order) and returns a :class:`Sharding`: the placements each operand must be
   redistributed to first, the mesh dims over which an operand's gradient must be summed
   (a replicated operand that met sharded ones), the output's placements and global shape,
   and optionally the arguments of the local call (a view's local shape). The dispatcher
   then redistributes (differentiably), runs the original op on the local tensors (so
   autograd records the local computation) and wraps the result. A rule that cannot place
   its inputs raises :class:`ShardingError` naming the op and the placements.
3. **The guard.** A DTensor's ``_data`` (the attribute every op reads its array from) is a
   property: reading it raises :class:`ShardingError` naming the operation that tried (the
   outermost mpitensor function on the stack) and the placements. Only the modules listed
   by :func:`allow_local_access` read the local array through it: the element-wise
   optimizers, whose every formula maps each element of a parameter to the same element of
   its gradient and state, so they step on the local pieces correctly.

Gradients follow one convention (see ``_redistribute``): a DTensor's local gradient is the
global gradient laid out in the DTensor's placements. Rules keep it by construction: local
ops on operands of one layout, redistributions with their adjoints, and ``grad_sum`` for a
replicated operand broadcast against a sharded or partial one.

Every rank takes part in every collective of a backward, whatever its piece: where a local
op's graph does not reach an operand on this rank (the shortcuts of ops for empty inputs:
``layer_norm`` of an empty piece returns ``input * 1``), the output is tied to that operand
(:class:`_Tie`), which hands it a zero gradient, so the collectives behind the operand run
here as on the ranks whose pieces hold data.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mpitensor.distributed as dist
from mpitensor import backend as _backend
from mpitensor.autograd import ArrayFunction as Function, is_grad_enabled
from mpitensor.autograd import function as _function
from mpitensor.tensor import Tensor

from .placement_types import Placement

__all__ = ["register_sharding_rule", "OpCall", "Sharding", "ShardingError",
           "allow_local_access", "dispatch", "registered_ops"]


class ShardingError(NotImplementedError):
    """An operation on DTensors that has no sharding rule, or whose rule cannot place its
    inputs."""


# ------------------------------------------------------------------ the guard
_LOCAL_READERS = {f"mpitensor.optim.{m}" for m in (
    "optimizer", "_adaptive", "sgd", "adam", "adamw", "adamax", "nadam", "radam", "rmsprop",
    "adagrad", "adadelta", "rprop", "asgd")}


def allow_local_access(module_name: str) -> None:
    """Let code in ``module_name`` read and write a DTensor's local array through ``_data``
    (only for code that treats every element on its own, as the element-wise optimizers)."""
    _LOCAL_READERS.add(module_name)


#: modules whose frames only forward a call (keyword spellings, autocast's entry
#: wrappers): never named as the op
_PLUMBING = ("mpitensor.distributed.tensor", "mpitensor._core.numpy_names",
             "mpitensor._core.autocast")


def _names_an_op(code_name: str) -> bool:
    """Whether a function name says what the user called (not a helper, a module's
    ``__call__``/``forward`` or a comprehension); operators (``__matmul__``) do."""
    if code_name in ("forward", "__call__") or "<" in code_name:
        return False
    return not code_name.startswith("_") or (code_name.startswith("__")
                                             and code_name.endswith("__"))


def _op_name(frame: Any) -> str:
    """The outermost mpitensor function on the stack that names an operation: what the user
    called (``F.linear`` inside a module's forward, ``sum`` behind a keyword wrapper)."""
    name = fallback = None
    while frame is not None:
        mod = frame.f_globals.get("__name__", "")
        if mod != "mpitensor" and not mod.startswith("mpitensor."):
            break
        if not mod.startswith(_PLUMBING):
            here = f"{mod}.{frame.f_code.co_name}"
            fallback = fallback or here
            if _names_an_op(frame.f_code.co_name):
                name = here
        frame = frame.f_back
    return name or fallback or "an operation"


def _refuse(frame: Any, t: Any) -> ShardingError:
    op = _op_name(frame)
    return ShardingError(
        f"{op} on a DTensor (shape {tuple(t.shape)}, placements {t.placements}) has no "
        f"sharding rule: it would read this rank's piece as if it were the whole tensor. "
        f"Use .full_tensor() (or .to_local() for the piece) first, or register a rule with "
        f"mpitensor.distributed.tensor._dispatch.register_sharding_rule")


def read_local_array(t: Any) -> Any:
    """``DTensor._data``: the local array, for the allowed modules only."""
    frame = sys._getframe(1)
    if frame.f_globals.get("__name__") in _LOCAL_READERS:
        return t._local_tensor._data
    raise _refuse(frame, t)


def write_local_array(t: Any, value: Any) -> None:
    frame = sys._getframe(1)
    if frame.f_globals.get("__name__") not in _LOCAL_READERS:
        raise _refuse(frame, t)
    if tuple(value.shape) != tuple(t._local_tensor._data.shape):
        raise ValueError(f"DTensor: the local array must keep its shape "
                         f"{tuple(t._local_tensor._data.shape)}, got {tuple(value.shape)}")
    t._local_tensor._data = value


# ------------------------------------------------------------------ the rule protocol
def _describe(dtensors: Sequence[Any]) -> str:
    """The operands as the errors name them: each one's global shape and placements."""
    return ", ".join(f"{tuple(d.shape)} {d.placements}" for d in dtensors)


@dataclass
class OpCall:
    """One call of an operation with DTensor arguments, as a rule sees it.

    Attributes:
        op: the registered name; args, kwargs: the call's arguments (DTensors in place).
        mesh: the operands' mesh; dtensors: the DTensor operands in order of appearance
            (positional first, one level into lists and tuples, then keyword values).
    """

    op: str
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    mesh: Any
    dtensors: List[Any]

    def placements(self) -> List[Tuple[Placement, ...]]:
        return [d.placements for d in self.dtensors]

    def describe(self) -> str:
        return _describe(self.dtensors)

    def fail(self, why: str) -> "ShardingError":
        """The error a rule raises when it cannot place this call's operands."""
        return ShardingError(f"{self.op} on DTensors ({self.describe()}): {why}")


@dataclass
class Sharding:
    """A rule's decision for one call.

    Attributes:
        placements: the output's placements (a list of them for an op with several outputs).
        shape: the output's global shape (a list of shapes likewise).
        inputs: per DTensor operand, the placements to redistribute it to first (None: as
            it is); None for all as they are.
        grad_sum: per DTensor operand, the mesh dims whose gradient contributions are summed
            in backward (a Replicate operand broadcast against a sharded or partial one).
        args, kwargs: the arguments of the local call (DTensors still in place); None: the
            call's own.
        inplace: the op writes into its first operand and returns it.
        fn: the function run on the local tensors, when not the op itself (e.g. a
            ``reshape`` to the local shape for ``flatten``).
    """

    placements: Any
    shape: Any
    inputs: Optional[Sequence[Optional[Tuple[Placement, ...]]]] = None
    grad_sum: Optional[Sequence[Tuple[int, ...]]] = None
    args: Optional[Tuple[Any, ...]] = None
    kwargs: Optional[Dict[str, Any]] = None
    inplace: bool = False
    fn: Optional[Callable[..., Any]] = None


Rule = Callable[[OpCall], Sharding]
_RULES: Dict[str, Tuple[Rule, bool]] = {}
_DTENSOR: List[type] = []  # the DTensor class, once _api has been imported
_KINDS: set = set()  # DTensor and its subclasses (DTensorParameter), for the wrappers' test


def registered_ops() -> List[str]:
    """The names of the operations that have a sharding rule."""
    return sorted(_RULES)


def register_sharding_rule(op: str, rule: Rule, *, allow_plain_tensors: bool = False) -> None:
    """Make ``op`` on DTensors follow ``rule`` (see the module's notes).

    Args:
        op: a Tensor method or operator name, or a function's dotted path.
        rule: ``rule(call: OpCall) -> Sharding``.
        allow_plain_tensors: let plain Tensors be arguments too (indices, masks), passed to
            the local call as they are; otherwise mixing raises TypeError, as in torch.
    """
    _RULES[op] = (rule, allow_plain_tensors)
    if _DTENSOR:
        _install(op)


def set_dtensor_class(cls: type, *subclasses: type) -> None:
    """Called once by ``_api``: install the methods of the rules registered before it."""
    _DTENSOR.append(cls)
    _KINDS.update((cls,) + subclasses)
    for op in list(_RULES):
        _install(op)


def _install(op: str) -> None:
    if "." in op:
        _wrap_function(op)
        return
    cls = _DTENSOR[0]
    original = getattr(Tensor, op, None)
    if original is None:
        raise ValueError(f"register_sharding_rule: Tensor has no method {op!r}; name a "
                         "function by its dotted path (e.g. 'mpitensor.nn.functional.relu')")

    @functools.wraps(original)
    def method(*args: Any, **kwargs: Any) -> Any:
        return dispatch(op, original, args, kwargs)

    setattr(cls, op, method)


def _wrap_function(path: str) -> None:
    modname, _, name = path.rpartition(".")
    module = importlib.import_module(modname)
    original = getattr(module, name)
    if getattr(original, "__dtensor_original__", None) is not None:
        return
    kinds = _KINDS  # the DTensor classes: a set lookup on the type is the cheapest test

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for a in args:
            t = type(a)
            if t in kinds or ((t is list or t is tuple) and _holds(a, kinds)):
                return dispatch(path, original, args, kwargs)
        if kwargs:
            for a in kwargs.values():
                if type(a) in kinds:
                    return dispatch(path, original, args, kwargs)
        return original(*args, **kwargs)

    wrapper.__dtensor_original__ = original  # type: ignore[attr-defined]
    setattr(module, name, wrapper)


def _holds(seq: Any, kinds: set) -> bool:
    return any(type(x) in kinds for x in seq)


# ------------------------------------------------------------------ the dispatcher
class _SumGrad(Function):
    """Identity forward; backward sums the gradient over mesh dims (all_reduce)."""

    @staticmethod
    def forward(ctx: Any, x: Any, mesh: Any, dims: Tuple[int, ...]) -> Any:
        ctx.where = (mesh, dims)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Tuple[Any, ...]:
        mesh, dims = ctx.where
        g = grad.copy(order="C")
        for m in dims:
            if mesh.size(m) > 1:  # one rank's term is the sum
                dist.all_reduce(g, group=mesh.get_group(m))
        return g, None, None


class _Tie(Function):
    """Identity on an op's output; backward also hands each tied operand a zero gradient.

    A local op may leave an operand out of its graph on one rank only: the shortcuts for
    empty inputs (``layer_norm`` of an empty piece returns ``input * 1``, without the
    weight). The autograd engine runs no node whose gradient is None, so that rank would
    skip the collectives behind the operand (a replicated weight's ``_SumGrad``
    all_reduce, a redistribution's adjoint) while the other ranks wait in them.
    """

    @staticmethod
    def forward(ctx: Any, out: Any, *operands: Any) -> Any:
        ctx.metas = [(o.shape, o.dtype) for o in operands]
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Tuple[Any, ...]:
        xp = _backend.array_module(grad)
        return (grad,) + tuple(xp.zeros(s, dtype=d) for s, d in ctx.metas)


def _graph_key(t: Any) -> Any:
    """What the engine's edges name for ``t``: its node, or the leaf itself."""
    return t.grad_fn if t.grad_fn is not None else t


def _reached(out: Any, keys: Dict[int, Any], since: int) -> set:
    """The ids of ``keys``' entries that the graph of ``out`` reaches through the nodes made
    after ``since`` (the local op's own nodes: older ones are not followed)."""
    start = _graph_key(out) if out.requires_grad else None
    found = {i for i, k in keys.items() if k is start}
    stack = [start] if type(start) is _function.Node and start.seq > since else []
    seen = set()
    while stack:
        node = stack.pop()
        for n in node._next:
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            for i, k in keys.items():
                if k is n:
                    found.add(i)
            if type(n) is _function.Node and n.seq > since:
                stack.append(n)
    return found


def _tie(out: Any, locs: List[Any], since: int) -> Any:
    """``out``, tied to every operand in ``locs`` its local graph does not reach."""
    if not isinstance(out, Tensor) or not (out.is_floating_point() or out.is_complex()):
        return out
    keys = {i: _graph_key(t) for i, t in enumerate(locs)}
    reached = _reached(out, keys, since)
    missed = [t for i, t in enumerate(locs) if i not in reached]
    return _Tie.apply(out, *missed) if missed else out


def _tie_all(out: Any, locs: List[Any], since: int) -> Any:
    """Every tensor output tied (see :class:`_Tie`), whichever the loss goes on to use."""
    if isinstance(out, (list, tuple)):
        return type(out)(_tie(o, locs, since) for o in out)
    return _tie(out, locs, since)


def _operands(op: str, args: Tuple[Any, ...], kwargs: Dict[str, Any],
              allow_plain: bool) -> Tuple[List[Any], Any]:
    dt = _DTENSOR[0]
    found: List[Any] = []
    plain: List[Any] = []

    def see(a: Any) -> None:
        if isinstance(a, dt):
            if all(a is not f for f in found):
                found.append(a)
        elif isinstance(a, Tensor):
            plain.append(a)

    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (list, tuple)):
            for x in a:
                see(x)
        else:
            see(a)
    if plain and not allow_plain:
        raise TypeError(f"{op}: got DTensor ({_describe(found)}) and plain Tensor arguments "
                        f"(a plain one of shape "
                        f"{tuple(plain[0].shape)}); make every tensor argument a DTensor "
                        "first (distribute_tensor or DTensor.from_local)")
    mesh = found[0].device_mesh
    for d in found[1:]:
        if d.device_mesh != mesh:
            raise ValueError(f"{op}: DTensor arguments ({_describe(found)}) on different meshes "
                             f"({mesh!r} and {d.device_mesh!r}); redistribute them onto one "
                             "mesh first")
    return found, mesh


def _swap(value: Any, table: Dict[int, Any]) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(table.get(id(x), x) for x in value)
    return table.get(id(value), value)


def dispatch(op: str, fn: Callable[..., Any], args: Tuple[Any, ...],
             kwargs: Dict[str, Any]) -> Any:
    """Run ``fn`` (the plain-Tensor op) on the local pieces as the rule of ``op`` decides."""
    from ._redistribute import Redistribute

    entry = _RULES.get(op)
    found, mesh = _operands(op, args, kwargs, entry is not None and entry[1])
    call = OpCall(op, args, kwargs, mesh, found)
    if entry is None:
        raise call.fail("no sharding rule is registered for it; use .full_tensor() first, "
                        "or register one with _dispatch.register_sharding_rule")
    sh = entry[0](call)
    table: Dict[int, Any] = {}
    grad_on = is_grad_enabled()
    for i, d in enumerate(found):
        loc = d._local_tensor
        want = sh.inputs[i] if sh.inputs is not None else None
        if want is not None and tuple(want) != d.placements:
            if sh.inplace and i == 0:
                raise call.fail(f"an in-place op cannot move its output from {d.placements} "
                                f"to {tuple(want)}")
            loc = Redistribute.apply(loc, tuple(d.shape), mesh, d.placements, tuple(want))
        dims = sh.grad_sum[i] if sh.grad_sum is not None else ()
        if dims and grad_on and loc.requires_grad:
            loc = _SumGrad.apply(loc, mesh, tuple(dims))
        table[id(d)] = loc
    a = sh.args if sh.args is not None else args
    kw = sh.kwargs if sh.kwargs is not None else kwargs
    run = sh.fn if sh.fn is not None else fn
    since = next(_function._seq)  # the local op's nodes are the ones made from here on
    out = run(*[_swap(x, table) for x in a], **{k: _swap(v, table) for k, v in kw.items()})
    if sh.inplace:
        return args[0]
    needs = [t for t in table.values() if t.requires_grad] if grad_on else []
    if needs:
        out = _tie_all(out, needs, since)
    return _wrap(out, mesh, sh.placements, sh.shape)


def _wrap(out: Any, mesh: Any, placements: Any, shape: Any) -> Any:
    make = _DTENSOR[0]._make
    if isinstance(out, Tensor):
        return make(out, mesh, tuple(placements), shape)
    if not isinstance(out, (list, tuple)):
        return out  # NotImplemented, or a plain value
    return type(out)(make(o, mesh, tuple(p), s) for o, p, s in zip(out, placements, shape))
