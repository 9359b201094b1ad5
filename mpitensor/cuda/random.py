"""``torch.cuda.random``: the seeds and states of the random numbers drawn on each GPU.

mpitensor's default generator draws ``"cuda"`` numbers from one CuPy ``RandomState`` per GPU
(made from the global seed on first use). The functions here seed those states and save and
restore them.

A CuPy ``RandomState`` (a cuRAND generator) cannot be copied, so a GPU's state is a seed:
:func:`get_rng_state` starts that GPU's stream afresh from a seed derived from the seed it had
(the same history of seeds gives the same derived seed) and returns it as a picklable dict;
:func:`set_rng_state` starts the stream from that seed again, so the numbers drawn after a
``set_rng_state(state)`` are the ones drawn after the ``get_rng_state()`` that gave ``state``.
Reading the state thus changes the numbers that follow (reproducibly), which torch's does not.

Without a GPU the functions behave as a CPU-only torch's: the seeding calls (``manual_seed``,
``manual_seed_all``, ``seed``, ``seed_all``, ``set_rng_state``, ``set_rng_state_all``) have no
device to act on and return None, as torch queues them for a CUDA start that never comes;
``get_rng_state_all()`` is ``[]``; ``get_rng_state`` and ``initial_seed`` raise
:class:`~mpitensor.cuda.CudaUnavailableError`.

Example:
    >>> import mpitensor as torch
    >>> torch.cuda.manual_seed_all(0)          # safe without a GPU
    >>> states = torch.cuda.get_rng_state_all()  # [] without a GPU
    >>> torch.cuda.set_rng_state_all(states)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from mpitensor import backend as _backend
from mpitensor._core.devices import cuda_index_arg
from mpitensor._ops.random import check_seed, default_generator

from ._common import DeviceArg, _cupy, _resolve

__all__ = ["get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
           "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]

_MASK = 0xFFFF_FFFF_FFFF_FFFF
_made: dict = {}  # GPU number -> (the RandomState made here, its seed)


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a well spread 64-bit seed derived from ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _install(idx: int, seed: int) -> None:
    """Start GPU ``idx``'s stream of the default generator (and CuPy's own) from ``seed``."""
    cp = _backend.get_cupy()
    with cp.cuda.Device(idx):
        rs = cp.random.RandomState(seed)
        cp.random.seed(seed)  # CuPy's own global generator on that GPU
    default_generator._cuda[idx] = rs
    _made[idx] = (rs, seed)


def _seed_of(idx: int) -> int:
    """The seed GPU ``idx``'s stream started from."""
    made = _made.get(idx)
    if made is not None and default_generator._cuda.get(idx) is made[0]:
        return made[1]
    # a state the default generator made itself (or will make): from its seed
    fork = default_generator._cuda_seed
    return default_generator._seed if fork is None else fork


def _gpu(device: DeviceArg, what: str) -> int:
    cp = _cupy(what)  # first, as torch asks for CUDA before reading the argument
    return _resolve(cp, cuda_index_arg(device, what), what)


def _gpus() -> range:
    return range(int(_backend.get_cupy().cuda.runtime.getDeviceCount()))


def manual_seed(seed: int) -> None:
    """Seed the random numbers drawn on the current GPU (no GPU: nothing to seed, as in torch).

    Raises:
        TypeError: ``seed`` is not an int (as ``mpitensor.manual_seed``).

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.manual_seed(0)
    """
    seed = check_seed(seed)
    if _backend.cupy_available():
        _install(_gpu(None, "manual_seed"), seed)


def manual_seed_all(seed: int) -> None:
    """Seed the random numbers drawn on every GPU (no GPU: nothing to seed, as in torch).

    Raises:
        TypeError: ``seed`` is not an int.

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.manual_seed_all(0)
    """
    seed = check_seed(seed)
    if _backend.cupy_available():
        for i in _gpus():
            _install(i, seed)


def seed() -> None:
    """Seed the current GPU's random numbers from OS entropy (no GPU: nothing to seed).

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.seed()
    """
    if _backend.cupy_available():
        _install(_gpu(None, "seed"), int.from_bytes(os.urandom(8), "little") >> 1)


def seed_all() -> None:
    """Seed every GPU's random numbers with one seed from OS entropy (no GPU: nothing to seed).

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.seed_all()
    """
    if _backend.cupy_available():
        s = int.from_bytes(os.urandom(8), "little") >> 1
        for i in _gpus():
            _install(i, s)


def initial_seed() -> int:
    """Return the seed the current GPU's random numbers started from.

    Raises:
        CudaUnavailableError: no GPU can be used (a CPU-only torch raises AssertionError).

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     torch.cuda.manual_seed(5); assert torch.cuda.initial_seed() == 5
    """
    return _seed_of(_gpu(None, "initial_seed"))


def get_rng_state(device: DeviceArg = "cuda") -> dict:
    """Return a GPU's random state as a picklable dict, for :func:`set_rng_state`.

    The GPU's stream starts afresh from the seed in the state (see the module's notes).

    Args:
        device: a GPU number, ``"cuda"``/``"cuda:N"`` or a CUDA device (the current GPU).

    Raises:
        CudaUnavailableError: no GPU can be used.
        ValueError: a CPU device, or a GPU number this process does not see.

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     s = torch.cuda.get_rng_state(); a = torch.rand(3, device="cuda")
        ...     torch.cuda.set_rng_state(s); assert (torch.rand(3, device="cuda") == a).all()
    """
    idx = _gpu(device, "get_rng_state")
    derived = _mix(_seed_of(idx))
    _install(idx, derived)
    return {"kind": "mpitensor.cuda", "seed": derived}


def _check_state(state: Any, what: str) -> int:
    if not isinstance(state, dict) or state.get("kind") != "mpitensor.cuda":
        raise TypeError(f"mpitensor.cuda.{what}() takes a state returned by "
                        f"mpitensor.cuda.get_rng_state(), got {type(state).__name__}")
    return check_seed(state["seed"])


def set_rng_state(new_state: dict, device: DeviceArg = "cuda") -> None:
    """Restore a GPU's random state from :func:`get_rng_state` (no GPU: nothing to restore).

    Raises:
        TypeError: ``new_state`` is not such a state (checked with or without a GPU).
        ValueError: a CPU device, or a GPU number this process does not see.
    """
    s = _check_state(new_state, "set_rng_state")
    if _backend.cupy_available():
        _install(_gpu(device, "set_rng_state"), s)


def get_rng_state_all() -> list:
    """Return every GPU's random state, in GPU order ([] without a GPU, as in torch)."""
    if not _backend.cupy_available():
        return []
    return [get_rng_state(i) for i in _gpus()]


def set_rng_state_all(new_states: Iterable) -> None:
    """Restore each GPU's random state from :func:`get_rng_state_all` (no GPU: nothing to do).

    Raises:
        TypeError: an item is not a state from :func:`get_rng_state`.
    """
    states = [_check_state(s, "set_rng_state_all") for s in new_states]
    if _backend.cupy_available():
        for i, s in enumerate(states):
            _install(i, s)


class _GpuGenerator:
    """GPU ``index``'s share of the default generator, as ``torch.cuda.default_generators[i]``."""

    def __init__(self, index: int) -> None:
        self.device = _backend.device("cuda", index)

    def manual_seed(self, seed: int) -> _GpuGenerator:
        _install(self.device.index, check_seed(seed))
        return self

    def seed(self) -> int:
        s = int.from_bytes(os.urandom(8), "little") >> 1
        _install(self.device.index, s)
        return s

    def initial_seed(self) -> int:
        return _seed_of(self.device.index)

    def get_state(self) -> dict:
        return get_rng_state(self.device.index)

    def set_state(self, new_state: dict) -> _GpuGenerator:
        set_rng_state(new_state, self.device.index)
        return self

    def __repr__(self) -> str:
        return f"<mpitensor.cuda default generator device='{self.device}'>"


def default_generators() -> tuple:
    """One generator view per GPU (``()`` without a GPU), as ``torch.cuda.default_generators``."""
    if not _backend.cupy_available():
        return ()
    return tuple(_GpuGenerator(i) for i in _gpus())
