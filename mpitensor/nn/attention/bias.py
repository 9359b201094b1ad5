"""``torch.nn.attention.bias``: causal masks described rather than stored.

A :class:`CausalBias` given to :func:`~mpitensor.nn.functional.scaled_dot_product_attention`
as ``attn_mask`` stands for the boolean mask of its variant: upper-left (query i sees keys
0..i) or lower-right (the diagonal ends at the last key, query i sees keys
0..i + kv_len - q_len).

Example:
    >>> causal_lower_right(2, 3)._materialize().tolist()
    [[True, True, False], [True, True, True]]
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np

from mpitensor.tensor import Tensor

__all__ = ["CausalVariant", "CausalBias", "causal_upper_left", "causal_lower_right"]


class CausalVariant(IntEnum):
    """Where a causal mask's diagonal starts."""

    UPPER_LEFT = 1
    LOWER_RIGHT = 2


class CausalBias:
    """A causal attention mask of ``(seq_len_q, seq_len_kv)`` in one of two variants.

    Raises:
        ValueError: a variant that is not a :class:`CausalVariant`.
    """

    def __init__(self, variant: CausalVariant, seq_len_q: int, seq_len_kv: int) -> None:
        if not isinstance(variant, CausalVariant):
            raise ValueError(f"CausalBias: variant must be a CausalVariant, got {variant!r}")
        self.variant = variant
        self.seq_len_q = int(seq_len_q)
        self.seq_len_kv = int(seq_len_kv)

    def _materialize(self, device: Any = None) -> Tensor:
        """The boolean mask (True: may attend)."""
        shift = 0 if self.variant == CausalVariant.UPPER_LEFT else \
            self.seq_len_kv - self.seq_len_q
        mask = np.tril(np.ones((self.seq_len_q, self.seq_len_kv), dtype=bool), shift)
        out = Tensor(mask)
        return out if device is None else out.to(device)

    def __repr__(self) -> str:
        return repr(self._materialize())


def _sizes(size: tuple, fname: str) -> tuple:
    if len(size) != 2:
        raise ValueError(f"{fname}(): give the query and key/value lengths, got {size!r}")
    return size


def causal_upper_left(*size: int) -> CausalBias:
    """A :class:`CausalBias` whose diagonal starts at the top-left corner."""
    return CausalBias(CausalVariant.UPPER_LEFT, *_sizes(size, "causal_upper_left"))


def causal_lower_right(*size: int) -> CausalBias:
    """A :class:`CausalBias` whose diagonal ends at the bottom-right corner."""
    return CausalBias(CausalVariant.LOWER_RIGHT, *_sizes(size, "causal_lower_right"))
