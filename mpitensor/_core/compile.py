"""``mpitensor.compile`` (``torch.compile``): there is no compiler here, so it returns the model
or function it is given (or, called without one, a decorator that does), and a program that
compiles only for speed runs unchanged. The arguments torch documents are accepted and checked
for their type where a typo would otherwise pass unnoticed (``mode``, ``backend``).

Example:
    >>> import mpitensor as torch
    >>> model = torch.nn.Linear(2, 2)
    >>> torch.compile(model) is model
    True
"""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["compile"]

_MODES = (None, "default", "lite", "reduce-overhead", "max-autotune",
          "max-autotune-no-cudagraphs")


def compile(model: Optional[Callable] = None, *, fullgraph: bool = False,  # noqa: A001
            dynamic: Optional[bool] = None, backend: Any = "inductor",
            mode: Optional[str] = None, options: Optional[dict] = None,
            disable: bool = False) -> Any:
    """Return ``model`` unchanged (nothing is compiled here); without ``model``, a decorator.

    Raises:
        RuntimeError: ``mode`` and ``options`` both given, or an unknown ``mode``, as torch.
        AssertionError: ``model`` is not callable (torch's class for it).
    """
    if mode is not None and options is not None:
        raise RuntimeError("compile(): give either mode or options, not both")
    if mode not in _MODES:
        raise RuntimeError(f"compile(): unknown mode {mode!r}; torch's modes are "
                         f"{[m for m in _MODES if m]}")
    if model is None:
        return lambda fn: fn
    if not callable(model):
        raise AssertionError(f"compile(): model must be a Module or a function, got "
                             f"{type(model).__name__}")
    return model
