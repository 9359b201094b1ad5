"""The compiled CPU loops (``mpitensor._cpu_kernels``), where they were built and
``MPITENSOR_NATIVE`` allows them: the one place that loads them."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Optional

from mpitensor._base import config as _config

__all__: list = []  # private module


def module() -> Optional[ModuleType]:
    """``mpitensor._cpu_kernels``, or None (not built, or ``MPITENSOR_NATIVE=0``)."""
    if not _config.NATIVE:
        return None
    try:
        import mpitensor._cpu_kernels as kernels  # noqa: PLC0415 - built, or absent
    except ImportError:
        return None
    return kernels


def function(name: str) -> Optional[Any]:
    """The compiled function ``name``, or None where :func:`module` is None or (an older
    build) lacks it."""
    kernels = module()
    return None if kernels is None else getattr(kernels, name, None)
