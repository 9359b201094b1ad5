"""``mpitensor.cpu``: torch.cpu's device questions for the CPU, and ``mpitensor.cpu.amp``.

Example:
    >>> import mpitensor as torch
    >>> torch.cpu.is_available(), torch.cpu.device_count()
    (True, 1)
"""

from __future__ import annotations

from . import amp

__all__ = ["amp", "is_available", "device_count", "current_device", "synchronize"]


def is_available() -> bool:
    """Return True: the CPU is always there."""
    return True


def device_count() -> int:
    """Return 1: the CPU counts as one device."""
    return 1


def current_device() -> str:
    """Return ``"cpu"``."""
    return "cpu"


def synchronize(device: object = None) -> None:
    """Return at once: CPU ops have finished when they return."""
