"""What the iterable and the map-style ``Shuffler`` share: the on/off switch and the seed of
the next epoch's order."""

from __future__ import annotations

import random
from typing import Any, Optional


class ShuffleSwitch:
    """Mixin: ``set_shuffle``, ``set_seed`` and ``_seed_rng`` (seeds ``self._rng`` for an
    epoch from the fixed seed, or from mpitensor's global generator)."""

    def _init_switch(self) -> None:
        self._enabled = True
        self._seed: Optional[int] = None
        self._rng = random.Random()

    def set_shuffle(self, shuffle: bool = True) -> Any:
        """Turn shuffling on or off; returns self."""
        self._enabled = bool(shuffle)
        return self

    def set_seed(self, seed: int) -> Any:
        """Fix the seed of the next epoch's order; returns self."""
        self._seed = seed
        return self

    def _seed_rng(self) -> None:
        if self._seed is None:
            from mpitensor.tensor import randint  # noqa: PLC0415 - the global generator

            self._seed = int(randint(0, 2 ** 62, ()).item())
        self._rng.seed(self._seed)
        self._seed = None
