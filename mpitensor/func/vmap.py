"""``torch.func.vmap``, as a loop: ``func`` runs once per batch element and the outputs are
stacked.

The results equal a vectorized vmap's (each element goes through the same ops as it would
alone), and everything composes: ``vmap(grad(f))`` gives per-sample gradients, ``vmap`` of a
``vmap`` maps two dimensions, and the stacking is recorded by autograd. What a loop does not
give is speed: the cost is that of ``B`` separate calls (``chunk_size`` changes nothing).

``randomness`` is checked on the default generator's CPU state: ``"error"`` raises when an
element's call drew random numbers, ``"same"`` restores the state before each element so every
element draws the same numbers, ``"different"`` lets the state run on.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional

from mpitensor._ops import random as _random
from mpitensor.tensor import Tensor, stack

from ._pytree import broadcast_prefix, flatten, unflatten

__all__ = ["vmap"]

_RANDOMNESS = ("error", "different", "same")


def vmap(func: Callable, in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error", *,
         chunk_size: Optional[int] = None) -> Callable:
    """Map ``func`` over a dimension of its inputs: run it per element, stack the outputs.

    Args:
        func: takes the (unbatched) arguments, returns a tensor or a container of tensors.
        in_dims: per positional argument, the dimension to map over (None: not mapped, the
            same argument every time); an int or None for all, or a tuple with one entry per
            argument, each an int, None or a container matching that argument.
        out_dims: where the batch dimension goes in each output (None: the output is the same
            for every element and is returned once); an int, or a container matching the
            outputs.
        randomness: ``"error"`` (a random draw inside ``func`` raises), ``"different"`` or
            ``"same"``.
        chunk_size: accepted for torch's signature; the loop runs one element at a time.

    Returns:
        The mapped function; keyword arguments pass through unmapped.

    Example:
        >>> import mpitensor as mt
        >>> vmap(lambda a, b: a @ b)(mt.ones(3, 2), mt.ones(3, 2))
        tensor([2., 2., 2.])
    """
    if randomness not in _RANDOMNESS:
        raise ValueError(f"randomness must be one of {_RANDOMNESS}, got {randomness!r}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")
    if not isinstance(in_dims, (int, tuple, type(None))):
        raise ValueError(f"vmap: in_dims must be an int, None or a tuple, got {in_dims!r}")

    @functools.wraps(func)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        return _run(func, in_dims, out_dims, randomness, args, kwargs)

    return mapped


def _mapped_leaves(in_dims: Any, args: tuple) -> tuple:
    """(flat leaves of args, their spec, each leaf's normalized dim or None, the batch size)."""
    if isinstance(in_dims, tuple) and len(in_dims) != len(args):
        raise ValueError(f"vmap: in_dims has {len(in_dims)} entries for {len(args)} positional "
                         f"arguments; give one per argument")
    leaves, spec = flatten(args)
    dims = broadcast_prefix(in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args),
                            args, "vmap in_dims")
    sizes = set()
    norm: List[Optional[int]] = []
    for i, (x, d) in enumerate(zip(leaves, dims)):
        if d is None:
            norm.append(None)
            continue
        if not isinstance(d, int):
            raise ValueError(f"vmap: in_dims entries must be int or None, got {d!r}")
        if not isinstance(x, Tensor):
            raise ValueError(f"vmap: in_dim={d} for input {i}, which is a "
                             f"{type(x).__name__}, not a tensor; use None for it")
        if not -x.dim() <= d < x.dim():
            raise ValueError(f"vmap: in_dim={d} is out of range for input {i} of shape "
                             f"{tuple(x.shape)}")
        d = d % x.dim()
        norm.append(d)
        sizes.add(int(x.shape[d]))
    if not sizes:
        raise ValueError("vmap: no input is mapped (every in_dim is None, or there is no "
                         "tensor input); map at least one tensor")
    if len(sizes) != 1:
        raise ValueError(f"vmap: the mapped inputs have different sizes {sorted(sizes)} along "
                         f"their in_dims; they must all have the same batch size")
    return leaves, spec, norm, sizes.pop()


def _run(func: Callable, in_dims: Any, out_dims: Any, randomness: str, args: tuple,
         kwargs: dict) -> Any:
    leaves, spec, dims, size = _mapped_leaves(in_dims, args)
    start = _random.get_rng_state()
    results = []
    for b in range(size):
        if randomness == "same":
            _random.set_rng_state(start)
        before = _random.get_rng_state() if randomness == "error" else None
        call = unflatten([x if d is None else x.select(d, b) for x, d in zip(leaves, dims)],
                         spec)
        results.append(func(*call, **kwargs))
        if before is not None and _random.get_rng_state() != before:
            _random.set_rng_state(before)
            raise RuntimeError(
                "vmap: the function drew random numbers under randomness='error' (the "
                "default); pass randomness='different' (independent draws per element) or "
                "'same' (the same draws for every element)"
            )
    return _stack_outputs(results, out_dims)


def _stack_outputs(results: list, out_dims: Any) -> Any:
    flat = [flatten(r) for r in results]
    spec = flat[0][1]
    if any(s != spec for _, s in flat):
        raise ValueError("vmap: the function returned differently structured outputs for "
                         "different batch elements")
    dims = broadcast_prefix(out_dims, results[0], "vmap out_dims")
    out = []
    for i, d in enumerate(dims):
        col = [leaves[i] for leaves, _ in flat]
        if d is None:
            first = col[0]
            if any(not _same(first, c) for c in col[1:]):
                raise ValueError(f"vmap: out_dims is None for output {i}, but it differs "
                                 f"between batch elements; give it an int out_dim")
            out.append(first)
            continue
        if not all(isinstance(c, Tensor) for c in col):
            raise ValueError(f"vmap: output {i} is a {type(col[0]).__name__}; the function "
                             f"must return tensors (or use out_dims=None for it)")
        if not -(col[0].dim() + 1) <= d <= col[0].dim():
            raise ValueError(f"vmap: out_dim={d} is out of range for output {i} of shape "
                             f"{tuple(col[0].shape)}")
        out.append(stack(col, dim=d))
    return unflatten(out, spec)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return tuple(a.shape) == tuple(b.shape) and bool((a == b).all())
    return bool(a == b)
