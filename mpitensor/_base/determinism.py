"""The deterministic-algorithms switch (``torch.use_deterministic_algorithms``) and the one
check the ops make against it.

On the CPU every op here is deterministic: NumPy's loops and reductions run in a fixed order,
and the work :mod:`mpitensor._base.parallel` shares out between threads writes disjoint parts
of its output (no part adds into another's), so the split never changes a result. On a GPU,
CuPy's scatter-adds (``cupyx.scatter_add``, ``add.at``) and weighted ``bincount`` add with
atomics, whose order, and so whose float rounding, changes from run to run. With the switch
on, the ops that have another way to the same sums take it (:func:`add_at` adds on the host
in a fixed order, as torch takes a sorting kernel), and the ones that have none call
:func:`alert`, which raises ``RuntimeError`` naming the op (or warns, with ``warn_only``).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np

__all__: list = []  # private: mpitensor.use_deterministic_algorithms is the public face


class _State:
    """The switch: off, on (raise) or on with warnings only; process-wide, as torch's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enabled = False
        self.warn_only = False


state = _State()


def set_mode(enabled: bool, warn_only: bool) -> None:
    """Turn the switch on or off (``warn_only``: an op without a deterministic way warns)."""
    with state.lock:
        state.enabled, state.warn_only = bool(enabled), bool(enabled) and bool(warn_only)


def nondeterministic_on(array: Any) -> bool:
    """Whether an atomic scatter-add into ``array`` can give a different rounding on each run:
    True for device (CuPy) arrays, False for NumPy's, whose ``add.at`` runs in index order."""
    return not isinstance(array, np.ndarray) and hasattr(array, "device")


def in_force_on(array: Any) -> bool:
    """Whether the switch is on and ``array`` is one whose atomic adds are unordered."""
    return state.enabled and nondeterministic_on(array)


def decision(op: str, array: Any) -> str:
    """What an op without a deterministic implementation on ``array``'s device does now:
    ``"run"``, ``"warn"`` or ``"raise"``."""
    if not state.enabled or not nondeterministic_on(array):
        return "run"
    return "warn" if state.warn_only else "raise"


def alert(op: str, array: Any = None, always: bool = False) -> None:
    """Raise (or warn, with ``warn_only``) when the switch is on and ``op`` on ``array`` has no
    deterministic implementation here (``always``: on every device, as torch's ``put_``)."""
    if not state.enabled or not (always or nondeterministic_on(array)):
        return
    what = "warn" if state.warn_only else "raise"
    text = (f"{op} has no deterministic implementation here, and "
            f"use_deterministic_algorithms({'True, warn_only=True' if state.warn_only else 'True'})"
            f" is in force")
    if what == "warn":
        warnings.warn(text, UserWarning, stacklevel=3)
        return
    raise RuntimeError(f"{text}: turn it off around this call, or pass warn_only=True to "
                       f"accept a result that may differ between runs")


def add_at(target: Any, key: Any, values: Any) -> bool:
    """``target[key] += values`` (repeats added up) in a fixed order when the switch is on
    and ``target`` is a device array: copied to the host, added there with ``numpy.add.at``
    and copied back. Returns False (nothing done) when the caller's own way is deterministic
    already or the switch is off."""
    if not in_force_on(target):
        return False
    import cupy  # noqa: PLC0415 - only device arrays reach here

    def host(k: Any) -> Any:
        return cupy.asnumpy(k) if isinstance(k, cupy.ndarray) else k

    key_h = tuple(host(k) for k in key) if isinstance(key, tuple) else host(key)
    out = cupy.asnumpy(target)
    np.add.at(out, key_h, host(values))
    target[...] = cupy.asarray(out)
    return True
