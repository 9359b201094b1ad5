"""Neural-network building blocks with PyTorch's names: modules, layers, losses, functional ops.

Example:
    >>> import mpitensor.nn as nn
    >>> layer = nn.Linear(4, 2)
    >>> [name for name, _ in layer.named_parameters()]
    ['weight', 'bias']
"""

from __future__ import annotations

from . import attention, common_types, functional, grad, init, parallel, utils
from ._factory import factory_kwargs
from .activation import *  # noqa: F403
from .activation import __all__ as _activation_names
from .adaptive import *  # noqa: F403
from .adaptive import __all__ as _adaptive_names
from .container import *  # noqa: F403
from .container import __all__ as _container_names
from .conv import *  # noqa: F403
from .conv import __all__ as _conv_names
from .distance import *  # noqa: F403
from .distance import __all__ as _distance_names
from .dropout import *  # noqa: F403
from .dropout import __all__ as _dropout_names
from .layers import *  # noqa: F403
from .layers import __all__ as _layer_names
from .lazy import *  # noqa: F403
from .lazy import __all__ as _lazy_names
from .linear import *  # noqa: F403
from .linear import __all__ as _linear_names
from .loss import *  # noqa: F403
from .loss import __all__ as _loss_names
from .module import Module, RemovableHandle
from .normalization import *  # noqa: F403
from .normalization import __all__ as _norm_names
from .padding import *  # noqa: F403
from .padding import __all__ as _padding_names
from .parallel import DataParallel
from .parameter import Buffer, Parameter, UninitializedBuffer, UninitializedParameter
from .pooling import *  # noqa: F403
from .pooling import __all__ as _pooling_names
from .rms_norm import *  # noqa: F403
from .rms_norm import __all__ as _rms_norm_names
from .rnn import *  # noqa: F403
from .rnn import __all__ as _rnn_names
from .shape import *  # noqa: F403
from .shape import __all__ as _shape_names
from .sparse import *  # noqa: F403
from .sparse import __all__ as _sparse_names
from .transformer import *  # noqa: F403
from .transformer import __all__ as _transformer_names

__all__ = ["Module", "Parameter", "RemovableHandle", "functional", "init", "parallel", "utils",
           "attention", "common_types", "grad", "factory_kwargs",
           "DataParallel", "Buffer", "UninitializedParameter", "UninitializedBuffer",
           *_lazy_names, *_container_names, *_adaptive_names,
           *_layer_names, *_norm_names, *_activation_names,
           *_distance_names, *_loss_names, *_sparse_names, *_dropout_names,
           *_linear_names, *_padding_names, *_pooling_names, *_shape_names,
           *_rms_norm_names, *_rnn_names, *_transformer_names, *_conv_names]

from . import modules  # noqa: E402,F401 - torch's nn.modules paths, once every layer is defined
