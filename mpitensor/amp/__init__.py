"""``mpitensor.amp``: automatic mixed precision, with ``torch.amp``'s names.

``autocast`` runs the listed ops of a region in a lower precision (bfloat16 on the CPU by
default, float16 on CUDA); ``GradScaler`` scales the loss so that small float16 gradients do
not flush to zero, and skips the steps whose gradients overflowed. See ``docs/amp.md``.

Example:
    >>> import mpitensor as torch
    >>> torch.amp.autocast is torch.autocast
    True
"""

from __future__ import annotations

from .autocast_mode import autocast, custom_bwd, custom_fwd, is_autocast_available
from .grad_scaler import GradScaler

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available", "GradScaler"]
