"""The neural-network functions torch also has at its top level (``torch.conv2d``,
``torch.layer_norm``, ``torch.dropout``, ...), with torch's top-level signatures, which are
not always those of ``torch.nn.functional`` (``torch.embedding(weight, indices)`` takes its
arguments the other way round, ``torch.dropout(input, p, train)`` has no default for
``train``). ``mpitensor/__init__.py`` exports :data:`__all__`.

Every function here converts its arguments and calls the implementation in
:mod:`mpitensor.nn.functional` (or the recurrent kernels, or :mod:`mpitensor.linalg`); none
holds a kernel of its own. What the top level spells differently:

- losses take ``reduction`` as an int: 0 ``'none'``, 1 ``'mean'``, 2 ``'sum'``; where it may
  be left out, torch's top level (its Python binding, not its schema's ``Mean``) reduces
  nothing: ``torch.kl_div(x, t)`` is elementwise, and so it is here;
- ``grid_sampler`` takes its modes as ints: interpolation 0 bilinear, 1 nearest, 2 bicubic
  (which ``F.grid_sample`` does not implement: NotImplementedError); padding 0 zeros,
  1 border, 2 reflection;
- pooling's ``stride=[]`` (empty) means the kernel size;
- ``cudnn_enabled`` / ``cudnn_enable`` choose a GPU library in torch and change no value:
  they are accepted and have no effect here, where there is no cuDNN;
- ``embedding``'s ``padding_idx`` is -1 (any negative) for none;
- the recurrent functions take flat weight lists, in torch's order per layer and direction:
  ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``, over padded input or torch's packed form; the
  layers run by ``nn.RNNBase``'s own loop, the cells straight on its kernel.

Example:
    >>> import mpitensor as mt
    >>> mt.dropout(mt.ones(2), 0.5, False)
    tensor([1., 1.])
"""

from __future__ import annotations

import numbers
import os
import sys
import warnings
from types import SimpleNamespace
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import linalg as _linalg
from mpitensor._core.opkit import tensor_methods, wrap
from mpitensor.tensor import Tensor

from . import functional as F
from ._functional.dropout import _channel_dropout, _check_p
from ._functional.embedding import _renorm_
from ._functional.recurrent import (
    GATES,
    PackedToPadded,
    PaddedToPacked,
    RecurrentLayer,
    padded_rows,
    split_outputs,
)
from .modules.rnn import RNNBase

__all__ = [
    # convolutions
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "conv_tbc",
    # dropout
    "dropout", "dropout_", "alpha_dropout", "alpha_dropout_", "feature_dropout",
    "feature_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_",
    # normalisation
    "batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm",
    # embeddings
    "embedding", "embedding_bag", "embedding_renorm_",
    # distances, activations, shuffles
    "pairwise_distance", "cosine_similarity", "pdist", "prelu", "selu", "selu_", "celu",
    "celu_", "rrelu", "rrelu_", "threshold", "threshold_", "hardshrink", "relu_",
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
    # pooling
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices", "avg_pool1d",
    "adaptive_avg_pool1d", "adaptive_max_pool1d",
    # bilinear, losses, padding, sampling
    "bilinear", "kl_div", "cosine_embedding_loss", "hinge_embedding_loss",
    "margin_ranking_loss", "triplet_margin_loss", "poisson_nll_loss", "ctc_loss",
    "binary_cross_entropy_with_logits", "constant_pad_nd", "grid_sampler", "grid_sampler_2d",
    "grid_sampler_3d", "affine_grid_generator",
    # recurrent
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "lstm", "gru", "rnn_tanh",
    "rnn_relu",
    # norms
    "norm_except_dim", "frobenius_norm", "nuclear_norm",
]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# the same signature at the top level as in nn.functional: the same function
pairwise_distance = F.pairwise_distance
cosine_similarity = F.cosine_similarity
pdist = F.pdist
prelu = F.prelu
pixel_shuffle = F.pixel_shuffle
pixel_unshuffle = F.pixel_unshuffle
channel_shuffle = F.channel_shuffle
native_channel_shuffle = F.native_channel_shuffle
bilinear = F.bilinear
rms_norm = F.rms_norm
conv_tbc = F.conv_tbc
relu_ = F.relu_
selu_ = F.selu_
celu_ = F.celu_
threshold_ = F.threshold_
hardshrink = F.hardshrink
adaptive_avg_pool1d = F.adaptive_avg_pool1d


# ---------------------------------------------------------------------------- argument kit
def _reduction(reduction: Any, fname: str) -> str:
    """torch's reduction int (0 none, 1 mean, 2 sum) as nn.functional's string."""
    names = ("none", "mean", "sum")
    if isinstance(reduction, bool) or not isinstance(reduction, numbers.Integral) \
            or not 0 <= int(reduction) <= 2:
        raise ValueError(f"{fname}(): reduction is an int at torch's top level: 0 (none), "
                         f"1 (mean) or 2 (sum), got {reduction!r}; the string names belong "
                         f"to torch.nn.functional.{fname}")
    return names[int(reduction)]


def _ints(v: Any) -> Any:
    """A list of ints as a tuple (nn.functional reads tuples); anything else unchanged."""
    return tuple(v) if isinstance(v, list) else v


def _stride(stride: Any) -> Any:
    """Pooling's ``stride``: empty (torch's default ``[]``) or None is the kernel size."""
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        return None
    return _ints(stride)


def _tensor(t: Any, name: str, fname: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{fname}(): argument '{name}' must be a Tensor, got "
                        f"{type(t).__name__}")
    return t


# ---------------------------------------------------------------------------- convolutions
def conv1d(input: Any, weight: Any, bias: Any = None, stride: Any = 1,  # noqa: A002
           padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
    """``torch.conv1d``: as :func:`mpitensor.nn.functional.conv1d`."""
    return F.conv1d(input, weight, bias, _ints(stride), _ints(padding), _ints(dilation),
                    groups)


def conv2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1,  # noqa: A002
           padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
    """``torch.conv2d``: as :func:`mpitensor.nn.functional.conv2d`."""
    return F.conv2d(input, weight, bias, _ints(stride), _ints(padding), _ints(dilation),
                    groups)


def conv3d(input: Any, weight: Any, bias: Any = None, stride: Any = 1,  # noqa: A002
           padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
    """``torch.conv3d``: as :func:`mpitensor.nn.functional.conv3d`."""
    return F.conv3d(input, weight, bias, _ints(stride), _ints(padding), _ints(dilation),
                    groups)


def conv_transpose1d(input: Any, weight: Any, bias: Any = None,  # noqa: A002
                     stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                     groups: int = 1, dilation: Any = 1) -> Tensor:
    """``torch.conv_transpose1d``: as :func:`mpitensor.nn.functional.conv_transpose1d`."""
    return F.conv_transpose1d(input, weight, bias, _ints(stride), _ints(padding),
                              _ints(output_padding), groups, _ints(dilation))


def conv_transpose2d(input: Any, weight: Any, bias: Any = None,  # noqa: A002
                     stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                     groups: int = 1, dilation: Any = 1) -> Tensor:
    """``torch.conv_transpose2d``: as :func:`mpitensor.nn.functional.conv_transpose2d`."""
    return F.conv_transpose2d(input, weight, bias, _ints(stride), _ints(padding),
                              _ints(output_padding), groups, _ints(dilation))


def conv_transpose3d(input: Any, weight: Any, bias: Any = None,  # noqa: A002
                     stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                     groups: int = 1, dilation: Any = 1) -> Tensor:
    """``torch.conv_transpose3d``: as :func:`mpitensor.nn.functional.conv_transpose3d`."""
    return F.conv_transpose3d(input, weight, bias, _ints(stride), _ints(padding),
                              _ints(output_padding), groups, _ints(dilation))


_CONV = {1: (conv1d, conv_transpose1d), 2: (conv2d, conv_transpose2d),
         3: (conv3d, conv_transpose3d)}


def _per_dim(v: Sequence[int], n: int, name: str) -> tuple:
    """A list of one value for every spatial dim, or of one per dim."""
    v = [v] if isinstance(v, numbers.Integral) else list(v)
    if len(v) == 1:
        return tuple(v) * n
    if len(v) != n:
        raise RuntimeError(f"convolution(): expected {name} to have 1 or {n} elements for a "
                           f"{n}-D convolution, got {len(v)}: {v}")
    return tuple(v)


def convolution(input: Any, weight: Any, bias: Any, stride: Sequence[int],  # noqa: A002
                padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                output_padding: Sequence[int], groups: int) -> Tensor:
    """``torch.convolution``: the convolution (``transposed=False``) or transposed convolution
    whose dimension (1-D, 2-D, 3-D) ``weight``'s rank says; each list holds one value per
    spatial dim or one value for all.

    Example:
        >>> import mpitensor as mt
        >>> mt.convolution(mt.ones(1, 1, 4), mt.ones(1, 1, 2), None, [1], [0], [1], False,
        ...                [0], 1)
        tensor([[[2., 2., 2.]]])
    """
    w = _tensor(weight, "weight", "convolution")
    n = w.dim() - 2
    if n not in _CONV:
        raise RuntimeError(f"convolution(): weight must be 3-D, 4-D or 5-D (1, 2 or 3 spatial "
                           f"dims), got a {w.dim()}-D weight of size {tuple(w.shape)}")
    args = [_per_dim(v, n, k) for v, k in ((stride, "stride"), (padding, "padding"),
                                           (dilation, "dilation"))]
    plain, trans = _CONV[n]
    if transposed:
        out_pad = _per_dim(output_padding, n, "output_padding")
        return trans(input, w, bias, args[0], args[1], out_pad, groups, args[2])
    return plain(input, w, bias, args[0], args[1], args[2], groups)


# ---------------------------------------------------------------------------------- dropout
def dropout(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.dropout``: zero each element with probability ``p`` when ``train``."""
    return F.dropout(input, p, train)


def dropout_(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.dropout_``: :func:`dropout` written into ``input``."""
    return F.dropout(input, p, train, inplace=True)


def alpha_dropout(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.alpha_dropout``: as :func:`mpitensor.nn.functional.alpha_dropout`."""
    return F.alpha_dropout(input, p, train)


def alpha_dropout_(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.alpha_dropout_``: :func:`alpha_dropout` written into ``input``."""
    return F.alpha_dropout(input, p, train, inplace=True)


def feature_alpha_dropout(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.feature_alpha_dropout``: alpha dropout of whole channels of (N, C, ...)."""
    return F.feature_alpha_dropout(input, p, train)


def feature_alpha_dropout_(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.feature_alpha_dropout_``: :func:`feature_alpha_dropout` into ``input``."""
    return F.feature_alpha_dropout(input, p, train, inplace=True)


def _feature_dropout(input: Any, p: float, train: bool, inplace: bool,  # noqa: A002
                     fname: str) -> Tensor:
    pv = _check_p(p, fname)
    t = _tensor(input, "input", fname)
    if t.dim() < 2:
        raise RuntimeError(f"{fname}(): feature dropout drops channels of an (N, C, ...) "
                           f"input and needs at least 2 dimensions, got size {tuple(t.shape)}")
    if not train or pv == 0.0 or t.numel() == 0:
        return t
    if not t.is_floating_point():
        raise TypeError(f"{fname}(): the input must be floating point, got {t.dtype}")
    shape = (t.shape[0], t.shape[1]) + (1,) * (t.dim() - 2)
    return _channel_dropout(t, pv, shape, inplace, fname)


def feature_dropout(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.feature_dropout``: zero whole channels (dim 1) of an (N, C, ...) input with
    probability ``p``, scaling the rest by ``1 / (1 - p)``; a 2-D input's channels are its
    elements."""
    return _feature_dropout(input, p, train, False, "feature_dropout")


def feature_dropout_(input: Any, p: float, train: bool) -> Tensor:  # noqa: A002
    """``torch.feature_dropout_``: :func:`feature_dropout` written into ``input``."""
    return _feature_dropout(input, p, train, True, "feature_dropout_")


# ---------------------------------------------------------------------------- normalisation
def batch_norm(input: Any, weight: Any, bias: Any, running_mean: Any,  # noqa: A002
               running_var: Any, training: bool, momentum: float, eps: float,
               cudnn_enabled: bool) -> Tensor:
    """``torch.batch_norm``: :func:`mpitensor.nn.functional.batch_norm` with torch's top-level
    argument order (weight and bias first); ``cudnn_enabled`` has no effect."""
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum,
                        eps)


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None,  # noqa: A002
               bias: Any = None, eps: float = 1e-05, cudnn_enable: bool = True) -> Tensor:
    """``torch.layer_norm``; ``cudnn_enable`` has no effect."""
    return F.layer_norm(input, _ints(normalized_shape), weight, bias, eps)


def group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None,  # noqa: A002
               eps: float = 1e-05, cudnn_enabled: bool = True) -> Tensor:
    """``torch.group_norm``; ``cudnn_enabled`` has no effect."""
    return F.group_norm(input, num_groups, weight, bias, eps)


def instance_norm(input: Any, weight: Any, bias: Any, running_mean: Any,  # noqa: A002
                  running_var: Any, use_input_stats: bool, momentum: float, eps: float,
                  cudnn_enabled: bool) -> Tensor:
    """``torch.instance_norm``: :func:`mpitensor.nn.functional.instance_norm` with torch's
    top-level argument order; ``cudnn_enabled`` has no effect."""
    return F.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats,
                           momentum, eps)


# ------------------------------------------------------------------------------- embeddings
def embedding(weight: Any, indices: Any, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """``torch.embedding(weight, indices)``: the rows of ``weight`` that ``indices`` name;
    ``padding_idx`` (negative: none) gets no gradient."""
    pad = None if padding_idx is None or int(padding_idx) < 0 else int(padding_idx)
    return F.embedding(indices, weight, pad, scale_grad_by_freq=scale_grad_by_freq,
                       sparse=sparse)


def embedding_renorm_(input: Any, indices: Any, max_norm: float,  # noqa: A002
                      norm_type: float) -> Tensor:
    """``torch.embedding_renorm_``: scale, in place, each row of ``input`` that ``indices``
    names and whose ``norm_type``-norm exceeds ``max_norm`` down to that norm (no gradient:
    call it under ``no_grad`` on a weight that requires grad, as torch asks)."""
    w = _tensor(input, "input", "embedding_renorm_")
    idx = _tensor(indices, "indices", "embedding_renorm_")
    if w.requires_grad and _autograd.is_grad_enabled():
        raise RuntimeError("embedding_renorm_(): the weight requires grad and the renorm has "
                           "no gradient; call it under mpitensor.no_grad()")
    if w.dim() != 2:
        raise RuntimeError(f"embedding_renorm_(): the weight must be 2-D, got size "
                           f"{tuple(w.shape)}")
    if idx.is_floating_point():
        raise RuntimeError(f"embedding_renorm_(): indices must be int64 or int32, got "
                           f"{idx.dtype}")
    _renorm_(w, idx._data, float(max_norm), float(norm_type))
    return w


def _bag_extras(idx: np.ndarray, starts: np.ndarray, mode: int, pad: Optional[int],
                nbags: int, dim: int, weight: Tensor, n_offsets: int) -> Tuple[Any, ...]:
    """torch's CPU ``offset2bag``, ``bag_size`` and ``max_indices`` of an embedding bag
    (for sums: the others zeros, one per offset, and ``offset2bag`` empty where torch takes its
    fast path: no ``padding_idx`` and a weight other than float64)."""
    bag = (np.searchsorted(starts, np.arange(len(idx)), side="right") - 1).astype(np.int64)
    live = idx != pad if pad is not None else np.ones(len(idx), bool)
    size = np.bincount(bag[live], minlength=nbags)[:nbags].astype(np.int64)
    if mode == 0:
        zeros = np.zeros(n_offsets, np.int64)
        fast = pad is None and weight.dtype != np.float64
        return (np.zeros(0, np.int64) if fast else bag), zeros, zeros.copy()
    if mode == 1:
        return bag, size, size.copy()
    w = weight.detach().cpu().numpy()
    rows = w[idx]
    best = np.full((nbags, dim), -1, np.int64)
    for b in range(nbags):
        sel = np.nonzero((bag == b) & live)[0]
        if len(sel):
            best[b] = idx[sel[np.argmax(rows[sel], axis=0)]]
    best[size == 0] = 0
    return bag, size, best


def embedding_bag(weight: Any, indices: Any, offsets: Any,
                  scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                  per_sample_weights: Any = None, include_last_offset: bool = False,
                  padding_idx: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``torch.embedding_bag``: the sums (``mode`` 0), means (1) or maxima (2) of bags of
    rows of ``weight``; returns ``(output, offset2bag, bag_size, max_indices)``, the last three
    as torch's CPU kernel fills them (offset2bag empty and the others zeros for sums)."""
    if mode not in (0, 1, 2):
        raise ValueError(f"embedding_bag(): mode is an int at torch's top level: 0 (sum), 1 "
                         f"(mean) or 2 (max), got {mode!r}")
    w = _tensor(weight, "weight", "embedding_bag")
    idx_t = _tensor(indices, "indices", "embedding_bag")
    off_t = _tensor(offsets, "offsets", "embedding_bag")
    pad = None if padding_idx is None or padding_idx < 0 else int(padding_idx)
    out = F.embedding_bag(idx_t, w, off_t, scale_grad_by_freq=scale_grad_by_freq,
                          mode=("sum", "mean", "max")[mode], sparse=sparse,
                          per_sample_weights=per_sample_weights,
                          include_last_offset=include_last_offset, padding_idx=pad)
    idx = np.asarray(idx_t.detach().cpu().numpy()).reshape(-1)
    starts = np.asarray(off_t.detach().cpu().numpy()).reshape(-1)
    nbags = out.shape[0]
    extras = _bag_extras(idx, starts[:nbags], mode, pad, nbags, w.shape[1], w, len(starts))
    return (out,) + tuple(wrap(e).to(out.device) for e in extras)


# ------------------------------------------------------------------------------ activations
def selu(input: Any) -> Tensor:  # noqa: A002
    """``torch.selu``: the scaled ELU with SELU's constants."""
    return F.selu(input)


def celu(input: Any, alpha: float = 1.0) -> Tensor:  # noqa: A002
    """``torch.celu``: ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    return F.celu(input, alpha)


def threshold(input: Any, threshold: float, value: float) -> Tensor:  # noqa: A002
    """``torch.threshold``: ``x`` where ``x > threshold``, else ``value``."""
    return F.threshold(input, threshold, value)


def _rrelu_generator(generator: Any, training: bool, fname: str) -> None:
    if generator is not None and training:
        raise NotImplementedError(f"{fname}(): a generator of its own is not supported; the "
                                  f"slopes come from the global generator (seed it with "
                                  f"mpitensor.manual_seed) - call it with generator=None")


def rrelu(input: Any, lower: float = 0.125, upper: float = 1.0 / 3,  # noqa: A002
          training: bool = False, generator: Any = None) -> Tensor:
    """``torch.rrelu``: randomized leaky ReLU (slopes from the global generator)."""
    _rrelu_generator(generator, training, "rrelu")
    return F.rrelu(input, lower, upper, training)


def rrelu_(input: Any, lower: float = 0.125, upper: float = 1.0 / 3,  # noqa: A002
           training: bool = False, generator: Any = None) -> Tensor:
    """``torch.rrelu_``: :func:`rrelu` written into ``input``."""
    _rrelu_generator(generator, training, "rrelu_")
    return F.rrelu_(input, lower, upper, training)


@tensor_methods
class _Methods:
    def prelu(self, weight: Any) -> Tensor:
        """``Tensor.prelu(weight)``: as :func:`mpitensor.prelu`."""
        return F.prelu(self, weight)

    def hardshrink(self, lambd: float = 0.5) -> Tensor:
        """``Tensor.hardshrink(lambd=0.5)``: as :func:`mpitensor.hardshrink`."""
        return F.hardshrink(self, lambd)


# ---------------------------------------------------------------------------------- pooling
def max_pool1d(input: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,  # noqa: A002
               dilation: Any = 1, ceil_mode: bool = False) -> Tensor:
    """``torch.max_pool1d`` (``stride=[]``: the kernel size)."""
    return F.max_pool1d(input, _ints(kernel_size), _stride(stride), _ints(padding),
                        _ints(dilation), ceil_mode)


def max_pool2d(input: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,  # noqa: A002
               dilation: Any = 1, ceil_mode: bool = False) -> Tensor:
    """``torch.max_pool2d`` (``stride=[]``: the kernel size)."""
    return F.max_pool2d(input, _ints(kernel_size), _stride(stride), _ints(padding),
                        _ints(dilation), ceil_mode)


def max_pool3d(input: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,  # noqa: A002
               dilation: Any = 1, ceil_mode: bool = False) -> Tensor:
    """``torch.max_pool3d`` (``stride=[]``: the kernel size)."""
    return F.max_pool3d(input, _ints(kernel_size), _stride(stride), _ints(padding),
                        _ints(dilation), ceil_mode)


def max_pool1d_with_indices(input: Any, kernel_size: Any, stride: Any = (),  # noqa: A002
                            padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False) -> Tuple[Tensor, Tensor]:
    """``torch.max_pool1d_with_indices``: ``(output, indices)``."""
    return tuple(F.max_pool1d(input, _ints(kernel_size), _stride(stride), _ints(padding),
                              _ints(dilation), ceil_mode, return_indices=True))


def avg_pool1d(input: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """``torch.avg_pool1d`` (``stride=[]``: the kernel size)."""
    return F.avg_pool1d(input, _ints(kernel_size), _stride(stride), _ints(padding), ceil_mode,
                        count_include_pad)


def adaptive_max_pool1d(input: Any, output_size: Any) -> Tuple[Tensor, Tensor]:  # noqa: A002
    """``torch.adaptive_max_pool1d``: ``(output, indices)``, always both."""
    return tuple(F.adaptive_max_pool1d(input, _ints(output_size), return_indices=True))


# ----------------------------------------------------------------------------------- losses
def kl_div(input: Any, target: Any, reduction: int = 0, *,  # noqa: A002
           log_target: bool = False) -> Tensor:
    """``torch.kl_div``: reduction 1 is the mean over every element (without the warning
    ``F.kl_div`` gives for it, as torch's top level gives none)."""
    red = _reduction(reduction, "kl_div")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 'mean' is the top level's plain default
        return F.kl_div(input, target, reduction=red, log_target=log_target)


def cosine_embedding_loss(input1: Any, input2: Any, target: Any, margin: float = 0.0,
                          reduction: int = 0) -> Tensor:
    """``torch.cosine_embedding_loss`` (int reduction)."""
    return F.cosine_embedding_loss(input1, input2, target, margin,
                                   reduction=_reduction(reduction, "cosine_embedding_loss"))


def hinge_embedding_loss(input: Any, target: Any, margin: float = 1.0,  # noqa: A002
                         reduction: int = 0) -> Tensor:
    """``torch.hinge_embedding_loss`` (int reduction)."""
    return F.hinge_embedding_loss(input, target, margin,
                                  reduction=_reduction(reduction, "hinge_embedding_loss"))


def margin_ranking_loss(input1: Any, input2: Any, target: Any, margin: float = 0.0,
                        reduction: int = 0) -> Tensor:
    """``torch.margin_ranking_loss`` (int reduction)."""
    return F.margin_ranking_loss(input1, input2, target, margin,
                                 reduction=_reduction(reduction, "margin_ranking_loss"))


def triplet_margin_loss(anchor: Any, positive: Any, negative: Any, margin: float = 1.0,
                        p: float = 2.0, eps: float = 1e-06, swap: bool = False,
                        reduction: int = 0) -> Tensor:
    """``torch.triplet_margin_loss`` (int reduction)."""
    return F.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap,
                                 reduction=_reduction(reduction, "triplet_margin_loss"))


def poisson_nll_loss(input: Any, target: Any, log_input: bool, full: bool,  # noqa: A002
                     eps: float, reduction: int) -> Tensor:
    """``torch.poisson_nll_loss``: every argument given, reduction an int."""
    return F.poisson_nll_loss(input, target, log_input, full, eps=eps,
                              reduction=_reduction(reduction, "poisson_nll_loss"))


def ctc_loss(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any,
             blank: int = 0, reduction: int = 0, zero_infinity: bool = False) -> Tensor:
    """``torch.ctc_loss`` (int reduction)."""
    return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
                      _reduction(reduction, "ctc_loss"), zero_infinity)


def binary_cross_entropy_with_logits(input: Any, target: Any, weight: Any = None,  # noqa: A002
                                     pos_weight: Any = None, reduction: int = 0) -> Tensor:
    """``torch.binary_cross_entropy_with_logits``: ``pos_weight`` before ``reduction``, an
    int."""
    red = _reduction(reduction, "binary_cross_entropy_with_logits")
    return F.binary_cross_entropy_with_logits(input, target, weight, reduction=red,
                                              pos_weight=pos_weight)


# ---------------------------------------------------------------------- padding, sampling
def constant_pad_nd(input: Any, pad: Sequence[int], value: float = 0) -> Tensor:  # noqa: A002
    """``torch.constant_pad_nd``: ``F.pad(input, pad, 'constant', value)`` (negative pads
    crop)."""
    return F.pad(input, _ints(pad), "constant", value)


_INTERP = ("bilinear", "nearest", "bicubic")
_PADDING = ("zeros", "border", "reflection")


def _mode(v: Any, names: tuple, what: str, fname: str) -> str:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < len(names):
        raise ValueError(f"{fname}(): {what} is an int at torch's top level: "
                         + ", ".join(f"{i} ({n})" for i, n in enumerate(names))
                         + f", got {v!r}")
    return names[int(v)]


def _grid_sampler(input: Any, grid: Any, interpolation_mode: int,  # noqa: A002
                  padding_mode: int, align_corners: bool, fname: str, ndim: Any) -> Tensor:
    x = _tensor(input, "input", fname)
    if ndim is not None and x.dim() != ndim:
        raise RuntimeError(f"{fname}(): expected a {ndim}-D input, got size "
                           f"{tuple(x.shape)}")
    interp = _mode(interpolation_mode, _INTERP, "interpolation_mode", fname)
    pad = _mode(padding_mode, _PADDING, "padding_mode", fname)
    return F.grid_sample(x, grid, interp, pad, bool(align_corners))


def grid_sampler(input: Any, grid: Any, interpolation_mode: int,  # noqa: A002
                 padding_mode: int, align_corners: bool) -> Tensor:
    """``torch.grid_sampler``: ``F.grid_sample`` with int modes (interpolation 0 bilinear,
    1 nearest, 2 bicubic; padding 0 zeros, 1 border, 2 reflection)."""
    return _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners,
                         "grid_sampler", None)


def grid_sampler_2d(input: Any, grid: Any, interpolation_mode: int,  # noqa: A002
                    padding_mode: int, align_corners: bool) -> Tensor:
    """``torch.grid_sampler_2d``: :func:`grid_sampler` of a 4-D input."""
    return _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners,
                         "grid_sampler_2d", 4)


def grid_sampler_3d(input: Any, grid: Any, interpolation_mode: int,  # noqa: A002
                    padding_mode: int, align_corners: bool) -> Tensor:
    """``torch.grid_sampler_3d``: :func:`grid_sampler` of a 5-D input."""
    return _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners,
                         "grid_sampler_3d", 5)


def affine_grid_generator(theta: Any, size: Sequence[int], align_corners: bool) -> Tensor:
    """``torch.affine_grid_generator``: ``F.affine_grid`` with ``align_corners`` required."""
    return F.affine_grid(theta, list(size), bool(align_corners))


# -------------------------------------------------------------------------------- recurrent
def _same_dtype(x: Tensor, others: Sequence[Any], fname: str) -> None:
    """The weights and states in the input's dtype (torch's products refuse a mix)."""
    for t in others:
        if t is not None and t.dtype != x.dtype:
            raise RuntimeError(f"{fname}(): the input is {x.dtype} but a weight or state is "
                               f"{t.dtype}; convert them to one dtype (e.g. w.to(input.dtype))")


def _cell(mode: str, input: Any, states: List[Any], w_ih: Any, w_hh: Any,  # noqa: A002
          b_ih: Any, b_hh: Any, fname: str) -> Tuple[Tensor, ...]:
    """One step of a recurrent cell on (B, I) ``input`` and (B, H) states."""
    x = _tensor(input, "input", fname)
    w_ih = _tensor(w_ih, "w_ih", fname)
    w_hh = _tensor(w_hh, "w_hh", fname)
    G, H = GATES[mode], w_hh.shape[-1]
    if w_ih.dim() != 2 or w_hh.dim() != 2 or w_ih.shape[0] != G * H \
            or w_hh.shape[0] != G * H:
        raise RuntimeError(f"{fname}(): expected w_ih of size ({G} * hidden, input) and w_hh "
                           f"of size ({G} * hidden, hidden), got {tuple(w_ih.shape)} and "
                           f"{tuple(w_hh.shape)}")
    if x.dim() != 2 or x.shape[1] != w_ih.shape[1]:
        raise RuntimeError(f"{fname}(): expected an input of size (batch, {w_ih.shape[1]}), "
                           f"got {tuple(x.shape)}")
    for i, s in enumerate(states):
        s = _tensor(s, "hx", fname)
        if tuple(s.shape) != (x.shape[0], H):
            raise RuntimeError(f"{fname}(): hidden state {i} must be of size "
                               f"({x.shape[0]}, {H}), got {tuple(s.shape)}")
    for b, name in ((b_ih, "b_ih"), (b_hh, "b_hh")):
        if b is not None and tuple(_tensor(b, name, fname).shape) != (G * H,):
            raise RuntimeError(f"{fname}(): {name} must be of size ({G * H},), got "
                               f"{tuple(b.shape)}")
    _same_dtype(x, list(states) + [w_ih, w_hh, b_ih, b_hh], fname)
    lstm = mode == "LSTM"
    flat = RecurrentLayer.apply(x.unsqueeze(0), states[0], states[1] if lstm else None, w_ih,
                                w_hh, b_ih, b_hh, None, mode, False, None)
    return tuple(split_outputs(flat, 1, x.shape[0], H, H, lstm)[1:])


def lstm_cell(input: Any, hx: Sequence[Any], w_ih: Any, w_hh: Any,  # noqa: A002
              b_ih: Any = None, b_hh: Any = None) -> Tuple[Tensor, Tensor]:
    """``torch.lstm_cell``: one LSTM step, ``hx = (h, c)``; returns ``(h', c')``."""
    if not isinstance(hx, (list, tuple)) or len(hx) != 2:
        raise RuntimeError("lstm_cell(): hx must be a list (h, c) of two tensors")
    return _cell("LSTM", input, list(hx), w_ih, w_hh, b_ih, b_hh, "lstm_cell")


def gru_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None,  # noqa: A002
             b_hh: Any = None) -> Tensor:
    """``torch.gru_cell``: one GRU step; returns ``h'``."""
    return _cell("GRU", input, [hx], w_ih, w_hh, b_ih, b_hh, "gru_cell")[0]


def rnn_tanh_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None,  # noqa: A002
                  b_hh: Any = None) -> Tensor:
    """``torch.rnn_tanh_cell``: one Elman step with tanh; returns ``h'``."""
    return _cell("RNN_TANH", input, [hx], w_ih, w_hh, b_ih, b_hh, "rnn_tanh_cell")[0]


def rnn_relu_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None,  # noqa: A002
                  b_hh: Any = None) -> Tensor:
    """``torch.rnn_relu_cell``: one Elman step with ReLU; returns ``h'``."""
    return _cell("RNN_RELU", input, [hx], w_ih, w_hh, b_ih, b_hh, "rnn_relu_cell")[0]


def _layers(mode: str, params: Sequence[Any], has_biases: bool, num_layers: int,
            bidirectional: bool, fname: str) -> Tuple[list, int]:
    """The flat weight list cut into per layer-and-direction dicts, and the projection size
    (0: none)."""
    units = num_layers * (2 if bidirectional else 1)
    per = 4 if has_biases else 2
    params = list(params)
    if len(params) == units * (per + 1) and mode == "LSTM":
        per += 1
    if len(params) != units * per:
        raise RuntimeError(f"{fname}(): expected {units * per} weights ({num_layers} layers x "
                           f"{units // num_layers} directions x {per}), got {len(params)}")
    keys = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if has_biases else [])
    if per > len(keys):
        keys.append("weight_hr")
    groups = [dict(zip(keys, params[i * per:(i + 1) * per])) for i in range(units)]
    proj = groups[0]["weight_hr"].shape[0] if "weight_hr" in keys else 0
    return groups, proj


def _run_layers(mode: str, x: Tensor, h0: Any, c0: Any, params: Sequence[Any],
                has_biases: bool, num_layers: int, dropout: float, train: bool,
                bidirectional: bool, batch_sizes: Any, fname: str) -> Tuple[Any, ...]:
    """The stacked layers over padded (T, B, I) ``x``, run by ``nn.RNNBase``'s own loop over
    the given weights: ``(out, h_n, c_n)``."""
    groups, proj = _layers(mode, params, has_biases, num_layers, bidirectional, fname)
    H = groups[0]["weight_hh"].shape[0] // GATES[mode]
    states = [("h0", h0, proj or H)] + ([("c0", c0, H)] if mode == "LSTM" else [])
    for name, t, width in states:
        want = (len(groups), x.shape[1], width)
        if tuple(_tensor(t, name, fname).shape) != want:
            raise RuntimeError(f"{fname}(): expected {name} of size {want} (layers * "
                               f"directions, batch, size), got {tuple(t.shape)}")
    _same_dtype(x, [h0, c0] + list(params), fname)
    names, layer = [], SimpleNamespace()
    per_layer = len(groups) // num_layers
    for i, g in enumerate(groups):
        suffix = f"_l{i // per_layer}" + ("_reverse" if i % per_layer else "")
        names.append([k + suffix for k in g])
        for k, v in g.items():
            setattr(layer, k + suffix, v)
    layer.__dict__.update(mode=mode, bidirectional=bidirectional, proj_size=proj,
                          hidden_size=H, num_layers=num_layers, _all_weights=names,
                          dropout=float(dropout), training=bool(train))
    return RNNBase._run(layer, x, h0, c0, batch_sizes)


def _stack(mode: str, args: tuple, fname: str) -> Tuple[Tensor, ...]:
    """torch's two forms: ``(input, hx, params, has_biases, num_layers, dropout, train,
    bidirectional, batch_first)`` and the packed ``(data, batch_sizes, hx, params, has_biases,
    num_layers, dropout, train, bidirectional)`` (told apart, as torch does, by what stands
    where ``hx`` or ``params`` would)."""
    packed = isinstance(args[1] if mode == "LSTM" else args[2], Tensor)
    if packed:
        data, sizes, hx, params, has_biases, num_layers, dropout, train, bidir = args
        batch_first = False
    else:
        data, hx, params, has_biases, num_layers, dropout, train, bidir, batch_first = args
    if mode == "LSTM":
        if not isinstance(hx, (list, tuple)) or len(hx) != 2:
            raise RuntimeError(f"{fname}(): hx must be a list (h0, c0) of two tensors")
        h0, c0 = hx
    else:
        h0, c0 = hx, None
    x = _tensor(data, "input", fname)
    if packed:
        bs = np.asarray(_tensor(sizes, "batch_sizes", fname).cpu().numpy(), dtype=np.int64)
        if x.dim() != 2 or bs.ndim != 1 or int(bs.sum()) != x.shape[0]:
            raise RuntimeError(f"{fname}(): packed data of size {tuple(x.shape)} does not fit "
                               f"batch_sizes {bs.tolist()} (2-D data, one row per entry)")
        rows = padded_rows(bs, int(bs[0]))
        x = PackedToPadded.apply(x, rows, len(bs), int(bs[0]))
        run_sizes = None if np.all(bs == bs[0]) else bs
    else:
        if x.dim() != 3:
            raise RuntimeError(f"{fname}(): expected a 3-D input, got size {tuple(x.shape)}")
        x = x.transpose(0, 1) if batch_first else x
        run_sizes = None
    out, h_n, c_n = _run_layers(mode, x, h0, c0, params, has_biases, num_layers, dropout,
                                train, bidir, run_sizes, fname)
    if packed:
        out = PaddedToPacked.apply(out, rows)
    elif batch_first:
        out = out.transpose(0, 1)
    return (out, h_n, c_n) if mode == "LSTM" else (out, h_n)


def lstm(input: Any, hx: Sequence[Any], params: Sequence[Any], has_biases: bool,  # noqa: A002
         num_layers: int, dropout: float, train: bool, bidirectional: bool,
         batch_first: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``torch.lstm``: a stacked LSTM with flat weights; ``hx = (h0, c0)`` of size
    (layers * directions, batch, size); returns ``(output, h_n, c_n)``. The packed form
    ``lstm(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
    bidirectional)`` (positional, as torch's) returns the packed output data."""
    return _stack("LSTM", (input, hx, params, has_biases, num_layers, dropout, train,
                           bidirectional, batch_first), "lstm")


def _single_state(mode: str, name: str, doc: str) -> Any:
    """The top-level stacked function of a recurrent ``mode`` with one state tensor."""

    def run(input: Any, hx: Any, params: Sequence[Any], has_biases: bool,  # noqa: A002
            num_layers: int, dropout: float, train: bool, bidirectional: bool,
            batch_first: bool) -> Tuple[Tensor, Tensor]:
        return _stack(mode, (input, hx, params, has_biases, num_layers, dropout, train,
                             bidirectional, batch_first), name)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    return run


gru = _single_state("GRU", "gru", """``torch.gru``: a stacked GRU with flat weights; returns
    ``(output, h_n)``; the packed form ``(data, batch_sizes, hx, params, ...)`` as
    :func:`lstm`'s.""")
rnn_tanh = _single_state("RNN_TANH", "rnn_tanh", """``torch.rnn_tanh``: stacked Elman layers
    (tanh) with flat weights; returns ``(output, h_n)``.""")
rnn_relu = _single_state("RNN_RELU", "rnn_relu", """``torch.rnn_relu``: stacked Elman layers
    (ReLU) with flat weights; returns ``(output, h_n)``.""")


# ------------------------------------------------------------------------------------ norms
def norm_except_dim(v: Any, pow: int = 2, dim: int = 0) -> Tensor:  # noqa: A002
    """``torch.norm_except_dim``: the ``pow``-norm over every dim but ``dim``, kept as size-1
    dims (``dim=-1``: the norm of the whole tensor, a 0-D result), as weight norm uses it."""
    t = _tensor(v, "v", "norm_except_dim")
    if dim == -1:
        return _linalg.vector_norm(t, pow)
    d = dim % t.dim() if t.dim() else 0
    rest = tuple(i for i in range(t.dim()) if i != d)
    return _linalg.vector_norm(t, pow, rest, keepdim=True)


def _deprecated(name: str, instead: str) -> None:
    """Warn at the program's line that called ``name`` (past any wrapper of this package)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"{name} is deprecated in torch (kept for old programs); use {instead}",
                  UserWarning, stacklevel=level)


def frobenius_norm(input: Any, dim: Any, keepdim: bool = False) -> Tensor:  # noqa: A002
    """``torch.frobenius_norm``: ``linalg.vector_norm(input, 2, dim, keepdim)``; deprecated
    in torch, and warns as torch does."""
    _deprecated("frobenius_norm", "linalg.vector_norm(input, 2, dim, keepdim)")
    return _linalg.vector_norm(input, 2, _ints(dim), keepdim)


def nuclear_norm(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """``torch.nuclear_norm(input, keepdim=False)`` over the last two dims, or
    ``nuclear_norm(input, dim, keepdim=False)`` over two given dims: the sum of singular
    values. Deprecated in torch, and warns as torch does."""
    _deprecated("nuclear_norm", "linalg.matrix_norm(input, 'nuc', dim, keepdim)")
    if isinstance(dim, bool):
        dim, keepdim = None, dim
    t = _tensor(input, "input", "nuclear_norm")
    return _linalg.matrix_norm(t, "nuc", (-2, -1) if dim is None else _ints(dim), keepdim)
