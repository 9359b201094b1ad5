"""``mpitensor.backends.mps``: Apple GPUs (Metal) are not supported; both answers are False.

Example:
    >>> import mpitensor as torch
    >>> torch.backends.mps.is_available(), torch.backends.mps.is_built()
    (False, False)
"""

from __future__ import annotations

from mpitensor.backends._flags import answer

__all__ = ["is_available", "is_built"]


is_available = answer(__name__, "is_available", False, "mpitensor has no Metal (MPS) device")
is_built = answer(__name__, "is_built", False, "mpitensor is not built with Metal (MPS) support")
