"""torch.distributions: discrete_more (being filled in)."""

from __future__ import annotations

__all__: list = []
