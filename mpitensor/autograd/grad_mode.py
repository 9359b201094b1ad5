"""Grad mode: whether operations on tensors that require grad are recorded (per thread).

``no_grad``, ``enable_grad``, ``inference_mode`` and ``set_grad_enabled`` switch it, as context
managers or decorators; ``grad_enabled_for`` is the question every op asks before recording.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional


class _GradMode(threading.local):
    enabled = True
    inference = False  # inside inference_mode() (torch.is_inference_mode_enabled)
    callbacks: Optional[list] = None  # set while a backward pass runs (queue_callback)


_mode = _GradMode()


def is_grad_enabled() -> bool:
    """Return True when operations on tensors that require grad are being recorded."""
    return _mode.enabled


class set_grad_enabled:  # noqa: N801 - torch's name
    """Turn gradient recording on or off; usable as a call, a context manager or a decorator.

    Args:
        mode: True to record operations, False not to.

    Example:
        >>> with set_grad_enabled(False):
        ...     pass
    """

    def __init__(self, mode: bool) -> None:
        self.prev = _mode.enabled
        self.mode = bool(mode)
        _mode.enabled = self.mode

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        _mode.enabled = self.prev

    def __call__(self, fn: Callable) -> Callable:
        _mode.enabled = self.prev  # decorating must not change the mode now
        return _with_mode(fn, self.mode)


def _with_mode(fn: Callable, mode: bool) -> Callable:
    """``fn`` wrapped to run with grad mode ``mode`` (the decorator form of the contexts)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with set_grad_enabled(mode):
            return fn(*args, **kwargs)

    return wrapper


class _ModeContext:
    """Base of ``no_grad``/``enable_grad``: a context manager that is also a decorator."""

    _mode_value = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # ``@no_grad`` / ``@inference_mode`` without parentheses decorate the function itself
        if len(args) == 1 and not kwargs and callable(args[0]):
            return cls()(args[0])
        return super().__new__(cls)

    def __enter__(self) -> None:
        self.prev = _mode.enabled
        _mode.enabled = self._mode_value

    def __exit__(self, *exc: Any) -> None:
        _mode.enabled = self.prev

    def __call__(self, fn: Callable) -> Callable:
        return _with_mode(fn, self._mode_value)


class no_grad(_ModeContext):  # noqa: N801 - torch's name
    """Context manager (and decorator) that stops recording operations for autograd.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.ones(2, requires_grad=True)
        >>> with mt.no_grad():
        ...     w -= 0.1          # an in-place update of a leaf, as optimisers do
        >>> (w * 2).requires_grad
        True
    """

    _mode_value = False


class enable_grad(_ModeContext):  # noqa: N801 - torch's name
    """Context manager (and decorator) that turns recording back on inside ``no_grad``."""

    _mode_value = True


class inference_mode(_ModeContext):  # noqa: N801 - torch's name
    """Like :class:`no_grad` (this implementation has no separate inference tensors)."""

    _mode_value = False

    def __init__(self, mode: bool = True) -> None:
        self._mode_value = not mode
        self._inference = bool(mode)

    def __enter__(self) -> None:
        super().__enter__()
        self.prev_inference = _mode.inference
        _mode.inference = self._inference

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _mode.inference = self.prev_inference

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(self._inference):
                return fn(*args, **kwargs)

        return wrapper


def grad_enabled_for(*tensors: Any) -> bool:
    """True when an op on these tensors would be recorded (grad mode on and one requires grad)."""
    if not _mode.enabled:
        return False
    return any(getattr(t, "_requires_grad", False) for t in tensors)
