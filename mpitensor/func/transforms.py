"""``torch.func``'s differentiation transforms, on mpitensor's reverse-mode autograd:
``grad``, ``grad_and_value``, ``vjp``, ``jacrev``, ``jacfwd`` (``hessian`` is refused).

Each transform runs ``func`` on detached copies of the chosen arguments that require grad and
differentiates with :func:`mpitensor.autograd.grad`; ``jacrev`` and ``jacfwd`` build the full
Jacobian row by row (one backward pass per output element), so both are exact. A transform
nested inside another differentiation transform would need gradients of gradients, which
mpitensor does not have: it raises ``NotImplementedError`` instead of returning zeros.
``vmap`` of a transform (``vmap(grad(f))``, per-sample gradients) works: vmap is a loop.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Tuple, Union

from mpitensor import autograd as _autograd
from mpitensor.autograd.functional import jacobian_arrays
from mpitensor.tensor import Tensor, _new

from ._pytree import flatten, tree_map, unflatten

__all__ = ["grad", "grad_and_value", "vjp", "jacrev", "jacfwd", "hessian"]

_active = threading.local()  # .depth: differentiation transforms now running in this thread


class _Level:
    """Marks a differentiation transform as running; refuses one nested in another."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        if getattr(_active, "depth", 0):
            raise NotImplementedError(
                f"torch.func.{self.name} inside another differentiation transform (grad, vjp, "
                f"jacrev, jacfwd) needs gradients of gradients, which mpitensor's autograd does "
                f"not have; differentiate once (vmap of a transform works)")
        _active.depth = 1

    def __exit__(self, *exc: Any) -> None:
        _active.depth = 0


def _argnums(argnums: Union[int, Tuple[int, ...]], n: int, name: str) -> Tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums or not all(isinstance(a, int) for a in nums):
        raise ValueError(f"{name}: argnums must be an int or a non-empty tuple of ints, got "
                         f"{argnums!r}")
    out = []
    for a in nums:
        if not -n <= a < n:
            raise ValueError(f"{name}: argnums={a} is out of range for {n} positional "
                             f"arguments")
        out.append(a % n)
    return tuple(out)


def _prepare(args: tuple, nums: Tuple[int, ...], name: str) -> Tuple[list, List[Tensor], list]:
    """(args with the differentiated ones replaced by fresh leaves, those leaves, per argnum
    the pytree spec of its leaves)."""
    new_args = list(args)
    xs: List[Tensor] = []
    specs = []
    for a in nums:
        leaves, spec = flatten(args[a])
        fresh = []
        for x in leaves:
            if not isinstance(x, Tensor) or not x.is_floating_point():
                raise TypeError(f"{name}: argument {a} must hold floating-point tensors only "
                                f"(got a {type(x).__name__}"
                                f"{'' if not isinstance(x, Tensor) else ' of ' + str(x.dtype)})")
            fresh.append(x.detach().requires_grad_(True))
        xs.extend(fresh)
        specs.append((spec, len(fresh)))
        new_args[a] = unflatten(fresh, spec)
    return new_args, xs, specs


def _regroup(grads: tuple, specs: list, single: bool) -> Any:
    out, at = [], 0
    for spec, n in specs:
        out.append(unflatten(list(grads[at:at + n]), spec))
        at += n
    return out[0] if single else tuple(out)


def _split_aux(out: Any, has_aux: bool, name: str) -> Tuple[Any, Any]:
    if not has_aux:
        return out, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise RuntimeError(f"{name}(has_aux=True): the function must return a pair "
                           f"(output, aux)")
    aux = tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, out[1])
    return out[0], aux


def _grads(outs: list, xs: list, cotangents: list) -> tuple:
    """Gradients of ``outs`` (seeded with ``cotangents``) w.r.t. ``xs``; zeros where unused."""
    pairs = [(o, c) for o, c in zip(outs, cotangents) if o.requires_grad]
    if not pairs:
        return tuple(_new(x._data * 0) for x in xs)
    return _autograd.grad([o for o, _ in pairs], xs, [c for _, c in pairs], retain_graph=True,
                          materialize_grads=True)


def grad_and_value(func: Callable, argnums: Union[int, Tuple[int, ...]] = 0,
                   has_aux: bool = False) -> Callable:
    """``func`` transformed to return ``(gradient, value)`` (``(gradient, (value, aux))`` with
    ``has_aux``); the gradient is w.r.t. the arguments at ``argnums``, shaped like them.

    Example:
        >>> import mpitensor as mt
        >>> grad_and_value(lambda x: (x * x).sum())(mt.tensor([1.0, 2.0]))
        (tensor([2., 4.]), tensor(5.))
    """
    @functools.wraps(func)
    def transformed(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums(argnums, len(args), "grad")
        with _Level("grad"):
            new_args, xs, specs = _prepare(args, nums, "grad")
            with _autograd.enable_grad():
                out, aux = _split_aux(func(*new_args, **kwargs), has_aux, "grad")
            if not isinstance(out, Tensor) or out.numel() != 1:
                got = f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out)
                raise RuntimeError(f"grad: the function must return a one-element tensor (the "
                                   f"value to differentiate), got {got}")
            gs = _grads([out], xs, [_new(out._data * 0 + 1)])
        g = _regroup(gs, specs, isinstance(argnums, int))
        value = out.detach()
        return (g, (value, aux)) if has_aux else (g, value)

    return transformed


def grad(func: Callable, argnums: Union[int, Tuple[int, ...]] = 0,
         has_aux: bool = False) -> Callable:
    """``func`` (returning a one-element tensor) transformed to return its gradient w.r.t. the
    arguments at ``argnums`` (each a tensor or a container of tensors: dicts of parameters
    work); with ``has_aux``, ``func`` returns ``(value, aux)`` and the result is
    ``(gradient, aux)``.

    Example:
        >>> import mpitensor as mt
        >>> grad(lambda x: (x ** 3).sum())(mt.tensor([1.0, 2.0]))
        tensor([ 3., 12.])
    """
    inner = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def transformed(*args: Any, **kwargs: Any) -> Any:
        g, value = inner(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return transformed


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """``(func(*primals), vjp_fn)``, ``vjp_fn(cotangents)`` giving one gradient per primal
    (a tuple); with ``has_aux``, ``(output, vjp_fn, aux)``. ``vjp_fn`` can be called again.

    Example:
        >>> import mpitensor as mt
        >>> out, fn = vjp(lambda x: x * 3, mt.ones(2))
        >>> fn(mt.tensor([1.0, 2.0]))
        (tensor([3., 6.]),)
    """
    nums = tuple(range(len(primals)))
    with _Level("vjp"):
        new_args, xs, specs = _prepare(primals, nums, "vjp")
        with _autograd.enable_grad():
            out, aux = _split_aux(func(*new_args), has_aux, "vjp")
    outs, out_spec = flatten(out)

    def vjp_fn(cotangents: Any) -> tuple:
        cts, ct_spec = flatten(cotangents)
        if ct_spec != out_spec:
            raise RuntimeError("vjp_fn: the cotangents must have the structure of the "
                               "function's output")
        with _Level("vjp"):
            gs = _grads(outs, xs, cts)
        return _regroup(gs, specs, False)

    detached = tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, out)
    return (detached, vjp_fn, aux) if has_aux else (detached, vjp_fn)


def jacrev(func: Callable, argnums: Union[int, Tuple[int, ...]] = 0, *, has_aux: bool = False,
           chunk_size: Any = None, _preallocate_and_copy: bool = False) -> Callable:
    """``func`` transformed to return its Jacobian w.r.t. the arguments at ``argnums``: per
    output, a tensor of shape ``output.shape + input.shape`` per input (built row by row in
    reverse mode; ``chunk_size`` changes nothing).

    Example:
        >>> import mpitensor as mt
        >>> jacrev(lambda x: x * x)(mt.tensor([1.0, 2.0]))
        tensor([[2., 0.],
                [0., 4.]])
    """
    return _jacobian_transform(func, argnums, has_aux, "jacrev")


def jacfwd(func: Callable, argnums: Union[int, Tuple[int, ...]] = 0, has_aux: bool = False, *,
           randomness: str = "error") -> Callable:
    """``func``'s Jacobian as :func:`jacrev` computes it (mpitensor has no forward mode; the
    values are the same, exact).

    Example:
        >>> import mpitensor as mt
        >>> jacfwd(lambda x: x.sin())(mt.zeros(2))
        tensor([[1., 0.],
                [0., 1.]])
    """
    if randomness not in ("error", "different", "same"):
        raise ValueError(f"randomness must be 'error', 'different' or 'same', got "
                         f"{randomness!r}")
    return _jacobian_transform(func, argnums, has_aux, "jacfwd")


def _jacobian_transform(func: Callable, argnums: Any, has_aux: bool, name: str) -> Callable:
    @functools.wraps(func)
    def transformed(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums(argnums, len(args), name)
        with _Level(name):
            new_args, xs, specs = _prepare(args, nums, name)
            with _autograd.enable_grad():
                out, aux = _split_aux(func(*new_args, **kwargs), has_aux, name)
            outs, out_spec = flatten(out)
            if not all(isinstance(o, Tensor) for o in outs):
                raise RuntimeError(f"{name}: the function must return tensors")
            jac = jacobian_arrays(outs, xs)
        per_out = []
        for o, rows in zip(outs, jac):
            blocks = tuple(_new(a.reshape(tuple(o.shape) + tuple(x.shape)))
                           for a, x in zip(rows, xs))
            per_out.append(_regroup(blocks, specs, isinstance(argnums, int)))
        result = unflatten(per_out, out_spec)
        return (result, aux) if has_aux else result

    return transformed


def hessian(func: Callable, argnums: Union[int, Tuple[int, ...]] = 0) -> Callable:
    """Not available: the Hessian needs gradients of gradients (double backward).

    Raises:
        NotImplementedError: always.
    """
    raise NotImplementedError(
        "torch.func.hessian needs gradients of gradients (double backward), which mpitensor's "
        "autograd does not have; jacrev/jacfwd give first-order Jacobians"
    )
