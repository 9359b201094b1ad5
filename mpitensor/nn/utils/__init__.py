"""``nn.utils``: gradient clipping, flattening parameters to one vector, and packed
variable-length sequences (``nn.utils.rnn``), parametrizations (``parametrize``,
``parametrizations``) and pruning (``prune``), as in torch.

Example:
    >>> import mpitensor as torch
    >>> model = torch.nn.Linear(3, 1)
    >>> model(torch.ones(2, 3)).sum().backward()
    >>> total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
"""

from __future__ import annotations

from . import parametrizations, parametrize, prune, rnn
from .clip_grad import (
    clip_grad_norm,
    clip_grad_norm_,
    clip_grad_value_,
    clip_grads_with_norm_,
    get_total_norm,
)
from .convert_parameters import parameters_to_vector, vector_to_parameters
from .fusion import (
    fuse_conv_bn_eval,
    fuse_conv_bn_weights,
    fuse_linear_bn_eval,
    fuse_linear_bn_weights,
)
from .init import skip_init
from .weight_norm import remove_spectral_norm, remove_weight_norm, spectral_norm, weight_norm

__all__ = ["rnn", "parametrize", "parametrizations", "prune",
           "weight_norm", "remove_weight_norm", "spectral_norm", "remove_spectral_norm",
           "clip_grad_norm", "fuse_conv_bn_eval", "fuse_conv_bn_weights",
           "fuse_linear_bn_eval", "fuse_linear_bn_weights", "skip_init", "clip_grad_norm_",
           "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm",
           "parameters_to_vector", "vector_to_parameters"]
