"""``torch.nn.attention``: choosing the kernels of
:func:`~mpitensor.nn.functional.scaled_dot_product_attention`.

mpitensor has one attention kernel, the plain (MATH) one, on CPU and GPU alike.
:func:`sdpa_kernel` restricts the backends as torch's does; a restriction that leaves MATH
out makes ``scaled_dot_product_attention`` raise RuntimeError (there is no fused kernel to
fall back on) rather than run something the program ruled out. No flash-attention
implementations can be registered here: :func:`register_flash_attention_impl` and
:func:`activate_flash_attention_impl` raise NotImplementedError.

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn.functional as F
    >>> q = mt.randn(1, 2, 3, 4)
    >>> with sdpa_kernel(SDPBackend.MATH):
    ...     F.scaled_dot_product_attention(q, q, q).shape
    mpitensor.Size([1, 2, 3, 4])
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional

from mpitensor.nn._functional.attention import SDPBackend, _allowed_backends, _set_allowed_backends

__all__ = ["SDPBackend", "sdpa_kernel", "WARN_FOR_UNFUSED_KERNELS",
           "register_flash_attention_impl", "activate_flash_attention_impl",
           "list_flash_attention_impls", "current_flash_attention_impl",
           "restore_flash_attention_impl"]

#: torch warns about unfused kernels when this is True; mpitensor's only kernel is unfused
WARN_FOR_UNFUSED_KERNELS = False


def _backend(b: Any) -> SDPBackend:
    if isinstance(b, SDPBackend):
        return b
    if isinstance(b, str):
        name = b.upper()
        aliases = {"FLASH": "FLASH_ATTENTION", "EFFICIENT": "EFFICIENT_ATTENTION",
                   "CUDNN": "CUDNN_ATTENTION"}
        name = aliases.get(name, name)
        if name in SDPBackend.__members__:
            return SDPBackend[name]
    raise ValueError(f"sdpa_kernel(): {b!r} is not an SDPBackend (or a backend name like "
                     f"'math')")


@contextlib.contextmanager
def sdpa_kernel(backends: Any, set_priority: bool = False) -> Iterator[None]:
    """Within the block, let ``scaled_dot_product_attention`` use only ``backends`` (one
    :class:`SDPBackend`, its name, or a list of them); the previous choice returns after.

    Args:
        backends: the allowed backends.
        set_priority: accepted for torch's signature (with one kernel there is no order).

    Raises:
        ValueError: an unknown backend.
    """
    chosen = [backends] if isinstance(backends, (SDPBackend, str)) else list(backends)
    allowed = frozenset(_backend(b) for b in chosen)
    previous = _allowed_backends()
    _set_allowed_backends(allowed)
    try:
        yield
    finally:
        _set_allowed_backends(previous)


def register_flash_attention_impl(impl: str, *, register_fn: Any) -> None:
    """Not available: mpitensor has no flash-attention kernels to swap."""
    raise NotImplementedError("mpitensor has no flash-attention kernels: "
                              "scaled_dot_product_attention always runs its MATH kernel")


def activate_flash_attention_impl(impl: str) -> None:
    """Not available: mpitensor has no flash-attention kernels to swap."""
    raise NotImplementedError(f"cannot activate flash-attention implementation {impl!r}: "
                              f"mpitensor has none (it always runs its MATH kernel)")


def list_flash_attention_impls() -> List[str]:
    """The registered flash-attention implementations: none here."""
    return []


def current_flash_attention_impl() -> Optional[str]:
    """The active flash-attention implementation: None (the default kernels) here."""
    return None


def restore_flash_attention_impl() -> None:
    """Go back to the default kernels (which mpitensor never leaves)."""
