"""Anomaly detection (``torch.autograd.detect_anomaly``): a backward that produces NaN fails.

While anomaly mode is on, the engine looks at every gradient a node returns; the first one
holding a NaN raises ``RuntimeError`` naming the node (``SqrtBackward returned nan values in
its 0th output``) and showing where the forward pass created that node. Recording those
forward stacks is the mode's cost: :class:`ArrayFunction` and :class:`Function` get a recording
``apply`` only while the mode is on, so with the mode off the forward pass runs the plain
``apply`` and the engine reads one flag per backward pass.

Example:
    >>> import mpitensor as mt
    >>> x = mt.zeros(1, requires_grad=True)
    >>> with set_detect_anomaly(True):
    ...     try:
    ...         (mt.sqrt(x) * 0).sum().backward()
    ...     except RuntimeError as e:
    ...         print(str(e).split(";")[0])
    SqrtBackward returned nan values in its 0th output (anomaly mode)
"""

from __future__ import annotations

import functools
import sys
import traceback
import types
import warnings
from typing import Any, Callable

from .function import ArrayFunction, Function

# enabled: whether the mode is on; check_nan: whether the engine looks for NaN
_state = types.SimpleNamespace(enabled=False, check_nan=True)
_PLAIN = {ArrayFunction: ArrayFunction.__dict__["apply"], Function: Function.__dict__["apply"]}

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled"]


def is_anomaly_enabled() -> bool:
    """Whether anomaly mode is on."""
    return _state.enabled


def is_anomaly_check_nan_enabled() -> bool:
    """Whether anomaly mode looks for NaN in the gradients of backward."""
    return _state.enabled and _state.check_nan


def _recording(plain: classmethod) -> classmethod:
    """``plain`` (an ``apply`` classmethod) that also notes the forward stack on the new node."""
    run = plain.__func__

    @functools.wraps(run)
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        out = run(cls, *args, **kwargs)
        for t in out if isinstance(out, tuple) else (out,):
            node = getattr(t, "grad_fn", None)
            if node is not None and "forward_stack" not in node.__dict__:
                # source lines are read only if the stack is ever printed
                stack = traceback.StackSummary.extract(
                    traceback.walk_stack(sys._getframe(1)), lookup_lines=False)
                stack.reverse()
                node.forward_stack = stack
        return out

    return classmethod(apply)


def _switch(enabled: bool, check_nan: bool) -> None:
    _state.enabled, _state.check_nan = bool(enabled), bool(check_nan)
    for cls, plain in _PLAIN.items():
        cls.apply = _recording(plain) if _state.enabled else plain


def check_node(node: Any, grads: tuple) -> None:
    """Raise if one of ``node``'s gradients holds a NaN (called by the engine in anomaly mode)."""
    if not _state.check_nan:
        return
    for i, g in enumerate(grads):
        if g is None or not hasattr(g, "dtype") or g.dtype.kind not in "fc":
            continue
        if bool((g != g).any()):
            stack = getattr(node, "forward_stack", None)
            where = ("the forward call that created it:\n" + "".join(traceback.format_list(stack))
                     if stack else "no forward stack was recorded for it (the node was made "
                     "before anomaly mode was turned on, or by an in-place op)")
            raise RuntimeError(
                f"{node.name()} returned nan values in its {i}th output (anomaly mode); "
                f"{where}\nlook there for an operation whose derivative is undefined at its "
                f"input (sqrt or log at 0, 0/0, ...)"
            )


class set_detect_anomaly:  # noqa: N801 - torch's name
    """Turn anomaly mode on or off: as a call, or as a context manager that restores it after.

    Args:
        mode: on (True) or off (False).
        check_nan: whether backward fails on a NaN gradient while the mode is on.

    Example:
        >>> with set_detect_anomaly(True):
        ...     is_anomaly_enabled()
        True
    """

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self.prev = (_state.enabled, _state.check_nan)
        _switch(mode, check_nan)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        _switch(*self.prev)


class detect_anomaly:  # noqa: N801 - torch's name
    """A context manager (or decorator) that turns anomaly mode on inside it.

    Args:
        check_nan: whether backward fails on a NaN gradient.

    Example:
        >>> with detect_anomaly():
        ...     is_anomaly_enabled()
        True
    """

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        self.prev: list = []

    def __enter__(self) -> None:
        warnings.warn("anomaly detection is on: every operation records its forward stack and "
                      "every backward gradient is scanned for NaN; use it to debug only",
                      stacklevel=2)
        self.prev.append((_state.enabled, _state.check_nan))
        _switch(True, self.check_nan)

    def __exit__(self, *exc: Any) -> None:
        _switch(*self.prev.pop())

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.__class__(self.check_nan):
                return fn(*args, **kwargs)

        return wrapped
