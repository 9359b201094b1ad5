"""The meta device computes shapes, as torch's does: every op on meta tensors gives a meta
tensor of torch's shape and dtype, without values and without allocating the result.

The table of calls (:func:`_cases`) holds torch 2.13's answers (``EXPECTED``); where torch is
installed, each call is also run on torch's meta device and compared (the oracle). NumPy is the
oracle of the array layer: each NumPy call on meta arrays gives the shape and dtype the same
call gives on real ones.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import backend as _backend

try:
    import torch
except ImportError:  # the stored table is checked alone
    torch = None


def E(L, *shape, dtype=None):  # noqa: N802 - a float tensor on the meta device
    return L.empty(*shape, device="meta", dtype=dtype or L.float32)


def I(L, *shape, dtype=None):  # noqa: E743, N802 - an int64 tensor on the meta device
    return L.zeros(*shape, device="meta", dtype=dtype or L.int64)


def op(L, path):
    """``L.nn.functional`` and the like, by its dotted path."""
    for part in path.split("."):
        L = getattr(L, part)
    return L


def _cases() -> list:
    """(name, call): each call takes the library (mpitensor or torch) as ``L``."""
    F = "nn.functional"
    return [
        # pointwise and broadcasting
        ("add_scalar", lambda L: E(L, 3, 4) + 1),
        ("add_broadcast", lambda L: E(L, 3, 1, 5) + E(L, 4, 1)),
        ("mul_int_by_float", lambda L: I(L, 3) * 2.5),
        ("truediv_ints", lambda L: I(L, 3) / I(L, 3)),
        ("floordiv_int", lambda L: I(L, 2, 3) // 2),
        ("pow", lambda L: E(L, 2, 3) ** 2),
        ("neg", lambda L: -E(L, 2, 3)),
        ("exp", lambda L: E(L, 2, 3).exp()),
        ("half_plus_float", lambda L: E(L, 2, 3, dtype=L.float16) + E(L, 3)),
        ("compare", lambda L: E(L, 2, 3) < 0),
        ("where", lambda L: L.where(E(L, 2, 3) > 0, E(L, 2, 3), 0.0)),
        ("clamp", lambda L: E(L, 4).clamp(0, 1)),
        ("relu", lambda L: L.relu(E(L, 4, 5))),
        ("sigmoid", lambda L: L.sigmoid(E(L, 4, 5))),
        ("gelu", lambda L: op(L, F).gelu(E(L, 4, 5))),
        ("silu", lambda L: op(L, F).silu(E(L, 4, 5))),
        ("masked_fill", lambda L: E(L, 3, 4).masked_fill(E(L, 3, 4) > 0, 0.0)),
        ("lerp", lambda L: L.lerp(E(L, 3, 4), E(L, 4), 0.5)),
        # reductions
        ("sum_all", lambda L: E(L, 3, 4).sum()),
        ("sum_dim", lambda L: E(L, 3, 4).sum(0)),
        ("sum_dims_keepdim", lambda L: E(L, 3, 4, 5).sum((0, 2), keepdim=True)),
        ("sum_int_to_int64", lambda L: I(L, 3, 4, dtype=L.int32).sum(1)),
        ("mean_last", lambda L: E(L, 3, 4).mean(-1)),
        ("var_dim", lambda L: E(L, 3, 4).var(1)),
        ("std_all", lambda L: E(L, 3, 4).std()),
        ("max_dim", lambda L: E(L, 3, 4).max(1)),
        ("max_all", lambda L: E(L, 3, 4).max()),
        ("argmax_keepdim", lambda L: E(L, 3, 4).argmax(1, keepdim=True)),
        ("amax_dims", lambda L: E(L, 3, 4).amax((0, 1))),
        ("cumsum", lambda L: E(L, 3, 4).cumsum(1)),
        ("prod_dim", lambda L: E(L, 3, 4).prod(0)),
        ("norm", lambda L: E(L, 3, 4).norm()),
        ("logsumexp", lambda L: E(L, 3, 4).logsumexp(1)),
        ("any_dim", lambda L: (E(L, 3, 4) > 0).any(1)),
        # the matrix product family
        ("matmul", lambda L: E(L, 3, 4) @ E(L, 4, 5)),
        ("matmul_batched_broadcast", lambda L: E(L, 2, 3, 4) @ E(L, 4, 5)),
        ("matmul_vector", lambda L: E(L, 3, 4) @ E(L, 4)),
        ("vector_matmul", lambda L: E(L, 4) @ E(L, 2, 4, 5)),
        ("bmm", lambda L: L.bmm(E(L, 2, 3, 4), E(L, 2, 4, 5))),
        ("mm", lambda L: L.mm(E(L, 3, 4), E(L, 4, 5))),
        ("dot", lambda L: L.dot(E(L, 4), E(L, 4))),
        ("einsum", lambda L: L.einsum("bij,bjk->bik", E(L, 2, 3, 4), E(L, 2, 4, 5))),
        ("outer", lambda L: L.outer(E(L, 3), E(L, 4))),
        ("addmm", lambda L: L.addmm(E(L, 5), E(L, 3, 4), E(L, 4, 5))),
        ("tensordot", lambda L: L.tensordot(E(L, 2, 3, 4), E(L, 3, 4, 5), dims=2)),
        # several tensors
        ("cat", lambda L: L.cat([E(L, 2, 3), E(L, 4, 3)])),
        ("cat_dim1", lambda L: L.cat([E(L, 2, 3), E(L, 2, 5)], 1)),
        ("stack", lambda L: L.stack([E(L, 2, 3), E(L, 2, 3)], 1)),
        ("split", lambda L: E(L, 5, 3).split(2)),
        ("split_sizes", lambda L: E(L, 5, 3).split([1, 4])),
        ("chunk", lambda L: E(L, 6, 3).chunk(3, 1)),
        ("unbind", lambda L: E(L, 3, 2).unbind(1)),
        # indexing
        ("index_int", lambda L: E(L, 5, 3)[1]),
        ("index_slice_none", lambda L: E(L, 5, 3)[1:4, None]),
        ("index_list", lambda L: E(L, 5, 3)[[0, 2, 4]]),
        ("index_tensor", lambda L: E(L, 5, 3)[I(L, 7)]),
        ("index_two_apart", lambda L: E(L, 5, 3, 4)[I(L, 7), :, I(L, 7)]),
        ("index_two_together", lambda L: E(L, 5, 3, 4)[:, I(L, 2, 1), I(L, 6)]),
        ("gather", lambda L: E(L, 5, 3).gather(1, I(L, 5, 2))),
        ("index_select", lambda L: E(L, 5, 3).index_select(0, I(L, 4))),
        ("take_along_dim", lambda L: L.take_along_dim(E(L, 5, 3), I(L, 5, 2), 1)),
        # views and layout
        ("view", lambda L: E(L, 4, 6).view(2, 12)),
        ("reshape_infer", lambda L: E(L, 4, 6).reshape(-1, 3)),
        ("permute", lambda L: E(L, 2, 3, 4).permute(2, 0, 1)),
        ("transpose", lambda L: E(L, 2, 3, 4).transpose(0, 2)),
        ("flatten", lambda L: E(L, 2, 3, 4).flatten(1)),
        ("expand", lambda L: E(L, 1, 4).expand(3, 4)),
        ("repeat", lambda L: E(L, 2, 3).repeat(2, 2)),
        ("contiguous", lambda L: E(L, 2, 3).t().contiguous()),
        ("squeeze_unsqueeze", lambda L: E(L, 2, 1, 3).squeeze(1).unsqueeze(0)),
        ("flip", lambda L: E(L, 2, 3).flip(0)),
        ("roll", lambda L: E(L, 2, 3).roll(1, 1)),
        ("tril", lambda L: E(L, 3, 4).tril()),
        ("sort", lambda L: E(L, 3, 6).sort(1)),
        ("topk", lambda L: E(L, 3, 6).topk(2)),
        ("float_cast", lambda L: I(L, 2, 3).float()),
        ("to_half", lambda L: E(L, 2, 3).to(L.float16)),
        ("zeros_like", lambda L: L.zeros_like(E(L, 3, 4))),
        ("new_zeros", lambda L: E(L, 3, 4).new_zeros(2)),
        # softmax family
        ("softmax", lambda L: E(L, 2, 3).softmax(-1)),
        ("log_softmax", lambda L: op(L, F).log_softmax(E(L, 2, 3), dim=1)),
        # layers, functional
        ("linear", lambda L: op(L, F).linear(E(L, 2, 3), E(L, 5, 3), E(L, 5))),
        ("conv1d", lambda L: op(L, F).conv1d(E(L, 2, 3, 10), E(L, 4, 3, 3))),
        ("conv2d_padding", lambda L: op(L, F).conv2d(E(L, 2, 3, 8, 8), E(L, 4, 3, 3, 3),
                                                     padding=1)),
        ("conv2d_stride", lambda L: op(L, F).conv2d(E(L, 2, 3, 9, 9), E(L, 4, 3, 3, 3), stride=2)),
        ("conv2d_groups", lambda L: op(L, F).conv2d(E(L, 2, 4, 8, 8), E(L, 6, 2, 3, 3), groups=2)),
        ("conv3d", lambda L: op(L, F).conv3d(E(L, 2, 3, 6, 6, 6), E(L, 4, 3, 3, 3, 3))),
        ("conv_transpose2d", lambda L: op(L, F).conv_transpose2d(E(L, 2, 4, 5, 5),
                                                                 E(L, 4, 3, 3, 3), stride=2)),
        ("max_pool2d", lambda L: op(L, F).max_pool2d(E(L, 2, 3, 8, 8), 2)),
        ("max_pool2d_indices", lambda L: op(L, F).max_pool2d(E(L, 2, 3, 8, 8), 2,
                                                             return_indices=True)),
        ("avg_pool2d", lambda L: op(L, F).avg_pool2d(E(L, 2, 3, 8, 8), 3, 2)),
        ("max_pool1d", lambda L: op(L, F).max_pool1d(E(L, 2, 3, 9), 2)),
        ("adaptive_avg_pool2d", lambda L: op(L, F).adaptive_avg_pool2d(E(L, 2, 3, 8, 8), 1)),
        ("layer_norm", lambda L: op(L, F).layer_norm(E(L, 2, 3, 4), (4,))),
        ("group_norm", lambda L: op(L, F).group_norm(E(L, 2, 4, 5), 2)),
        ("pad", lambda L: op(L, F).pad(E(L, 2, 3, 4), (1, 2))),
        ("interpolate", lambda L: op(L, F).interpolate(E(L, 1, 2, 4, 4), scale_factor=2)),
        ("embedding", lambda L: op(L, F).embedding(I(L, 2, 7), E(L, 10, 4))),
        ("one_hot", lambda L: op(L, F).one_hot(I(L, 3), 5)),
        ("dropout", lambda L: op(L, F).dropout(E(L, 4, 5), 0.5)),
        ("sdpa", lambda L: op(L, F).scaled_dot_product_attention(
            E(L, 2, 2, 5, 4), E(L, 2, 2, 5, 4), E(L, 2, 2, 5, 4), is_causal=True)),
        # losses
        ("cross_entropy", lambda L: op(L, F).cross_entropy(E(L, 4, 5), I(L, 4))),
        ("cross_entropy_none", lambda L: op(L, F).cross_entropy(E(L, 4, 5, 3), I(L, 4, 3),
                                                                reduction="none")),
        ("nll_loss_none", lambda L: op(L, F).nll_loss(E(L, 4, 5), I(L, 4), reduction="none")),
        ("mse_loss", lambda L: op(L, F).mse_loss(E(L, 4, 5), E(L, 4, 5))),
        ("bce_with_logits", lambda L: op(L, F).binary_cross_entropy_with_logits(E(L, 4), E(L, 4))),
        ("smooth_l1", lambda L: op(L, F).smooth_l1_loss(E(L, 4, 2), E(L, 4, 2), reduction="sum")),
        ("kl_div", lambda L: op(L, F).kl_div(E(L, 4, 5), E(L, 4, 5), reduction="batchmean")),
        # modules
        ("Linear", lambda L: L.nn.Linear(3, 5, device="meta")(E(L, 2, 3))),
        ("Conv2d", lambda L: L.nn.Conv2d(3, 4, 3, device="meta")(E(L, 2, 3, 8, 8))),
        ("BatchNorm2d", lambda L: L.nn.BatchNorm2d(3, device="meta")(E(L, 2, 3, 4, 4))),
        ("BatchNorm1d_eval", lambda L: L.nn.BatchNorm1d(3, device="meta").eval()(E(L, 2, 3))),
        ("LayerNorm", lambda L: L.nn.LayerNorm(4, device="meta")(E(L, 2, 3, 4))),
        ("Embedding", lambda L: L.nn.Embedding(10, 4, device="meta")(I(L, 2, 7))),
        ("LSTM", lambda L: L.nn.LSTM(4, 6, 2, batch_first=True, device="meta")(E(L, 3, 5, 4))),
        ("GRU", lambda L: L.nn.GRU(4, 6, device="meta")(E(L, 5, 3, 4))),
        ("RNN_bidirectional", lambda L: L.nn.RNN(4, 6, bidirectional=True, device="meta")(
            E(L, 5, 3, 4))),
        ("LSTMCell", lambda L: L.nn.LSTMCell(4, 6, device="meta")(E(L, 3, 4))),
        ("MultiheadAttention", lambda L: L.nn.MultiheadAttention(8, 2, batch_first=True,
                                                                  device="meta")(
            E(L, 2, 5, 8), E(L, 2, 3, 8), E(L, 2, 3, 8))),
        ("TransformerEncoderLayer", lambda L: L.nn.TransformerEncoderLayer(
            8, 2, 16, batch_first=True, device="meta")(E(L, 2, 5, 8))),
        ("TransformerDecoderLayer", lambda L: L.nn.TransformerDecoderLayer(
            8, 2, 16, device="meta")(E(L, 5, 2, 8), E(L, 3, 2, 8))),
        ("MaxPool2d", lambda L: L.nn.MaxPool2d(2, ceil_mode=True)(E(L, 2, 3, 7, 7))),
        ("Dropout", lambda L: L.nn.Dropout(0.1)(E(L, 2, 3))),
        # more of each family
        ("erf", lambda L: E(L, 3).erf()),
        ("atan2_broadcast", lambda L: L.atan2(E(L, 3, 1), E(L, 4))),
        ("bitwise_shift", lambda L: (I(L, 3) & 3) << 1),
        ("cummax", lambda L: E(L, 3, 4).cummax(1)),
        ("var_mean", lambda L: L.var_mean(E(L, 3, 4), 1)),
        ("scatter_add", lambda L: E(L, 3, 4).scatter_add(1, I(L, 3, 2), E(L, 3, 2))),
        ("index_add", lambda L: E(L, 3, 4).index_add(0, I(L, 2), E(L, 2, 4))),
        ("index_put", lambda L: E(L, 3, 4).index_put((I(L, 2),), E(L, 4))),
        ("kron", lambda L: L.kron(E(L, 2, 3), E(L, 3, 2))),
        ("cdist", lambda L: L.cdist(E(L, 2, 5, 3), E(L, 2, 4, 3))),
        ("linalg_inv", lambda L: L.linalg.inv(E(L, 2, 3, 3))),
        ("linalg_solve", lambda L: L.linalg.solve(E(L, 3, 3), E(L, 3, 2))),
        ("linalg_multi_dot", lambda L: L.linalg.multi_dot([E(L, 2, 3), E(L, 3, 4), E(L, 4, 5)])),
        ("baddbmm", lambda L: L.baddbmm(E(L, 2, 3, 5), E(L, 2, 3, 4), E(L, 2, 4, 5))),
        ("unfold", lambda L: op(L, F).unfold(E(L, 2, 3, 6, 6), 3)),
        ("grid_sample", lambda L: op(L, F).grid_sample(E(L, 1, 2, 5, 5), E(L, 1, 3, 3, 2),
                                                      align_corners=False)),
        ("pixel_shuffle", lambda L: op(L, F).pixel_shuffle(E(L, 1, 8, 3, 3), 2)),
        ("conv_transpose1d", lambda L: op(L, F).conv_transpose1d(E(L, 2, 4, 5), E(L, 4, 3, 3))),
        ("max_pool3d", lambda L: op(L, F).max_pool3d(E(L, 2, 3, 4, 4, 4), 2)),
        ("instance_norm", lambda L: op(L, F).instance_norm(E(L, 2, 3, 5, 5))),
        ("binary_cross_entropy", lambda L: op(L, F).binary_cross_entropy(E(L, 3), E(L, 3))),
        ("triplet_margin_loss", lambda L: op(L, F).triplet_margin_loss(E(L, 3, 4), E(L, 3, 4),
                                                                      E(L, 3, 4))),
        ("cross_entropy_probs", lambda L: op(L, F).cross_entropy(E(L, 4, 5), E(L, 4, 5),
                                                                 label_smoothing=0.1)),
        ("tril_indices", lambda L: L.tril_indices(3, 3, device="meta")),
        ("randperm", lambda L: L.randperm(5, device="meta")),
        ("meshgrid", lambda L: L.meshgrid(E(L, 3), E(L, 4), indexing="ij")),
        ("block_diag", lambda L: L.block_diag(E(L, 2, 3), E(L, 1, 2))),
        ("searchsorted", lambda L: L.searchsorted(E(L, 5), E(L, 3, 2))),
        ("fft_rfft", lambda L: L.fft.rfft(E(L, 4, 8), n=10)),
        ("fft_irfftn", lambda L: L.fft.irfftn(E(L, 4, 8, dtype=L.complex64), s=(5, 4))),
        ("fft_fft2", lambda L: L.fft.fft2(E(L, 4, 8))),
    ]


#: What torch 2.13 gives on its meta device for each call of :func:`_cases` (shape and
#: dtype of each result), kept here so that the table is checked where torch is absent.
EXPECTED = {
    'add_scalar': [((3, 4), 'float32')],
    'add_broadcast': [((3, 4, 5), 'float32')],
    'mul_int_by_float': [((3,), 'float32')],
    'truediv_ints': [((3,), 'float32')],
    'floordiv_int': [((2, 3), 'int64')],
    'pow': [((2, 3), 'float32')],
    'neg': [((2, 3), 'float32')],
    'exp': [((2, 3), 'float32')],
    'half_plus_float': [((2, 3), 'float32')],
    'compare': [((2, 3), 'bool')],
    'where': [((2, 3), 'float32')],
    'clamp': [((4,), 'float32')],
    'relu': [((4, 5), 'float32')],
    'sigmoid': [((4, 5), 'float32')],
    'gelu': [((4, 5), 'float32')],
    'silu': [((4, 5), 'float32')],
    'masked_fill': [((3, 4), 'float32')],
    'lerp': [((3, 4), 'float32')],
    'sum_all': [((), 'float32')],
    'sum_dim': [((4,), 'float32')],
    'sum_dims_keepdim': [((1, 4, 1), 'float32')],
    'sum_int_to_int64': [((3,), 'int64')],
    'mean_last': [((3,), 'float32')],
    'var_dim': [((3,), 'float32')],
    'std_all': [((), 'float32')],
    'max_dim': [((3,), 'float32'), ((3,), 'int64')],
    'max_all': [((), 'float32')],
    'argmax_keepdim': [((3, 1), 'int64')],
    'amax_dims': [((), 'float32')],
    'cumsum': [((3, 4), 'float32')],
    'prod_dim': [((4,), 'float32')],
    'norm': [((), 'float32')],
    'logsumexp': [((3,), 'float32')],
    'any_dim': [((3,), 'bool')],
    'matmul': [((3, 5), 'float32')],
    'matmul_batched_broadcast': [((2, 3, 5), 'float32')],
    'matmul_vector': [((3,), 'float32')],
    'vector_matmul': [((2, 5), 'float32')],
    'bmm': [((2, 3, 5), 'float32')],
    'mm': [((3, 5), 'float32')],
    'dot': [((), 'float32')],
    'einsum': [((2, 3, 5), 'float32')],
    'outer': [((3, 4), 'float32')],
    'addmm': [((3, 5), 'float32')],
    'tensordot': [((2, 5), 'float32')],
    'cat': [((6, 3), 'float32')],
    'cat_dim1': [((2, 8), 'float32')],
    'stack': [((2, 2, 3), 'float32')],
    'split': [((2, 3), 'float32'), ((2, 3), 'float32'), ((1, 3), 'float32')],
    'split_sizes': [((1, 3), 'float32'), ((4, 3), 'float32')],
    'chunk': [((6, 1), 'float32'), ((6, 1), 'float32'), ((6, 1), 'float32')],
    'unbind': [((3,), 'float32'), ((3,), 'float32')],
    'index_int': [((3,), 'float32')],
    'index_slice_none': [((3, 1, 3), 'float32')],
    'index_list': [((3, 3), 'float32')],
    'index_tensor': [((7, 3), 'float32')],
    'index_two_apart': [((7, 3), 'float32')],
    'index_two_together': [((5, 2, 6), 'float32')],
    'gather': [((5, 2), 'float32')],
    'index_select': [((4, 3), 'float32')],
    'take_along_dim': [((5, 2), 'float32')],
    'view': [((2, 12), 'float32')],
    'reshape_infer': [((8, 3), 'float32')],
    'permute': [((4, 2, 3), 'float32')],
    'transpose': [((4, 3, 2), 'float32')],
    'flatten': [((2, 12), 'float32')],
    'expand': [((3, 4), 'float32')],
    'repeat': [((4, 6), 'float32')],
    'contiguous': [((3, 2), 'float32')],
    'squeeze_unsqueeze': [((1, 2, 3), 'float32')],
    'flip': [((2, 3), 'float32')],
    'roll': [((2, 3), 'float32')],
    'tril': [((3, 4), 'float32')],
    'sort': [((3, 6), 'float32'), ((3, 6), 'int64')],
    'topk': [((3, 2), 'float32'), ((3, 2), 'int64')],
    'float_cast': [((2, 3), 'float32')],
    'to_half': [((2, 3), 'float16')],
    'zeros_like': [((3, 4), 'float32')],
    'new_zeros': [((2,), 'float32')],
    'softmax': [((2, 3), 'float32')],
    'log_softmax': [((2, 3), 'float32')],
    'linear': [((2, 5), 'float32')],
    'conv1d': [((2, 4, 8), 'float32')],
    'conv2d_padding': [((2, 4, 8, 8), 'float32')],
    'conv2d_stride': [((2, 4, 4, 4), 'float32')],
    'conv2d_groups': [((2, 6, 6, 6), 'float32')],
    'conv3d': [((2, 4, 4, 4, 4), 'float32')],
    'conv_transpose2d': [((2, 3, 11, 11), 'float32')],
    'max_pool2d': [((2, 3, 4, 4), 'float32')],
    'max_pool2d_indices': [((2, 3, 4, 4), 'float32'), ((2, 3, 4, 4), 'int64')],
    'avg_pool2d': [((2, 3, 3, 3), 'float32')],
    'max_pool1d': [((2, 3, 4), 'float32')],
    'adaptive_avg_pool2d': [((2, 3, 1, 1), 'float32')],
    'layer_norm': [((2, 3, 4), 'float32')],
    'group_norm': [((2, 4, 5), 'float32')],
    'pad': [((2, 3, 7), 'float32')],
    'interpolate': [((1, 2, 8, 8), 'float32')],
    'embedding': [((2, 7, 4), 'float32')],
    'one_hot': [((3, 5), 'int64')],
    'dropout': [((4, 5), 'float32')],
    'sdpa': [((2, 2, 5, 4), 'float32')],
    'cross_entropy': [((), 'float32')],
    'cross_entropy_none': [((4, 3), 'float32')],
    'nll_loss_none': [((4,), 'float32')],
    'mse_loss': [((), 'float32')],
    'bce_with_logits': [((), 'float32')],
    'smooth_l1': [((), 'float32')],
    'kl_div': [((), 'float32')],
    'Linear': [((2, 5), 'float32')],
    'Conv2d': [((2, 4, 6, 6), 'float32')],
    'BatchNorm2d': [((2, 3, 4, 4), 'float32')],
    'BatchNorm1d_eval': [((2, 3), 'float32')],
    'LayerNorm': [((2, 3, 4), 'float32')],
    'Embedding': [((2, 7, 4), 'float32')],
    'LSTM': [((3, 5, 6), 'float32'), ((2, 3, 6), 'float32'), ((2, 3, 6), 'float32')],
    'GRU': [((5, 3, 6), 'float32'), ((1, 3, 6), 'float32')],
    'RNN_bidirectional': [((5, 3, 12), 'float32'), ((2, 3, 6), 'float32')],
    'LSTMCell': [((3, 6), 'float32'), ((3, 6), 'float32')],
    'MultiheadAttention': [((2, 5, 8), 'float32'), ((2, 5, 3), 'float32')],
    'TransformerEncoderLayer': [((2, 5, 8), 'float32')],
    'TransformerDecoderLayer': [((5, 2, 8), 'float32')],
    'MaxPool2d': [((2, 3, 4, 4), 'float32')],
    'Dropout': [((2, 3), 'float32')],
    'erf': [((3,), 'float32')],
    'atan2_broadcast': [((3, 4), 'float32')],
    'bitwise_shift': [((3,), 'int64')],
    'cummax': [((3, 4), 'float32'), ((3, 4), 'int64')],
    'var_mean': [((3,), 'float32'), ((3,), 'float32')],
    'scatter_add': [((3, 4), 'float32')],
    'index_add': [((3, 4), 'float32')],
    'index_put': [((3, 4), 'float32')],
    'kron': [((6, 6), 'float32')],
    'cdist': [((2, 5, 4), 'float32')],
    'linalg_inv': [((2, 3, 3), 'float32')],
    'linalg_solve': [((3, 2), 'float32')],
    'linalg_multi_dot': [((2, 5), 'float32')],
    'baddbmm': [((2, 3, 5), 'float32')],
    'unfold': [((2, 27, 16), 'float32')],
    'grid_sample': [((1, 2, 3, 3), 'float32')],
    'pixel_shuffle': [((1, 2, 6, 6), 'float32')],
    'conv_transpose1d': [((2, 3, 7), 'float32')],
    'max_pool3d': [((2, 3, 2, 2, 2), 'float32')],
    'instance_norm': [((2, 3, 5, 5), 'float32')],
    'binary_cross_entropy': [((), 'float32')],
    'triplet_margin_loss': [((), 'float32')],
    'cross_entropy_probs': [((), 'float32')],
    'tril_indices': [((2, 6), 'int64')],
    'randperm': [((5,), 'int64')],
    'meshgrid': [((3, 4), 'float32'), ((3, 4), 'float32')],
    'block_diag': [((3, 5), 'float32')],
    'searchsorted': [((3, 2), 'int64')],
    'fft_rfft': [((4, 6), 'complex64')],
    'fft_irfftn': [((5, 4), 'float32')],
    'fft_fft2': [((4, 8), 'complex64')],
}


def _flat(r):
    if isinstance(r, (tuple, list)):
        return [t for x in r for t in _flat(x)]
    return [r]


def _spec(r):
    return [(tuple(t.shape), str(t.dtype).split(".")[-1]) for t in _flat(r)]


_CASES = dict(_cases())


def test_the_table_is_large_and_complete():
    assert len(_CASES) >= 60 and sorted(_CASES) == sorted(EXPECTED)


@pytest.mark.parametrize("name", list(_CASES))
def test_op_gives_torchs_meta_shape_and_dtype(name):
    got = _CASES[name](mt)
    assert all(t.is_meta and str(t.device) == "meta" for t in _flat(got)), name
    want = [(tuple(s), d) for s, d in EXPECTED[name]]
    assert _spec(got) == want
    if torch is not None:
        assert _spec(_CASES[name](torch)) == want


# --------------------------------------------------------------------------------------------
# The array layer: NumPy on meta arrays, against NumPy on real ones


def _numpy_calls() -> list:
    """(name, call): each call takes ``A(shape, dtype=float32)``, which makes an array."""
    i8, b = np.int64, np.bool_
    return [
        ("add_broadcast", lambda A: np.add(A((3, 1)), A((4,)))),
        ("weak_python_scalar", lambda A: A((3,), np.float16) + 1.5),
        ("divide_ints", lambda A: A((3,), i8) / A((3,), i8)),
        ("divmod_two_outputs", lambda A: np.divmod(A((2, 3)), 2.0)),
        ("frexp", lambda A: np.frexp(A((2,)))),
        ("reduce_axis", lambda A: np.add.reduce(A((2, 3, 4)), axis=1)),
        ("reduce_keepdims", lambda A: np.maximum.reduce(A((2, 3)), axis=None, keepdims=True)),
        ("reduce_int8_sum", lambda A: np.add.reduce(A((2, 3), np.int8), axis=0)),
        ("sum_method_int32", lambda A: A((2, 3), np.int32).sum(0)),
        ("mean_ints", lambda A: A((2, 3), i8).mean(axis=1)),
        ("std_keepdims", lambda A: np.std(A((2, 3)), axis=0, keepdims=True)),
        ("accumulate", lambda A: np.multiply.accumulate(A((2, 3)), axis=1)),
        ("cumsum_flat", lambda A: np.cumsum(A((2, 3), np.int32))),
        ("reduceat", lambda A: np.add.reduceat(A((6, 2)), [0, 2, 5])),
        ("ufunc_outer", lambda A: np.multiply.outer(A((2,)), A((3, 4)))),
        ("matmul_broadcast", lambda A: np.matmul(A((5, 1, 2, 3)), A((4, 3, 6)))),
        ("matmul_1d", lambda A: A((3,)) @ A((3, 2))),
        ("dot_nd", lambda A: np.dot(A((2, 3, 4)), A((5, 4, 6)))),
        ("dot_method_vector", lambda A: A((3, 4)).dot(A((4,)))),
        ("einsum_ellipsis", lambda A: np.einsum("...ij,jk->...ik", A((2, 3, 4)), A((4, 5)))),
        ("einsum_implicit", lambda A: np.einsum("ij,jk", A((3, 4)), A((4, 5)))),
        ("einsum_diagonal", lambda A: np.einsum("ii->i", A((3, 3)))),
        ("tensordot", lambda A: np.tensordot(A((2, 3, 4)), A((4, 3, 5)), axes=([1, 2], [1, 0]))),
        ("concatenate_promotes", lambda A: np.concatenate([A((2, 3)), A((1, 3), i8)])),
        ("concatenate_flat", lambda A: np.concatenate([A((2, 3)), A((4,))], axis=None)),
        ("stack", lambda A: np.stack([A((2, 3)), A((2, 3))], axis=-1)),
        ("where", lambda A: np.where(A((2, 1), b), A((3,)), 0)),
        ("take", lambda A: np.take(A((4, 5)), [[0, 1, 2]], axis=1)),
        ("take_along_axis", lambda A: np.take_along_axis(A((4, 5)), A((4, 2), i8), axis=1)),
        ("pad", lambda A: np.pad(A((2, 3)), ((1, 2), (0, 3)))),
        ("repeat", lambda A: np.repeat(A((2, 3)), 2, axis=1)),
        ("tile", lambda A: np.tile(A((2, 3)), (2, 1, 2))),
        ("argmax", lambda A: np.argmax(A((2, 3)), axis=0)),
        ("argsort_method", lambda A: A((2, 3)).argsort(axis=1)),
        ("sort_flat", lambda A: np.sort(A((2, 3)), axis=None)),
        ("clip", lambda A: np.clip(A((2, 3)), 0, 1)),
        ("astype", lambda A: A((2, 3)).astype(np.float16)),
        ("copy", lambda A: A((2, 3)).copy()),
        ("ravel_transposed", lambda A: A((2, 3)).T.ravel()),
        ("getitem_arrays_apart", lambda A: A((4, 5, 6))[[0, 1], :, [2, 3]]),
        ("getitem_arrays_together", lambda A: A((4, 5, 6))[:, [[0], [1]], [2, 3]]),
        ("getitem_ellipsis_newaxis", lambda A: A((4, 5, 6))[..., None, 1:3]),
        ("getitem_int_array", lambda A: A((4, 5))[A((7,), i8)]),
        ("view_other_itemsize", lambda A: A((2, 4)).view(np.int16)),
        ("tril", lambda A: np.tril(A((3, 4)))),
        ("diff", lambda A: np.diff(A((3, 5)), axis=1)),
        ("sliding_window_view",
         lambda A: np.lib.stride_tricks.sliding_window_view(A((6, 5)), (3, 2))),
        ("linalg_inv", lambda A: np.linalg.inv(A((2, 3, 3)))),
        ("linalg_svd", lambda A: np.linalg.svd(A((4, 3)), full_matrices=False)),
        ("linalg_qr", lambda A: np.linalg.qr(A((4, 3)))),
        ("linalg_eigh", lambda A: np.linalg.eigh(A((3, 3)))),
        ("linalg_norm", lambda A: np.linalg.norm(A((3, 4)), axis=1)),
        ("linalg_solve", lambda A: np.linalg.solve(A((2, 3, 3)), A((2, 3, 1)))),
        ("zeros_like_dtype", lambda A: np.zeros_like(A((2, 3)), dtype=np.int8)),
        ("median", lambda A: np.median(A((2, 3)), axis=1)),
        ("isin", lambda A: np.isin(A((2, 3)), [1, 2])),
        ("broadcast_to", lambda A: np.broadcast_to(A((3, 1)), (2, 3, 4))),
        ("split", lambda A: np.split(A((6, 2)), 3)),
        ("round_decimals", lambda A: np.round(A((2, 3)), 2)),
        ("conj", lambda A: A((2,), np.complex64).conj()),
        ("angle", lambda A: np.angle(A((2,), np.complex128))),
        ("fft_n", lambda A: np.fft.fft(A((3, 4)), n=6)),
        ("rfftn_s", lambda A: np.fft.rfftn(A((4, 6)), s=(3, 5), axes=(0, 1))),
        ("irfft_axis", lambda A: np.fft.irfft(A((4, 5), np.complex64), axis=0)),
        ("hfft2", lambda A: np.fft.irfft2(A((2, 4, 5), np.complex128), s=(3, 6))),
        ("nanmean_ints", lambda A: np.nanmean(A((2, 3), i8), axis=0)),
        ("nanmax_keepdims", lambda A: np.nanmax(A((2, 3)), axis=1, keepdims=True)),
        ("cumprod_int8", lambda A: np.cumprod(A((2, 3), np.int8), axis=1)),
        ("cross_broadcast", lambda A: np.cross(A((4, 3)), A((3,)))),
        ("diag_of_matrix", lambda A: np.diag(A((3, 5)), 1)),
        ("diag_of_vector", lambda A: np.diag(A((3,)), -1)),
        ("block", lambda A: np.block([[A((2, 2)), A((2, 3))], [A((1, 5), i8)]])),
        ("iscomplex", lambda A: np.iscomplex(A((2, 3)))),
    ]


def _real(shape, dtype=np.float32):
    rng = np.random.default_rng(0)  # values matter to nothing but linalg's solvability
    if np.dtype(dtype).kind in "iub":
        return np.zeros(shape, dtype)
    return (rng.standard_normal(shape) + 3 * np.eye(*shape[-2:]) if len(shape) > 1
            else rng.standard_normal(shape)).astype(dtype)


def _meta(shape, dtype=np.float32):
    return _backend.meta_array(shape, dtype)


_NUMPY = dict(_numpy_calls())


@pytest.mark.parametrize("name", list(_NUMPY))
def test_numpy_on_meta_arrays_gives_numpys_shapes_and_dtypes(name):
    with np.errstate(all="ignore"):
        want = _NUMPY[name](_real)
    got = _NUMPY[name](_meta)
    got_l, want_l = _flat(got), _flat(want)
    assert all(isinstance(g, _backend.MetaArray) for g in got_l), [type(g) for g in got_l]
    assert [(g.shape, g.dtype) for g in got_l] == [(np.shape(w), np.asarray(w).dtype)
                                                   for w in want_l]


def test_shape_errors_are_numpys():
    a, b = _meta((3, 4)), _meta((5, 6))
    with pytest.raises(ValueError, match="mismatch in its core dimension"):
        np.matmul(a, b)
    with pytest.raises(ValueError):
        np.add(a, b)
    with pytest.raises(ValueError, match="concatenation axis"):
        np.concatenate([a, b])
    with pytest.raises(np.exceptions.AxisError):
        np.add.reduce(a, axis=2)
    with pytest.raises(ValueError, match="no identity"):
        np.maximum.reduce(_meta((0, 3)), axis=0)
    with pytest.raises(IndexError):
        a[4]


def test_meta_results_go_into_meta_outputs_only():
    a, out = _meta((3, 4)), _meta((3, 4))
    assert np.add(a, 1, out=out) is out
    assert np.matmul(a, _meta((4, 4)), out=out) is out
    real = np.zeros((3, 4), np.float32)
    with pytest.raises(NotImplementedError, match="storage"):
        np.add(a, 1, out=real)
    with pytest.raises(NotImplementedError, match="storage"):
        np.copyto(real, a)
    assert np.copyto(out, real) is None  # into a meta array: nothing to write
    with pytest.raises(NotImplementedError, match="storage"):
        np.add.at(real, ([0, 1], [2, 3]), a[0, :2])


def test_meta_arrays_copy_and_pickle_as_meta():
    import copy
    import pickle

    a = _meta((3, 4))
    for b in (copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a)), a.copy()):
        assert isinstance(b, _backend.MetaArray) and b.shape == (3, 4) and b.strides == (0, 0)
    assert "shape=(3, 4)" in repr(a) and "0." not in repr(a)


def test_the_array_module_of_a_meta_array_makes_meta_arrays():
    xp = _backend.array_module(_meta((2,)))
    made = [xp.zeros((2, 3)), xp.empty(4, np.int8), xp.ones((1,)), xp.full((2,), 1.5),
            xp.arange(2, 11, 3), xp.eye(3, 2), xp.asarray([[1, 2]]), xp.linspace(0, 1, 7),
            xp.lib.stride_tricks.as_strided(_meta((5,)), (2, 3), (0, 0))]
    want = [((2, 3), np.float64), ((4,), np.int8), ((1,), np.float64), ((2,), np.float64),
            ((3,), np.int64), ((3, 2), np.float64), ((1, 2), np.int64), ((7,), np.float64),
            ((2, 3), np.float32)]
    assert all(isinstance(m, _backend.MetaArray) for m in made)
    assert [(m.shape, m.dtype) for m in made] == [(s, np.dtype(d)) for s, d in want]
    assert xp.float32 is np.float32 and xp.add is np.add


# --------------------------------------------------------------------------------------------
# No storage, no values


def test_huge_shapes_allocate_nothing():
    """A 100000 x 100000 float32 result would take 40 GB: none of these allocates it."""
    a = mt.empty(100_000, 100_000, device="meta")
    w = mt.empty(100_000, 100_000, device="meta")
    tracemalloc.start()
    try:
        outs = [a @ w, a + a, a * 2 - 1, a.sum(0), a.softmax(-1), mt.cat([a, a]),
                mt.nn.functional.linear(a, w), mt.relu(a).mean(), a.t().contiguous(),
                a[a.long()[0]]]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    big = (100_000, 100_000)
    assert [tuple(o.shape) for o in outs] == [big] * 3 + [(100_000,), big, (200_000, 100_000),
                                                         big, (), big, big]
    assert all(o.is_meta for o in outs)


def test_values_never_come_out():
    x = E(mt, 2, 3)
    reads = [lambda: x.sum().item(), lambda: bool(x[0, 0] > 0), lambda: x.tolist(),
             lambda: float(x[0, 0]), lambda: int(x[0, 0]), lambda: x.numpy(),
             lambda: (x == x).all().item(), lambda: x._data.tobytes(),
             lambda: mt.allclose(x, x), lambda: [1, 2, 3][I(mt)],
             lambda: format(x._data[0, 0], ".2f"), lambda: 0.5 in x._data,
             lambda: float(list(x._data[0])[1]), lambda: np.asarray(x)]
    for i, read in enumerate(reads):
        with pytest.raises(NotImplementedError, match="meta tensor"):
            read()
            pytest.fail(f"read {i} gave a value")
    with pytest.raises(NotImplementedError, match="meta tensor"):
        if x.max() > 0:
            pass
    assert repr(x.sum()) == "tensor(..., device='meta', size=())"


def test_shapes_that_depend_on_values_are_refused():
    x = E(mt, 3, 4)
    for call in (lambda: x[x > 0], lambda: x.nonzero(), lambda: mt.unique(x),
                 lambda: x.masked_select(x > 0), lambda: I(mt, 3).bincount()):
        with pytest.raises(NotImplementedError):
            call()


def test_meta_and_cpu_tensors_do_not_mix_as_in_torch():
    x = E(mt, 3, 4)
    for call in (lambda: x + mt.ones(3, 4), lambda: mt.ones(3, 4) * x,
                 lambda: mt.ones(3, 4).copy_(x), lambda: mt.cat([x, mt.ones(3, 4)]),
                 lambda: mt.stack([mt.ones(3, 4), x]), lambda: mt.where(x > 0, mt.ones(3, 4), x)):
        with pytest.raises((RuntimeError, NotImplementedError)):
            call()
    for ok in (x + mt.tensor(2.0), x * 3, 1 - x, x.copy_(mt.ones(3, 4)),
               mt.where(x > 0, mt.tensor(1.0), 0.0)):
        assert ok.is_meta and tuple(ok.shape) == (3, 4)
    if torch is not None:
        with pytest.raises(RuntimeError):
            E(torch, 3, 4) + torch.ones(3, 4)


def test_in_place_fills_and_init_keep_meta_and_draw_nothing():
    import mpitensor.nn.init as init

    mt.manual_seed(0)
    want = mt.rand(3)
    mt.manual_seed(0)
    x = E(mt, 4, 6)
    fills = [x.uniform_, x.normal_, x.zero_, lambda: x.add_(1), lambda: x.mul_(x),
             lambda: x.random_(0, 5), lambda: x.bernoulli_(0.5), lambda: x.exponential_(),
             lambda: x.clamp_(0, 1), lambda: x.copy_(mt.ones(4, 6)),
             lambda: x.__setitem__((0, slice(None)), 2.0)]
    fills += [lambda f=f: f(x) for f in (init.kaiming_uniform_, init.kaiming_normal_,
                                         init.xavier_uniform_, init.xavier_normal_,
                                         init.trunc_normal_, init.orthogonal_, init.zeros_,
                                         init.ones_, init.eye_, init.normal_, init.uniform_)]
    for fill in fills:
        fill()
        assert x.is_meta and tuple(x.shape) == (4, 6) and x._data.strides == (0, 0)
    np.testing.assert_array_equal(mt.rand(3).numpy(), want.numpy())


# --------------------------------------------------------------------------------------------
# Autograd and whole models, written as a torch user writes them


def _cnn(nn):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, stride=2), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                         nn.Linear(16, 10))


def _transformer(torch):
    nn = torch.nn

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2)
            self.head = nn.Linear(16, 50)

        def forward(self, tokens):
            return self.head(self.enc(self.emb(tokens)))

    return TinyLM()


def _shapes_on_meta(torch):
    """The user's program on the meta device: build, run forward and backward, read shapes."""
    out = {}
    with torch.device("meta"):
        cnn = _cnn(torch.nn)
        lm = _transformer(torch)
        images = torch.empty(4, 3, 16, 16)
        labels = torch.zeros(4, dtype=torch.long)
        tokens = torch.zeros(2, 7, dtype=torch.long)
        rnn = torch.nn.LSTM(16, 8, num_layers=2, batch_first=True, bidirectional=True)
    logits = cnn(images)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()
    out["cnn"] = (tuple(logits.shape), tuple(loss.shape))
    scores = lm(tokens)
    torch.nn.functional.cross_entropy(scores.reshape(-1, 50), tokens.reshape(-1)).backward()
    out["lm"] = tuple(scores.shape)
    seq, (h, c) = rnn(lm.emb(tokens).detach())
    (seq.sum() + h.sum()).backward()
    out["rnn"] = (tuple(seq.shape), tuple(h.shape), tuple(c.shape))
    params = [p for m in (cnn, lm, rnn) for p in m.parameters()]
    out["params"] = sum(p.numel() for p in params)
    out["meta"] = all(t.is_meta for t in (logits, loss, scores, seq, h, *params))
    out["grads"] = [(tuple(p.grad.shape), p.grad.is_meta) for p in params]
    assert out["grads"] == [(tuple(p.shape), True) for p in params]
    return out


def test_models_run_forward_and_backward_on_meta_as_torchs():
    got = _shapes_on_meta(mt)
    assert got["cnn"] == ((4, 10), ()) and got["lm"] == (2, 7, 50)
    assert got["rnn"] == ((2, 7, 16), (4, 2, 8), (4, 2, 8)) and got["meta"]
    if torch is not None:
        assert got == _shapes_on_meta(torch)


def test_a_meta_model_made_real_computes_what_a_cpu_model_does():
    """Meta first, then memory (``to_empty``) and values (``reset_parameters`` drawn in
    construction order, or a state dict): the same numbers as the model built on the CPU."""
    torch = mt  # the user's spelling: import mpitensor as torch
    torch.manual_seed(0)
    ref_cnn = _cnn(torch.nn)
    ref_lm = _transformer(torch)
    torch.manual_seed(0)
    with torch.device("meta"):
        cnn = _cnn(torch.nn)
        lm = _transformer(torch)
    cnn.to_empty(device="cpu")
    for m in cnn.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    lm.to_empty(device="cpu").load_state_dict(ref_lm.state_dict())
    assert not any(p.is_meta for p in (*cnn.parameters(), *lm.parameters()))
    torch.manual_seed(1)
    images = torch.randn(4, 3, 16, 16)
    tokens = torch.randint(0, 50, (2, 7))
    for model, ref, x in ((cnn.eval(), ref_cnn.eval(), images), (lm, ref_lm, tokens)):
        y, y_ref = model(x), ref(x)
        y.square().mean().backward()
        y_ref.square().mean().backward()
        np.testing.assert_array_equal(y.detach().numpy(), y_ref.detach().numpy())
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy(), err_msg=name)


def test_optimizers_step_meta_parameters():
    with mt.device("meta"):
        m = mt.nn.Linear(3, 2)
    m(E(mt, 4, 3)).sum().backward()
    for opt in (mt.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                mt.optim.AdamW(m.parameters(), lr=0.1)):
        opt.step()
        opt.zero_grad()
    assert all(p.is_meta and p._data.strides == (0,) * p.ndim for p in m.parameters())


def _big_calls(A) -> list:
    """NumPy calls on 2000 x 2000 arrays (16 MB a result): functions with a rule, and those
    whose NumPy code runs on the meta arrays (each of its steps must stay meta)."""
    n, i8 = 2000, np.int64
    sq = (n, n)
    return [
        np.sum(A(sq), 0), np.std(A(sq), 0), np.max(A(sq), 1), np.any(A(sq), 0),
        np.cumsum(A(sq)), A(sq).cumprod(1), np.clip(A(sq), 0, 1), np.round(A(sq), 2),
        np.stack([A(sq), A(sq)]), np.hstack([A(sq), A(sq)]), np.tile(A(sq), 2),
        np.tensordot(A((n, 30)), A((30, n)), 1), np.take_along_axis(A(sq), A((n, 2), i8), 1),
        np.meshgrid(A((n,)), A((n,))), np.kron(A((n, 10)), A((10, n // 10))),
        np.nansum(A(sq), 0), np.nanmean(A(sq)), np.cross(A((n * 10, 3)), A((n * 10, 3))),
        np.diag(A((n,))), np.block([[A(sq), A((n, 5))], [A((2, n + 5))]]), np.isreal(A(sq)),
        np.fft.fftshift(A(sq)), np.fft.rfft2(A(sq)), np.flip(A(sq)), np.rot90(A(sq)),
        np.ravel(A(sq).T), np.tril(A(sq)), np.diff(A(sq)), np.pad(A(sq), 2),
        np.sort(A(sq)), np.repeat(A(sq), 2, 0), np.median(A(sq), 0),
        np.einsum("ij,jk->ik", A(sq), A(sq)), np.where(A(sq, np.bool_), A(sq), 0),
        np.concatenate([A(sq), A(sq)]), A(sq)[A((n,), i8)], np.linalg.inv(A((4, n, n))),
        np.matmul(A(sq), A(sq)), np.multiply.outer(A((n,)), A((n,))),
    ]


def test_numpy_functions_on_meta_arrays_allocate_nothing():
    tracemalloc.start()
    try:
        outs = _big_calls(_meta)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert all(isinstance(o, _backend.MetaArray) for o in _flat(outs))


def test_layers_at_full_scale_allocate_nothing_forward_and_backward():
    """A ResNet stage at batch 64 and a transformer layer on 32 x 128 tokens: every kernel's
    path (Winograd, im2col bands, pooling scatters, attention) stays on the meta device."""
    nn = mt.nn
    with mt.device("meta"):
        stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64),
                             nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.Conv2d(64, 128, 3, padding=1),
                             nn.AvgPool2d(3, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(128, 1000))
        layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        lstm = nn.LSTM(512, 512, batch_first=True)
        images = mt.empty(64, 3, 224, 224)
        tokens = mt.empty(32, 128, 512)
    tracemalloc.start()
    try:
        logits = stem(images)
        seq = lstm(layer(tokens))[0]
        (logits.sum() + seq.sum()).backward()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    assert tuple(logits.shape) == (64, 1000) and tuple(seq.shape) == (32, 128, 512)
    params = [*stem.parameters(), *layer.parameters(), *lstm.parameters()]
    assert all(p.grad.is_meta and p.grad.shape == p.shape for p in params)
