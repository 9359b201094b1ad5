"""``mpitensor.backends.mps``: Apple GPUs (Metal) are not supported; both answers are False.

Example:
    >>> import mpitensor as torch
    >>> torch.backends.mps.is_available(), torch.backends.mps.is_built()
    (False, False)
"""

from __future__ import annotations

__all__ = ["is_available", "is_built"]


def is_available() -> bool:
    """Return False: mpitensor has no Metal (MPS) device.

    Example:
        >>> import mpitensor as torch
        >>> torch.backends.mps.is_available()
        False
    """
    return False


def is_built() -> bool:
    """Return False: mpitensor is not built with Metal (MPS) support.

    Example:
        >>> import mpitensor as torch
        >>> torch.backends.mps.is_built()
        False
    """
    return False
