"""``torch.utils.checkpoint``: activation checkpointing, memory for time.

``checkpoint(fn, *args)`` runs ``fn`` without keeping what its backward would need; backward
runs ``fn`` again (with grad mode on, the random numbers it drew the first time and the
autocast state it ran under) and differentiates that second run. A network checkpointed block
by block holds one block's activations at a time instead of all of them.

Both of torch's variants, by their observable behaviour:

- ``use_reentrant=True`` (torch's default when the argument is omitted, with a warning): the
  output requires grad only when a tensor *argument* does; keyword arguments are refused.
- ``use_reentrant=False``: the output requires grad whenever grad mode is on (parameters
  captured by ``fn`` get their gradients even when no argument requires grad), and ``fn``
  takes keyword arguments and a ``context_fn``.

Each checkpoint is one :class:`~mpitensor.autograd.Function` node; its backward runs a
backward of its own over the recomputed graph, which accumulates the parameters' gradients
directly (their hooks run then, DDP's included: tests/mpi/test_checkpoint_ddp.py).

Random numbers: the CPU generator's state at the call is restored for the recomputation, so
dropout draws the same masks. A GPU (CuPy) generator's state cannot be copied, so a
checkpointed ``fn`` draws its GPU numbers from a generator seeded for that call (forward and
recomputation draw the same ones; the GPU stream outside continues as if ``fn`` drew none).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, ContextManager, Iterator, List, Sequence, Tuple

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import random as _random
from mpitensor.amp.autocast_mode import autocast, get_autocast_dtype, is_autocast_enabled
from mpitensor.tensor import Tensor

__all__ = ["checkpoint", "checkpoint_sequential", "noop_context_fn", "CheckpointError",
           "detach_variable"]


class CheckpointError(RuntimeError):
    """A checkpointed function whose recomputation does not match its first run."""


def noop_context_fn() -> Tuple[ContextManager, ContextManager]:
    """The default ``context_fn``: no context around either run."""
    return contextlib.nullcontext(), contextlib.nullcontext()


def detach_variable(inputs: Sequence[Any]) -> Tuple[Any, ...]:
    """Each tensor of ``inputs`` detached, keeping its ``requires_grad``; the rest as they are."""
    out = []
    for x in inputs:
        if isinstance(x, Tensor):
            d = x.detach()
            d.requires_grad_(x.requires_grad)
            x = d
        out.append(x)
    return tuple(out)


@contextlib.contextmanager
def _rng_as(cpu_state: Any, gpu_seed: int) -> Iterator[None]:
    """Run a block with the CPU generator at ``cpu_state`` and GPU generators freshly seeded
    from ``gpu_seed``; put every generator back as it was afterwards."""
    g = _random.default_generator
    saved = g.get_state(), g._cuda, g._cuda_seed
    g.set_state(cpu_state)
    g._cuda, g._cuda_seed = {}, gpu_seed
    try:
        yield
    finally:
        g.set_state(saved[0])
        g._cuda, g._cuda_seed = saved[1], saved[2]


@contextlib.contextmanager
def _gpu_seeded(gpu_seed: int) -> Iterator[None]:
    """The first run: the CPU generator runs on as usual; GPU draws come from a generator
    seeded from ``gpu_seed`` (replayable), the callers' GPU generators untouched."""
    g = _random.default_generator
    saved = g._cuda, g._cuda_seed
    g._cuda, g._cuda_seed = {}, gpu_seed
    try:
        yield
    finally:
        g._cuda, g._cuda_seed = saved


def _autocast_state() -> List[Tuple[str, bool, Any]]:
    return [(d, is_autocast_enabled(d), get_autocast_dtype(d)) for d in ("cpu", "cuda")
            if is_autocast_enabled(d)]


class _Recompute(_autograd.Function):
    """One checkpointed call: forward runs ``fn`` keeping only its arguments; backward runs
    it again with grad on and differentiates that run."""

    @staticmethod
    def forward(ctx: Any, fn: Callable, preserve: bool, recompute_ctx: Callable,
                anchor: Any, *args: Any) -> Any:
        ctx.fn, ctx.preserve, ctx.recompute_ctx = fn, preserve, recompute_ctx
        ctx.set_materialize_grads(False)
        ctx.where = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.others = [None if isinstance(a, Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.where))
        ctx.autocast = _autocast_state()
        g = _random.default_generator
        ctx.cpu_state = g.get_state() if preserve else None
        ctx.gpu_seed = (g._seed + next(_random._forks) * 0x9E3779B97F4A7C15) & (2 ** 64 - 1)
        with _gpu_seeded(ctx.gpu_seed) if preserve else contextlib.nullcontext():
            return fn(*args)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        args = list(ctx.others)
        for i, t in zip(ctx.where, detach_variable(ctx.saved_tensors)):
            args[i] = t
        rng = _rng_as(ctx.cpu_state, ctx.gpu_seed) if ctx.preserve else contextlib.nullcontext()
        with rng, contextlib.ExitStack() as stack:
            for dev, enabled, dtype in ctx.autocast:
                stack.enter_context(autocast(dev, enabled=enabled, dtype=dtype))
            stack.enter_context(ctx.recompute_ctx())
            with _autograd.enable_grad():
                outs = ctx.fn(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if len(outs) != len(grads):
            raise CheckpointError(f"checkpoint: the recomputation returned {len(outs)} outputs "
                                  f"where the first run returned {len(grads)}")
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if isinstance(o, Tensor) and o.requires_grad and g is not None]
        if pairs:
            _autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, None, None) + tuple(
            a.grad if isinstance(a, Tensor) else None for a in args)


def checkpoint(function: Callable, *args: Any, use_reentrant: Any = None,
               context_fn: Callable[[], Tuple[ContextManager, ContextManager]] = noop_context_fn,
               determinism_check: str = "default", debug: bool = False,
               early_stop: bool = True, **kwargs: Any) -> Any:
    """Run ``function(*args, **kwargs)`` keeping none of its activations; recompute them in
    backward.

    Args:
        function: the block (a module or any callable of tensors).
        use_reentrant: True or False (see the module's notes); omitted means True, with a
            warning, as in torch.
        context_fn: (``use_reentrant=False`` only) a callable giving two context managers,
            one around the first run and one around the recomputation.
        preserve_rng_state: (keyword) replay the random numbers of the first run (default
            True).
        determinism_check, debug, early_stop: accepted as torch takes them; the
            recomputation's output count is always checked.

    Raises:
        ValueError: keyword arguments or a ``context_fn`` with ``use_reentrant=True``.

    Example:
        >>> import mpitensor as torch
        >>> from mpitensor.utils.checkpoint import checkpoint
        >>> block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> x = torch.randn(2, 4, requires_grad=True)
        >>> checkpoint(block, x, use_reentrant=False).sum().backward()
    """
    preserve = bool(kwargs.pop("preserve_rng_state", True))
    use_reentrant = _variant(use_reentrant)
    if use_reentrant:
        if kwargs:
            raise ValueError(f"checkpoint: keyword arguments {sorted(kwargs)} need "
                             "use_reentrant=False")
        if context_fn is not noop_context_fn:
            raise ValueError("checkpoint: context_fn needs use_reentrant=False")
        if _autograd.is_grad_enabled() and not any(
                isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn("checkpoint: none of the inputs requires grad, so with "
                          "use_reentrant=True the output will not either (the block's "
                          "parameters get no gradient); use use_reentrant=False",
                          UserWarning, stacklevel=2)
        return _Recompute.apply(function, preserve, contextlib.nullcontext, None, *args)
    first, again = context_fn()
    fn = function if not kwargs else (lambda *a: function(*a, **kwargs))
    if not _autograd.is_grad_enabled():
        with first:
            return fn(*args)
    anchor = _anchor()
    with first:
        return _Recompute.apply(fn, preserve, lambda: again, anchor, *args)


def _variant(use_reentrant: Any) -> bool:
    """``use_reentrant`` as given, or True with a warning when omitted (torch 2.13's rule);
    the warning points at the caller's call of checkpoint or checkpoint_sequential."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint: pass use_reentrant explicitly (False is the "
                      "recommended variant); without it the reentrant variant runs, as in "
                      "torch 2.13", UserWarning, stacklevel=3)
        return True
    return bool(use_reentrant)


def _anchor() -> Tensor:
    """An empty leaf that requires grad: it makes the checkpoint's node record (and its
    output require grad) whenever grad mode is on, as torch's non-reentrant variant does."""
    return Tensor(np.empty(0, np.float32)).requires_grad_(True)


def checkpoint_sequential(functions: Any, segments: int, input: Any,
                          use_reentrant: Any = None, **kwargs: Any) -> Any:
    """Run a sequence of blocks (an ``nn.Sequential`` or a list) in ``segments`` checkpointed
    runs; the last segment runs normally, as in torch.

    Raises:
        ValueError: ``segments`` not a positive int.
    """
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError(f"checkpoint_sequential: unexpected keyword arguments {sorted(kwargs)}")
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"checkpoint_sequential: segments must be a positive int, got "
                         f"{segments!r}")
    use_reentrant = _variant(use_reentrant)
    fns = list(functions.children()) if hasattr(functions, "children") else list(functions)
    size = len(fns) // segments

    def run(start: int, end: int) -> Callable[[Any], Any]:
        def forward(x: Any) -> Any:
            for f in fns[start:end + 1]:
                x = f(x)
            return x
        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return run(end + 1, len(fns) - 1)(input)
