"""NumPy's spellings of torch's dimension arguments: ``axis`` for ``dim``, ``keepdims`` for
``keepdim``.

torch's native functions and Tensor methods take both (``x.sum(axis=1, keepdims=True)``,
``torch.cat(ts, axis=0)``, ``x.argmax(axis=1)``); programs written NumPy-first, d2l's among
them, use the NumPy words. :func:`install` wraps every Tensor method and top-level function
whose signature names ``dim`` or ``keepdim`` (and not the NumPy word already) so that the
keyword is renamed before the call. ``torch.nn.functional`` is left alone, as torch leaves
it: ``F.softmax(x, axis=1)`` is a TypeError there too.

The wrapper costs one dictionary test per call when no keyword is given.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, Dict, MutableMapping

__all__ = ["install"]

_RENAMES = (("axis", "dim"), ("keepdims", "keepdim"))


def _argument_names(fn: types.FunctionType) -> tuple:
    code = fn.__code__
    return code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def _wants_alias(fn: Any) -> bool:
    if not isinstance(fn, types.FunctionType) or getattr(fn, "_numpy_names", False):
        return False
    names = _argument_names(fn)
    return any(torch_word in names and numpy_word not in names
               for numpy_word, torch_word in _RENAMES)


def _renamed(fn: Callable, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    kwargs = dict(kwargs)
    for numpy_word, torch_word in _RENAMES:
        if numpy_word in kwargs:
            if torch_word in kwargs:
                raise TypeError(f"{fn.__name__}() got both {torch_word!r} and its NumPy "
                                f"spelling {numpy_word!r}")
            kwargs[torch_word] = kwargs.pop(numpy_word)
    return kwargs


def _alias(fn: types.FunctionType) -> Callable:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs and ("axis" in kwargs or "keepdims" in kwargs):
            kwargs = _renamed(fn, kwargs)
        return fn(*args, **kwargs)

    call._numpy_names = True  # type: ignore[attr-defined]
    return call


def install(tensor_class: type, namespace: MutableMapping[str, Any]) -> None:
    """Wrap the qualifying methods of ``tensor_class`` and functions of ``namespace`` (a
    module's globals) in place. Idempotent."""
    for name, value in list(vars(tensor_class).items()):
        if not name.startswith("__") and _wants_alias(value):
            setattr(tensor_class, name, _alias(value))
    for name, value in list(namespace.items()):
        if not name.startswith("_") and _wants_alias(value):
            wrapped = _alias(value)
            # pickle (fx's GraphModule saves its targets by name) finds it where it is served
            wrapped.__module__, wrapped.__qualname__ = namespace["__name__"], name
            namespace[name] = wrapped
