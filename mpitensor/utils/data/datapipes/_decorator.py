"""Decorators of DataPipe classes: the functional registry (:func:`functional_datapipe`),
determinism (:func:`non_deterministic`, :class:`guaranteed_datapipes_determinism`) and type
checks (:func:`argument_validation`, :func:`runtime_validation`,
:class:`runtime_validation_disabled`)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, get_type_hints

from .datapipe import IterDataPipe, MapDataPipe

__all__ = ["argument_validation", "functional_datapipe", "guaranteed_datapipes_determinism",
           "non_deterministic", "runtime_validation", "runtime_validation_disabled"]


class functional_datapipe:  # noqa: N801 - torch's name
    """Register a DataPipe class as a method of its kind: after ``@functional_datapipe("name")``
    on ``class P(IterDataPipe)``, ``dp.name(*args)`` is ``P(dp, *args)``.

    Example:
        >>> from mpitensor.utils.data import IterDataPipe, functional_datapipe
        >>> @functional_datapipe("times_ten")
        ... class TimesTen(IterDataPipe):
        ...     def __init__(self, dp): self.dp = dp
        ...     def __iter__(self): return (x * 10 for x in self.dp)
        >>> from mpitensor.utils.data.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([1, 2]).times_ten())
        [10, 20]
    """

    def __init__(self, name: str, enable_df_api_tracing: bool = False) -> None:
        self.name = name
        self.enable_df_api_tracing = enable_df_api_tracing

    def __call__(self, cls: Any) -> Any:
        if isinstance(cls, type) and issubclass(cls, IterDataPipe):
            IterDataPipe.register_datapipe_as_function(self.name, cls,
                                                       self.enable_df_api_tracing)
        elif isinstance(cls, type) and issubclass(cls, MapDataPipe):
            MapDataPipe.register_datapipe_as_function(self.name, cls)
        elif isinstance(cls, non_deterministic) and issubclass(cls.cls, IterDataPipe):
            IterDataPipe.register_datapipe_as_function(self.name, cls,
                                                       self.enable_df_api_tracing)
        else:
            raise TypeError(f"functional_datapipe({self.name!r}) decorates a subclass of "
                            f"IterDataPipe or MapDataPipe, got {cls!r}")
        return cls


class _Switch:
    """A module-wide flag set on construction (as torch's switches are) and restored when the
    ``with`` block ends."""

    _flag = ""
    _value = True

    def __init__(self) -> None:
        self.prev = _flags[self._flag]
        _flags[self._flag] = self._value

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        _flags[self._flag] = self.prev


_flags = {"determinism": False, "runtime_validation": True}


class guaranteed_datapipes_determinism(_Switch):  # noqa: N801 - torch's name
    """While active (a ``with`` block), making a DataPipe marked :func:`non_deterministic`
    raises ``TypeError``."""

    _flag = "determinism"


class non_deterministic:  # noqa: N801 - torch's name
    """Mark a DataPipe class as non-deterministic: always (``@non_deterministic`` on the
    class), or for the arguments where ``fn(*args, **kwargs)`` is true
    (``@non_deterministic(fn)``). Under :class:`guaranteed_datapipes_determinism`, making
    such a pipe raises ``TypeError``.

    Raises:
        TypeError: decorating something that is neither an IterDataPipe class nor a function.
    """

    cls: Any = None
    deterministic_fn: Any = None

    def __init__(self, arg: Any) -> None:
        if isinstance(arg, type):
            if not issubclass(arg, IterDataPipe):
                raise TypeError(f"non_deterministic marks IterDataPipe classes, got "
                                f"{arg.__name__}")
            self.cls = arg
        elif callable(arg):
            self.deterministic_fn = arg
        else:
            raise TypeError(f"non_deterministic takes an IterDataPipe class or a function, "
                            f"got {arg!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.cls is not None:  # making an instance of the always non-deterministic class
            if _flags["determinism"]:
                raise TypeError(f"{self.cls.__name__} is non-deterministic, and "
                                f"guaranteed_datapipes_determinism is set; leave it out of "
                                f"the pipeline or make the block allow non-determinism")
            return self.cls(*args, **kwargs)
        cls = args[0] if len(args) == 1 and not kwargs else None
        if not (isinstance(cls, type) and issubclass(cls, IterDataPipe)):
            raise TypeError(f"non_deterministic(fn) decorates an IterDataPipe class, got "
                            f"{cls!r}")
        self.cls = cls
        return self._checked

    def _checked(self, *args: Any, **kwargs: Any) -> Any:
        res = self.deterministic_fn(*args, **kwargs)
        if not isinstance(res, bool):
            raise TypeError(f"the function given to non_deterministic must return a bool, "
                            f"got {type(res).__name__}")
        if _flags["determinism"] and res:
            raise TypeError(f"{self.cls.__name__} is non-deterministic with these arguments, "
                            f"and guaranteed_datapipes_determinism is set")
        return self.cls(*args, **kwargs)


def _pipe_hint(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, (IterDataPipe, MapDataPipe))


def argument_validation(f: Callable) -> Callable:
    """Check the arguments whose hints are DataPipe types (``dp: IterDataPipe[int]``): each
    must be such a DataPipe, of an element type that is a subtype of the hint's.

    Raises (from the decorated function):
        TypeError: an argument that is not that kind of DataPipe, or of another element type.
    """
    signature = inspect.signature(f)
    hints = get_type_hints(f)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            if not _pipe_hint(hint):
                continue
            kind = IterDataPipe if issubclass(hint, IterDataPipe) else MapDataPipe
            if not isinstance(value, kind):
                raise TypeError(f"Expected argument '{name}' to be an {kind.__name__}, got "
                                f"{type(value).__name__}")
            if not value.type.issubtype(hint.type):
                raise TypeError(f"Expected argument '{name}' to have an element type that is "
                                f"a subtype of {hint.type}, got {value.type}")
        return f(*args, **kwargs)

    return wrapper


class runtime_validation_disabled(_Switch):  # noqa: N801 - torch's name
    """While active (a ``with`` block), :func:`runtime_validation` lets every item through."""

    _flag = "runtime_validation"
    _value = False


def runtime_validation(f: Callable) -> Callable:
    """Decorate a DataPipe's ``__iter__``: each item it yields must be of the pipe's element
    type (``class P(IterDataPipe[int])``), else ``RuntimeError`` at that item.

    Raises:
        TypeError: decorating a function other than ``__iter__``.
    """
    if f.__name__ != "__iter__":
        raise TypeError(f"runtime_validation decorates __iter__, not {f.__name__}")

    @functools.wraps(f)
    def wrapper(self: Any) -> Any:
        if not _flags["runtime_validation"]:
            yield from f(self)
            return
        for item in f(self):
            if not self.type.issubtype_of_instance(item):
                raise RuntimeError(f"Expected an item of type {self.type}, got {item!r} "
                                   f"({type(item).__name__})")
            yield item

    return wrapper
