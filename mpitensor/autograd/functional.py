"""``torch.autograd.functional``: Jacobians and vector products of a function of tensors.

Everything here goes through the full Jacobian, built row by row in reverse mode (one
:func:`grad` pass per output element), so ``jvp`` is exact as well (it is ``J @ v``, not a
forward-mode pass); ``vectorize=True`` and ``strategy="forward-mode"`` give the same Jacobian
by the same loop. ``hvp``, ``vhp`` and ``hessian`` need the gradient of a gradient (double
backward), which mpitensor's autograd does not have: they raise ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from . import _engine
from .grad_api import grad
from .grad_mode import enable_grad

__all__ = ["jacobian", "vjp", "jvp", "hvp", "vhp", "hessian"]


def _tensor() -> type:
    return _engine._Tensor


def jacobian_arrays(outs: List[Any], xs: List[Any]) -> List[List[Any]]:
    """Per output, per input: the Jacobian as an array ``(output elements, input elements)``.

    Row ``r`` is the gradient of the output's element ``r`` (one :func:`grad` pass each). An
    output that does not require grad, or an input it does not depend on, gives zeros.
    """
    result = []
    for o in outs:
        xp = _engine._xp(o._data)
        per_x = [xp.zeros((o._data.size, x._data.size), dtype=x._data.dtype) for x in xs]
        if o._requires_grad:
            for r in range(o._data.size):
                seed = xp.zeros(o._data.shape, dtype=o._data.dtype)
                seed.reshape(-1)[r] = 1
                gs = grad(o, xs, _engine._new(seed), retain_graph=True, allow_unused=True)
                for i, g in enumerate(gs):
                    if g is not None:
                        per_x[i][r] = g._data.reshape(-1)
        result.append(per_x)
    return result


def _as_tuple(x: Any, what: str, fn: str) -> tuple:
    """(tuple of tensors, whether ``x`` was a tuple or list)."""
    Tensor = _tensor()  # noqa: N806 - the class
    is_tuple = isinstance(x, (tuple, list))
    xs = tuple(x) if is_tuple else (x,)
    for i, t in enumerate(xs):
        if not isinstance(t, Tensor):
            raise TypeError(f"the {what} given to {fn} must be tensors (or a tuple of them), but "
                            f"entry {i} is a {type(t).__name__}")
    return xs, is_tuple


def _run(func: Callable, inputs: Any, fn: str) -> tuple:
    """Run ``func`` on detached copies of ``inputs`` that require grad, with grad mode on.

    Returns (inputs, inputs-was-a-tuple, outputs, outputs-were-a-tuple).
    """
    xs, in_tuple = _as_tuple(inputs, "inputs", fn)
    xs = tuple(x.detach().requires_grad_(True) for x in xs)
    with enable_grad():
        out = func(*xs)
    outs, out_tuple = _as_tuple(out, "outputs of the user-provided function", fn)
    return xs, in_tuple, outs, out_tuple


def _check_strict(outs: tuple, xs: tuple, fn: str) -> None:
    for j, o in enumerate(outs):
        for i, x in enumerate(xs):
            if not o._requires_grad or not _depends(o, x):
                raise RuntimeError(f"{fn}(strict=True): output {j} of the function does not "
                                   f"depend on input {i}; pass strict=False to get zeros")


def _depends(o: Any, x: Any) -> bool:
    ones = _engine._new(_engine._xp(o._data).ones_like(o._data))
    return grad(o, x, ones, retain_graph=True, allow_unused=True)[0] is not None


def _refuse_create_graph(create_graph: bool, fn: str) -> None:
    if create_graph:
        raise NotImplementedError(_engine.CREATE_GRAPH_REFUSED.format(fn))


def jacobian(func: Callable, inputs: Any, create_graph: bool = False, strict: bool = False,
             vectorize: bool = False, strategy: str = "reverse-mode") -> Any:
    """The Jacobian of ``func`` at ``inputs``.

    Args:
        func: takes the inputs, returns a tensor or a tuple of tensors.
        inputs: a tensor or a tuple of tensors.
        create_graph: not supported (False).
        strict: raise when an output does not depend on an input (instead of zeros).
        vectorize, strategy: accepted for torch's signature; the Jacobian is the same
            (built row by row in reverse mode either way).

    Returns:
        For one input and one output a tensor of shape ``output.shape + input.shape``; a tuple
        over inputs and/or outputs otherwise (``result[j][i]`` for output j, input i).

    Example:
        >>> import mpitensor as mt
        >>> jacobian(lambda x: x * x, mt.tensor([1.0, 2.0]))
        tensor([[2., 0.],
                [0., 4.]])
    """
    _refuse_create_graph(create_graph, "jacobian")
    if strategy not in ("reverse-mode", "forward-mode"):
        raise ValueError(f"strategy must be 'reverse-mode' or 'forward-mode', got {strategy!r}")
    xs, in_tuple, outs, out_tuple = _run(func, inputs, "jacobian")
    jac = jacobian_arrays(list(outs), list(xs))
    if strict:
        _check_strict(outs, xs, "jacobian")
    rows = tuple(
        tuple(_engine._new(a.reshape(tuple(o.shape) + tuple(x.shape))) for a, x in zip(r, xs))
        for r, o in zip(jac, outs))
    rows = tuple(r if in_tuple else r[0] for r in rows)
    return rows if out_tuple else rows[0]


def _vector(v: Any, like: tuple, what: str, fn: str) -> tuple:
    if v is None:
        if len(like) != 1 or like[0].numel() != 1:
            raise RuntimeError(f"{fn}: v can be omitted only when the {what} is a single "
                               f"one-element tensor; pass v shaped like the {what}")
        return (_engine._new(_engine._xp(like[0]._data).ones_like(like[0]._data)),)
    vs, _ = _as_tuple(v, "v", fn)
    if len(vs) != len(like) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(vs, like)):
        raise RuntimeError(f"{fn}: v must match the {what} in number and shapes: got "
                           f"{[tuple(a.shape) for a in vs]}, expected "
                           f"{[tuple(b.shape) for b in like]}")
    return vs


def vjp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """``(func(inputs), v^T J)``: the vector-Jacobian product, one backward pass.

    Example:
        >>> import mpitensor as mt
        >>> vjp(lambda x: x * 3, mt.ones(2), mt.tensor([1.0, 2.0]))[1]
        tensor([3., 6.])
    """
    _refuse_create_graph(create_graph, "vjp")
    xs, in_tuple, outs, out_tuple = _run(func, inputs, "vjp")
    vs = _vector(v, outs, "output", "vjp")
    diff = [(o, g) for o, g in zip(outs, vs) if o._requires_grad]
    if strict:
        _check_strict(outs, xs, "vjp")
    if diff:
        gs = grad([o for o, _ in diff], list(xs), [g for _, g in diff], materialize_grads=True)
    else:
        gs = tuple(_engine._new(_engine._xp(x._data).zeros_like(x._data)) for x in xs)
    out = tuple(o.detach() for o in outs)
    return (out if out_tuple else out[0]), (gs if in_tuple else gs[0])


def jvp(func: Callable, inputs: Any, v: Any = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """``(func(inputs), J v)``: the Jacobian-vector product, through the full Jacobian.

    Example:
        >>> import mpitensor as mt
        >>> jvp(lambda x: x * x, mt.tensor([1.0, 2.0]), mt.tensor([1.0, 1.0]))[1]
        tensor([2., 4.])
    """
    _refuse_create_graph(create_graph, "jvp")
    xs, _, outs, out_tuple = _run(func, inputs, "jvp")
    vs = _vector(v, xs, "input", "jvp")
    jac = jacobian_arrays(list(outs), list(xs))
    if strict:
        _check_strict(outs, xs, "jvp")
    res = []
    for o, rows in zip(outs, jac):
        acc = None
        for a, vi in zip(rows, vs):
            part = a @ vi._data.reshape(-1).astype(a.dtype, copy=False)
            acc = part if acc is None else acc + part
        res.append(_engine._new(acc.reshape(o.shape)))
    out = tuple(o.detach() for o in outs)
    return (out if out_tuple else out[0]), (tuple(res) if out_tuple else res[0])


def _no_double_backward(name: str) -> None:
    raise NotImplementedError(
        f"torch.autograd.functional.{name} needs gradients of gradients (double backward), "
        f"which mpitensor's autograd does not have: its backward formulas work on arrays; "
        f"jacobian, vjp and jvp are available"
    )


def hvp(func: Callable, inputs: Any, v: Optional[Any] = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """Hessian-vector product: not available (needs double backward).

    Raises:
        NotImplementedError: always.
    """
    _no_double_backward("hvp")
    return ()


def vhp(func: Callable, inputs: Any, v: Optional[Any] = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """Vector-Hessian product: not available (needs double backward).

    Raises:
        NotImplementedError: always.
    """
    _no_double_backward("vhp")
    return ()


def hessian(func: Callable, inputs: Any, create_graph: bool = False, strict: bool = False,
            vectorize: bool = False, outer_jacobian_strategy: str = "reverse-mode") -> Any:
    """The Hessian: not available (needs double backward).

    Raises:
        NotImplementedError: always.
    """
    _no_double_backward("hessian")
