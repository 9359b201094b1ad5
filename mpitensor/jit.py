"""``mpitensor.jit`` (``torch.jit``): there is no compiler here, so scripting and tracing return
what they are given, and a program that uses them only for speed runs unchanged.

``script``, ``trace``, ``trace_module``, ``freeze``, ``optimize_for_inference`` and the
decorators ``ignore``, ``unused``, ``export``, ``interface`` return their argument;
``is_scripting()`` and ``is_tracing()`` are False; ``annotate(type, value)`` is ``value``.
Saving and loading TorchScript archives (``jit.save``, ``jit.load``) cannot be done without a
TorchScript compiler: they raise :class:`NotImplementedError` saying so, never write or read a
file that torch could not use.

Example:
    >>> import mpitensor as torch
    >>> model = torch.nn.Linear(2, 2)
    >>> torch.jit.script(model) is model
    True
"""

from __future__ import annotations

from typing import Any, Callable, Final, Optional  # noqa: F401 - Final: torch.jit.Final

__all__ = ["script", "trace", "trace_module", "freeze", "optimize_for_inference", "ignore",
           "unused", "export", "interface", "is_scripting", "is_tracing", "annotate", "save",
           "load", "Final", "ScriptModule", "ScriptFunction", "fork", "wait"]


def script(obj: Any, optimize: Any = None, _frames_up: int = 0, _rcb: Any = None,
           example_inputs: Any = None) -> Any:
    """Return ``obj`` itself (a module, a function or a class): nothing is compiled."""
    return obj


def trace(func: Any, example_inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
    """Return ``func`` itself: nothing is traced, and ``example_inputs`` are not run."""
    return func


def trace_module(mod: Any, inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
    """Return ``mod`` itself."""
    return mod


def freeze(mod: Any, preserved_attrs: Optional[list] = None, optimize_numerics: bool = True
           ) -> Any:
    """Return ``mod`` itself."""
    return mod


def optimize_for_inference(mod: Any, other_methods: Optional[list] = None) -> Any:
    """Return ``mod`` itself."""
    return mod


def _decorator(fn: Any = None, **_: Any) -> Any:
    # usable bare (@ignore) and called (@ignore(drop=True))
    if fn is None or not callable(fn):
        return lambda f: f
    return fn


ignore = unused = export = interface = _decorator


def is_scripting() -> bool:
    """False: code here always runs as Python."""
    return False


def is_tracing() -> bool:
    """False: nothing is traced here."""
    return False


def annotate(the_type: Any, the_value: Any) -> Any:
    """Return ``the_value`` (the type is for TorchScript's compiler only)."""
    return the_value


class _Future:
    def __init__(self, value: Any) -> None:
        self._value = value

    def wait(self) -> Any:
        return self._value


def fork(func: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run ``func(*args, **kwargs)`` now; return a future whose ``wait()`` gives the result
    (``jit.fork`` runs tasks in parallel only inside TorchScript)."""
    return _Future(func(*args, **kwargs))


def wait(future: Any) -> Any:
    """The value of a :func:`fork` future."""
    return future.wait()


def save(m: Any, f: Any, _extra_files: Any = None) -> None:
    """Raise NotImplementedError: a TorchScript archive needs torch's compiler."""
    raise NotImplementedError(
        "torch.jit.save writes a TorchScript archive, which needs torch's compiler; mpitensor "
        "has none. Save the weights instead: torch.save(model.state_dict(), path)")


def load(f: Any, map_location: Any = None, _extra_files: Any = None) -> Any:
    """Raise NotImplementedError: a TorchScript archive needs torch's runtime."""
    raise NotImplementedError(
        "torch.jit.load reads a TorchScript archive, which needs torch's runtime; mpitensor "
        "cannot run one. Load a state dict saved with torch.save instead")


class ScriptModule:
    """Never instantiated here (nothing is scripted); present for ``isinstance`` checks, which
    are False for every module."""


class ScriptFunction:
    """Never instantiated here; present for ``isinstance`` checks."""
