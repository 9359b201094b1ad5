"""``torch.signal.windows``: window functions as tensors."""

from __future__ import annotations

__all__: list = []
