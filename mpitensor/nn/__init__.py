"""Neural-network building blocks with PyTorch's names: modules, layers, losses, functional ops.

Example:
    >>> import mpitensor.nn as nn
    >>> layer = nn.Linear(4, 2)
    >>> [name for name, _ in layer.named_parameters()]
    ['weight', 'bias']
"""

from __future__ import annotations

from . import functional, init, parallel, utils
from .layers import *  # noqa: F403
from .layers import __all__ as _layer_names
from .module import Module, RemovableHandle
from .normalization import *  # noqa: F403
from .normalization import __all__ as _norm_names
from .parallel import DataParallel
from .parameter import Parameter

__all__ = ["Module", "Parameter", "RemovableHandle", "functional", "init", "parallel", "utils",
           "DataParallel",
           *_layer_names, *_norm_names]
