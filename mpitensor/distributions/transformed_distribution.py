"""torch.distributions: transformed_distribution (being filled in)."""

from __future__ import annotations

__all__: list = []
