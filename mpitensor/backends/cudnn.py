"""``mpitensor.backends.cudnn``: cuDNN switches, kept for torch programs and otherwise inert.

mpitensor computes convolutions as NumPy/CuPy matrix products and never calls cuDNN, so
:func:`is_available` is False and the flags change nothing; they still take only booleans.

Example:
    >>> import mpitensor as torch
    >>> torch.backends.cudnn.deterministic = True
    >>> torch.backends.cudnn.is_available(), torch.backends.cudnn.version()
    (False, None)
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Optional

from mpitensor.backends._flags import answer, guard

__all__ = ["enabled", "benchmark", "deterministic", "allow_tf32", "is_available", "version",
           "flags"]

_FLAGS = ("enabled", "benchmark", "deterministic", "allow_tf32")

enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


is_available = answer(__name__, "is_available", False, "mpitensor does not use cuDNN")
version: Callable[[], Optional[int]] = answer(__name__, "version", None, "no cuDNN is loaded")


@contextlib.contextmanager
def flags(enabled: bool = False, benchmark: bool = False, deterministic: bool = False,
          allow_tf32: bool = True) -> Iterator[None]:
    """Set the four switches inside a ``with`` block and restore them after it.

    Raises:
        ValueError: a switch is given something other than a bool (also a RuntimeError).

    Example:
        >>> import mpitensor as torch
        >>> with torch.backends.cudnn.flags(enabled=True, deterministic=True):
        ...     pass
    """
    module = sys.modules[__name__]
    saved = {name: getattr(module, name) for name in _FLAGS}
    try:
        for name, value in zip(_FLAGS, (enabled, benchmark, deterministic, allow_tf32)):
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


guard(__name__, _FLAGS)
