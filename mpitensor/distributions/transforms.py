"""torch.distributions: transforms (being filled in)."""

from __future__ import annotations

__all__: list = []
