"""``mpitensor.backends.cuda``: whether CUDA support is present, and torch's inert matmul switches.

Example:
    >>> import mpitensor as torch
    >>> torch.backends.cuda.matmul.allow_tf32 = True  # accepted; mpitensor does not use TF32
"""

from __future__ import annotations

from mpitensor import backend as _backend
from mpitensor.backends._flags import guarded

__all__ = ["is_built", "matmul"]

matmul = guarded(("allow_tf32", "allow_fp16_reduced_precision_reduction",
                  "allow_bf16_reduced_precision_reduction"),
                 f"{__name__}.matmul", allow_tf32=False,
                 allow_fp16_reduced_precision_reduction=True,
                 allow_bf16_reduced_precision_reduction=True)


def is_built() -> bool:
    """Return True when CuPy imports: mpitensor's CUDA support is CuPy (a GPU may still be absent).

    Example:
        >>> import mpitensor as torch
        >>> torch.backends.cuda.is_built()  # False here: no CuPy
        False
    """
    try:
        _backend.get_cupy()
    except RuntimeError:
        return False
    return True
