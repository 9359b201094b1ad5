"""Neural-network building blocks with PyTorch's names: modules, layers, losses, functional ops.

Example:
    >>> import mpitensor.nn as nn
    >>> layer = nn.Linear(4, 2)
    >>> [name for name, _ in layer.named_parameters()]
    ['weight', 'bias']
"""

from __future__ import annotations

from . import attention, common_types, functional, grad, init, modules, parallel, utils
from .modules import _PATHS as _families
from .modules import __all__ as _modules_names
from .modules._factory import factory_kwargs
from .modules.module import Module, RemovableHandle
from .parallel import DataParallel
from .parameter import Buffer, Parameter, UninitializedBuffer, UninitializedParameter

#: every layer class, as torch.nn has them (not nn.modules' submodules, nor its utils)
_layer_names = [n for n in _modules_names if n not in _families and n not in ("utils", "Module")]
globals().update({n: getattr(modules, n) for n in _layer_names})

__all__ = ["Module", "Parameter", "RemovableHandle", "functional", "init", "parallel", "utils",
           "attention", "common_types", "grad", "factory_kwargs",
           "DataParallel", "Buffer", "UninitializedParameter", "UninitializedBuffer",
           *_layer_names]
