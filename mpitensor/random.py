"""``torch.random``: the global generator's seed and state, and :func:`fork_rng`.

The same objects as at the package level (``mpitensor.manual_seed`` is
``mpitensor.random.manual_seed``); the numbers come from NumPy's PCG64 on the CPU and CuPy on a
GPU, so a seed gives the same numbers within mpitensor, not torch's numbers.

Example:
    >>> import mpitensor as mt
    >>> mt.random.manual_seed(3) is mt.random.default_generator
    True
    >>> mt.random.initial_seed()
    3
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any, Optional

from mpitensor._ops.random import (
    Generator,
    default_generator,
    get_rng_state,
    initial_seed,
    manual_seed,
    seed,
    set_rng_state,
)

__all__ = ["Generator", "default_generator", "fork_rng", "get_rng_state", "initial_seed",
           "manual_seed", "seed", "set_rng_state"]

_forks = itertools.count(1)


@contextlib.contextmanager
def fork_rng(devices: Optional[Any] = None, enabled: bool = True, _caller: str = "fork_rng",
             _devices_kw: str = "devices", device_type: Optional[str] = None) -> Iterator[None]:
    """Run a block with the global generator forked: on leaving, it is back in the state it
    had on entering, CPU and GPU, as if the block had drawn nothing.

    Inside, the CPU numbers continue from the entry state (as torch's do); each GPU draws from
    a fresh CuPy state seeded from the global seed and a count of forks (CuPy's states cannot
    be copied), so GPU numbers inside a fork are reproducible for a seed but are not the ones
    the block would have drawn unforked.

    Args:
        devices: accepted as torch takes it (which GPUs to fork); every GPU state is kept.
        enabled: False runs the block without forking.
        device_type: accepted as torch takes it.

    Example:
        >>> import mpitensor as mt
        >>> _ = mt.manual_seed(1); a = mt.rand(2)
        >>> _ = mt.manual_seed(1)
        >>> with fork_rng():
        ...     _ = mt.rand(5)
        >>> bool((mt.rand(2) == a).all())
        True
    """
    if not enabled:
        yield
        return
    g = default_generator
    cpu_state = g.get_state()
    gpu_states = g._cuda
    g._cuda = {}
    g._cuda_seed = (g._seed + next(_forks) * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF
    try:
        yield
    finally:
        g.set_state(cpu_state)
        g._cuda = gpu_states
        g._cuda_seed = None
