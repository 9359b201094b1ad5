"""``set_float32_matmul_precision`` / ``get_float32_matmul_precision``, torch's names.

torch lets float32 products run faster at lower internal precision (``"high"``: TF32 or bfloat16
passes on GPUs that have them; ``"medium"``: bfloat16). Here products run through NumPy's BLAS
and CuPy's cuBLAS at full float32 precision whatever is set, which is ``"highest"``: results are
never less precise than asked, and never faster for asking. The setting is kept, so a program
that reads it back sees what it set.

Example:
    >>> import mpitensor as torch
    >>> torch.set_float32_matmul_precision("high")
    >>> torch.get_float32_matmul_precision()
    'high'
    >>> torch.set_float32_matmul_precision("highest")
"""

from __future__ import annotations

__all__ = ["set_float32_matmul_precision", "get_float32_matmul_precision"]

_PRECISIONS = ("highest", "high", "medium")
_state = {"precision": "highest"}


def set_float32_matmul_precision(precision: str) -> None:
    """Record the float32 product precision a program asks for (see the module's note: the
    products stay at full float32 precision).

    Raises:
        ValueError: not one of ``"highest"``, ``"high"``, ``"medium"``.
    """
    if precision not in _PRECISIONS:
        raise ValueError(f"set_float32_matmul_precision(): {precision!r} is not one of "
                         f"{list(_PRECISIONS)}")
    _state["precision"] = precision


def get_float32_matmul_precision() -> str:
    """The precision last set (``"highest"`` until one is)."""
    return _state["precision"]
