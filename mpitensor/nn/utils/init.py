"""``torch.nn.utils.skip_init``: build a module without the cost of its initialisation.

Example:
    >>> import mpitensor as mt
    >>> layer = skip_init(mt.nn.Linear, 4, 2)
    >>> tuple(layer.weight.shape)
    (2, 4)
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

__all__ = ["skip_init"]


def skip_init(module_cls: type, *args: Any, **kwargs: Any) -> Any:
    """Instantiate ``module_cls(*args, **kwargs)`` with its parameters and buffers left
    uninitialised: their values are unspecified, as in torch, so fill them before use (from a
    checkpoint, or an ``nn.init`` function). Here they are NaN, so a use before filling shows;
    the module is built as usual first (torch saves that work with its "meta" device, which
    has no counterpart here). The class must take a ``device`` argument, as torch requires.

    Raises:
        RuntimeError: ``module_cls`` takes no ``device`` argument.
    """
    from mpitensor.nn.modules.module import Module  # noqa: PLC0415 - nn's base class

    if not (isinstance(module_cls, type) and issubclass(module_cls, Module)):
        raise RuntimeError(f"skip_init(): expected a Module class, got {module_cls!r}")
    if "device" not in inspect.signature(module_cls).parameters:
        raise RuntimeError(f"skip_init(): {module_cls.__name__} takes no device argument, "
                           f"which skip_init needs (as in torch)")
    module = module_cls(*args, **kwargs)
    for t in (*module.parameters(), *module.buffers()):
        if isinstance(t._data, np.ndarray) and t._data.dtype.kind == "f":
            t._data[...] = np.nan  # unspecified values, made visible if used as they are
    return module
