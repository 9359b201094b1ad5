"""Neural-network building blocks with PyTorch's names: modules, layers, losses, functional ops.

Example:
    >>> import mpitensor.nn as nn
    >>> layer = nn.Linear(4, 2)
    >>> [name for name, _ in layer.named_parameters()]
    ['weight', 'bias']
"""

from __future__ import annotations

from . import attention, common_types, functional, grad, init, parallel, utils
from .modules._factory import factory_kwargs
from .modules.activation import *  # noqa: F403
from .modules.activation import __all__ as _activation_names
from .modules.adaptive import *  # noqa: F403
from .modules.adaptive import __all__ as _adaptive_names
from .modules.container import *  # noqa: F403
from .modules.container import __all__ as _container_names
from .modules.conv import *  # noqa: F403
from .modules.conv import __all__ as _conv_names
from .modules.distance import *  # noqa: F403
from .modules.distance import __all__ as _distance_names
from .modules.dropout import *  # noqa: F403
from .modules.dropout import __all__ as _dropout_names
from .modules.layers import *  # noqa: F403
from .modules.layers import __all__ as _layer_names
from .modules.lazy import *  # noqa: F403
from .modules.lazy import __all__ as _lazy_names
from .modules.linear import *  # noqa: F403
from .modules.linear import __all__ as _linear_names
from .modules.loss import *  # noqa: F403
from .modules.loss import __all__ as _loss_names
from .modules.module import Module
from .modules.module import RemovableHandle
from .modules.normalization import *  # noqa: F403
from .modules.normalization import __all__ as _norm_names
from .modules.padding import *  # noqa: F403
from .modules.padding import __all__ as _padding_names
from .parallel import DataParallel
from .parameter import Buffer, Parameter, UninitializedBuffer, UninitializedParameter
from .modules.pooling import *  # noqa: F403
from .modules.pooling import __all__ as _pooling_names
from .modules.rms_norm import *  # noqa: F403
from .modules.rms_norm import __all__ as _rms_norm_names
from .modules.rnn import *  # noqa: F403
from .modules.rnn import __all__ as _rnn_names
from .modules.shape import *  # noqa: F403
from .modules.shape import __all__ as _shape_names
from .modules.sparse import *  # noqa: F403
from .modules.sparse import __all__ as _sparse_names
from .modules.transformer import *  # noqa: F403
from .modules.transformer import __all__ as _transformer_names

__all__ = ["Module", "Parameter", "RemovableHandle", "functional", "init", "parallel", "utils",
           "attention", "common_types", "grad", "factory_kwargs",
           "DataParallel", "Buffer", "UninitializedParameter", "UninitializedBuffer",
           *_lazy_names, *_container_names, *_adaptive_names,
           *_layer_names, *_norm_names, *_activation_names,
           *_distance_names, *_loss_names, *_sparse_names, *_dropout_names,
           *_linear_names, *_padding_names, *_pooling_names, *_shape_names,
           *_rms_norm_names, *_rnn_names, *_transformer_names, *_conv_names]

from . import modules  # noqa: E402,F401 - torch's nn.modules paths, once every layer is defined
