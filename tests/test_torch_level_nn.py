"""torch's neural-network functions at its top level (``torch.conv2d``, ``torch.layer_norm``,
``torch.dropout(x, p, train)``, ``torch.embedding(weight, idx)``, ...), called the way torch
programs call them.

Every case runs one call written once for both libraries (``lib.conv2d(...)`` with ``lib``
mpitensor or torch) and checks: the same value and input gradients as the matching
``mpitensor.nn.functional`` call (always; this is the argument conversion), and the same value,
dtype and gradients as torch 2.13 (the oracle half, skipped without torch; float64 to 1e-10
relative, float32 to 1e-5). Then the random functions by their laws, the recurrent functions
with flat weights, bad inputs, and a small CNN trained 3 SGD steps under both libraries.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn.functional as F
from tests.nn_oracle import both, close

RNG = np.random.default_rng(7)
TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _r(*shape):
    return RNG.standard_normal(shape)


def _pos(*shape):
    return RNG.uniform(0.5, 2.0, shape)


def _idx(n, *shape):
    return RNG.integers(0, n, shape).astype(np.int64)


def _probs(*shape):
    a = RNG.uniform(0.1, 1.0, shape)
    return a / a.sum(-1, keepdims=True)


def _signs(*shape):
    return RNG.choice([-1.0, 1.0], shape)


# name: (call(lib, *tensors), reference(F, *tensors) or None, arrays)
CASES = {
    "conv1d": (lambda L, x, w, b: L.conv1d(x, w, b, 2, 1),
               lambda F, x, w, b: F.conv1d(x, w, b, 2, 1), [_r(2, 3, 9), _r(4, 3, 3), _r(4)]),
    "conv1d_kw": (lambda L, x, w: L.conv1d(x, w, padding="same", dilation=[2]),
                  lambda F, x, w: F.conv1d(x, w, padding="same", dilation=2),
                  [_r(2, 3, 9), _r(4, 3, 3)]),
    "conv2d": (lambda L, x, w, b: L.conv2d(x, w, b, [2, 1], [1, 0]),
               lambda F, x, w, b: F.conv2d(x, w, b, (2, 1), (1, 0)),
               [_r(2, 4, 7, 6), _r(6, 4, 3, 3), _r(6)]),
    "conv2d_groups": (lambda L, x, w: L.conv2d(x, w, stride=1, padding=1, groups=2),
                      lambda F, x, w: F.conv2d(x, w, None, 1, 1, 1, 2),
                      [_r(1, 4, 5, 5), _r(6, 2, 3, 3)]),
    "conv3d": (lambda L, x, w, b: L.conv3d(x, w, b, 1, [1, 0, 1]),
               lambda F, x, w, b: F.conv3d(x, w, b, 1, (1, 0, 1)),
               [_r(1, 2, 4, 5, 4), _r(3, 2, 2, 3, 2), _r(3)]),
    "conv_transpose1d": (lambda L, x, w, b: L.conv_transpose1d(x, w, b, 2, 1, 1),
                         lambda F, x, w, b: F.conv_transpose1d(x, w, b, 2, 1, 1),
                         [_r(2, 3, 5), _r(3, 2, 3), _r(2)]),
    "conv_transpose2d": (lambda L, x, w: L.conv_transpose2d(x, w, None, [2, 2], 1, 1, 1, 1),
                         lambda F, x, w: F.conv_transpose2d(x, w, None, 2, 1, 1, 1, 1),
                         [_r(1, 2, 4, 4), _r(2, 3, 3, 3)]),
    "conv_transpose3d": (lambda L, x, w: L.conv_transpose3d(x, w, stride=2),
                         lambda F, x, w: F.conv_transpose3d(x, w, stride=2),
                         [_r(1, 2, 3, 2, 3), _r(2, 2, 2, 2, 2)]),
    "convolution": (lambda L, x, w, b: L.convolution(x, w, b, [2, 1], [1], [1], False, [0], 1),
                    lambda F, x, w, b: F.conv2d(x, w, b, (2, 1), 1),
                    [_r(2, 3, 6, 5), _r(4, 3, 3, 3), _r(4)]),
    "convolution_t": (lambda L, x, w: L.convolution(x, w, None, [2], [1], [1], True, [1], 2),
                      lambda F, x, w: F.conv_transpose1d(x, w, None, 2, 1, 1, 2),
                      [_r(2, 4, 5), _r(4, 3, 3)]),
    "conv_tbc": (lambda L, x, w, b: L.conv_tbc(x, w, b, 1),
                 lambda F, x, w, b: F.conv_tbc(x, w, b, 1), [_r(6, 2, 3), _r(3, 3, 4), _r(4)]),
    "batch_norm_eval": (lambda L, x, w, b: L.batch_norm(x, w, b, L.tensor([0.1, -0.2, 0.3]).to(
        x.dtype), L.tensor([1.5, 0.5, 2.0]).to(x.dtype), False, 0.1, 1e-5, True), None,
        [_r(4, 3, 5), _r(3), _r(3)]),
    "batch_norm_train": (lambda L, x, w, b: L.batch_norm(x, w, b, None, None, True, 0.1, 1e-5,
                                                         False),
                         lambda F, x, w, b: F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5),
                         [_r(4, 3, 2, 2), _r(3), _r(3)]),
    "layer_norm": (lambda L, x, w, b: L.layer_norm(x, [4, 5], w, b),
                   lambda F, x, w, b: F.layer_norm(x, (4, 5), w, b),
                   [_r(3, 4, 5), _r(4, 5), _r(4, 5)]),
    "layer_norm_kw": (lambda L, x: L.layer_norm(x, (5,), eps=1e-3, cudnn_enable=False),
                      lambda F, x: F.layer_norm(x, (5,), eps=1e-3), [_r(3, 5)]),
    "group_norm": (lambda L, x, w, b: L.group_norm(x, 2, w, b, 1e-5, True),
                   lambda F, x, w, b: F.group_norm(x, 2, w, b, 1e-5),
                   [_r(2, 4, 3, 3), _r(4), _r(4)]),
    "instance_norm": (lambda L, x, w, b: L.instance_norm(x, w, b, None, None, True, 0.1, 1e-5,
                                                         False),
                      lambda F, x, w, b: F.instance_norm(x, None, None, w, b, True, 0.1, 1e-5),
                      [_r(2, 3, 6), _r(3), _r(3)]),
    "rms_norm": (lambda L, x, w: L.rms_norm(x, [6], w, eps=1e-6),
                 lambda F, x, w: F.rms_norm(x, (6,), w, 1e-6), [_r(3, 6), _r(6)]),
    "embedding": (lambda L, w, i: L.embedding(w, i),
                  lambda F, w, i: F.embedding(i, w), [_r(7, 3), _idx(7, 2, 5)]),
    "embedding_pad": (lambda L, w, i: L.embedding(w, i, 2, True),
                      lambda F, w, i: F.embedding(i, w, 2, scale_grad_by_freq=True),
                      [_r(7, 3), np.array([[2, 1, 1, 4], [0, 2, 6, 1]])]),
    "embedding_neg_pad": (lambda L, w, i: L.embedding(w, i, padding_idx=-1),
                          lambda F, w, i: F.embedding(i, w), [_r(7, 3), _idx(7, 6)]),
    "embedding_bag_mean": (lambda L, w, i, o: L.embedding_bag(w, i, o, False, 1),
                           None, [_r(8, 3), _idx(8, 9), np.array([0, 2, 2, 6])]),
    "embedding_bag_max": (lambda L, w, i, o: L.embedding_bag(w, i, o, mode=2,
                                                             include_last_offset=True),
                          None, [_r(8, 3), _idx(8, 9), np.array([0, 3, 4, 9])]),
    "embedding_bag_sum": (lambda L, w, i, o: L.embedding_bag(w, i, o), None,
                          [_r(8, 3), _idx(8, 7), np.array([0, 3, 3])]),
    "embedding_bag_sum_pad": (lambda L, w, i, o: L.embedding_bag(w, i, o, False, 0, False,
                                                                 None, False, 1),
                              None, [_r(8, 3), np.array([1, 2, 1, 5, 0, 1]),
                                     np.array([0, 2, 3])]),
    "embedding_bag_psw": (lambda L, w, i, o, p: L.embedding_bag(w, i, o, per_sample_weights=p),
                          lambda F, w, i, o, p: F.embedding_bag(i, w, o, mode="sum",
                                                                per_sample_weights=p),
                          [_r(8, 3), _idx(8, 6), np.array([0, 4]), _r(6)]),
    "pairwise_distance": (lambda L, a, b: L.pairwise_distance(a, b, 3.0, 1e-6, True),
                          lambda F, a, b: F.pairwise_distance(a, b, 3.0, 1e-6, True),
                          [_r(4, 5), _r(4, 5)]),
    "cosine_similarity": (lambda L, a, b: L.cosine_similarity(a, b, dim=0),
                          lambda F, a, b: F.cosine_similarity(a, b, 0), [_r(4, 5), _r(4, 5)]),
    "pdist": (lambda L, a: L.pdist(a, 1.5), lambda F, a: F.pdist(a, 1.5), [_r(5, 3)]),
    "prelu": (lambda L, x, w: L.prelu(x, w), lambda F, x, w: F.prelu(x, w),
              [_r(2, 3, 4), _pos(3)]),
    "prelu_method": (lambda L, x, w: x.prelu(w), lambda F, x, w: F.prelu(x, w),
                     [_r(2, 3, 4), _pos(1)]),
    "selu": (lambda L, x: L.selu(x), lambda F, x: F.selu(x), [_r(3, 4)]),
    "celu": (lambda L, x: L.celu(x, 0.7), lambda F, x: F.celu(x, 0.7), [_r(3, 4)]),
    "celu_kw": (lambda L, x: L.celu(input=x, alpha=2.0), lambda F, x: F.celu(x, 2.0),
                [_r(3, 4)]),
    "rrelu_eval": (lambda L, x: L.rrelu(x, 0.1, 0.3), lambda F, x: F.rrelu(x, 0.1, 0.3),
                   [_r(3, 4)]),
    "threshold": (lambda L, x: L.threshold(x, 0.2, -1.0),
                  lambda F, x: F.threshold(x, 0.2, -1.0), [_r(3, 4)]),
    "hardshrink": (lambda L, x: L.hardshrink(x, 0.4), lambda F, x: F.hardshrink(x, 0.4),
                   [_r(3, 4)]),
    "hardshrink_method": (lambda L, x: x.hardshrink(), lambda F, x: F.hardshrink(x),
                          [_r(3, 4)]),
    "pixel_shuffle": (lambda L, x: L.pixel_shuffle(x, 2), lambda F, x: F.pixel_shuffle(x, 2),
                      [_r(1, 8, 2, 3)]),
    "pixel_unshuffle": (lambda L, x: L.pixel_unshuffle(x, 2),
                        lambda F, x: F.pixel_unshuffle(x, 2), [_r(1, 2, 4, 6)]),
    "channel_shuffle": (lambda L, x: L.channel_shuffle(x, 3),
                        lambda F, x: F.channel_shuffle(x, 3), [_r(2, 6, 2)]),
    "native_channel_shuffle": (lambda L, x: L.native_channel_shuffle(x, 2),
                               lambda F, x: F.channel_shuffle(x, 2), [_r(2, 6, 2)]),
    "max_pool1d": (lambda L, x: L.max_pool1d(x, 3), lambda F, x: F.max_pool1d(x, 3),
                   [_r(2, 3, 10)]),
    "max_pool1d_args": (lambda L, x: L.max_pool1d(x, [3], [2], [1], [1], True),
                        lambda F, x: F.max_pool1d(x, 3, 2, 1, 1, True), [_r(2, 3, 10)]),
    "max_pool2d": (lambda L, x: L.max_pool2d(x, 2), lambda F, x: F.max_pool2d(x, 2),
                   [_r(2, 3, 6, 5)]),
    "max_pool2d_args": (lambda L, x: L.max_pool2d(x, [3, 2], [], 1, 1, ceil_mode=True),
                        lambda F, x: F.max_pool2d(x, (3, 2), None, 1, 1, True),
                        [_r(2, 3, 7, 5)]),
    "max_pool3d": (lambda L, x: L.max_pool3d(x, 2, stride=1, dilation=[1, 2, 1]),
                   lambda F, x: F.max_pool3d(x, 2, 1, 0, (1, 2, 1)), [_r(1, 2, 4, 5, 4)]),
    "max_pool1d_with_indices": (lambda L, x: L.max_pool1d_with_indices(x, 2, 2),
                                lambda F, x: F.max_pool1d(x, 2, 2, return_indices=True),
                                [_r(2, 3, 9)]),
    "avg_pool1d": (lambda L, x: L.avg_pool1d(x, 3, [2], 1, False, False),
                   lambda F, x: F.avg_pool1d(x, 3, 2, 1, False, False), [_r(2, 3, 9)]),
    "adaptive_avg_pool1d": (lambda L, x: L.adaptive_avg_pool1d(x, [4]),
                            lambda F, x: F.adaptive_avg_pool1d(x, 4), [_r(2, 3, 9)]),
    "adaptive_max_pool1d": (lambda L, x: L.adaptive_max_pool1d(x, 4),
                            lambda F, x: F.adaptive_max_pool1d(x, 4, True), [_r(2, 3, 9)]),
    "bilinear": (lambda L, a, b, w, c: L.bilinear(a, b, w, c),
                 lambda F, a, b, w, c: F.bilinear(a, b, w, c),
                 [_r(4, 3), _r(4, 2), _r(5, 3, 2), _r(5)]),
    "kl_div": (lambda L, x, t: L.kl_div(x, t), lambda F, x, t: F.kl_div(
        x, t, reduction="none"), [np.log(_probs(3, 4)), _probs(3, 4)]),
    "kl_div_mean": (lambda L, x, t: L.kl_div(x, t, 1), lambda F, x, t: F.kl_div(
        x, t, reduction="sum") / x.numel(), [np.log(_probs(3, 4)), _probs(3, 4)]),
    "kl_div_log_target": (lambda L, x, t: L.kl_div(x, t, 0, log_target=True),
                          lambda F, x, t: F.kl_div(x, t, reduction="none", log_target=True),
                          [np.log(_probs(3, 4)), np.log(_probs(3, 4))]),
    "cosine_embedding_loss": (lambda L, a, b, t: L.cosine_embedding_loss(a, b, t, 0.1, 2),
                              lambda F, a, b, t: F.cosine_embedding_loss(a, b, t, 0.1,
                                                                         reduction="sum"),
                              [_r(5, 3), _r(5, 3), np.array([1, -1, 1, -1, -1])]),
    "hinge_embedding_loss": (lambda L, x, t: L.hinge_embedding_loss(x, t, 0.5, 0),
                             lambda F, x, t: F.hinge_embedding_loss(x, t, 0.5,
                                                                    reduction="none"),
                             [_r(4, 3), _signs(4, 3)]),
    "margin_ranking_loss": (lambda L, a, b, t: L.margin_ranking_loss(a, b, t, margin=0.2),
                            lambda F, a, b, t: F.margin_ranking_loss(a, b, t, 0.2,
                                                                     reduction="none"),
                            [_r(6), _r(6), _signs(6)]),
    "triplet_margin_loss": (lambda L, a, p, n: L.triplet_margin_loss(a, p, n, 1.0, 2.0, 1e-6,
                                                                     True, 1),
                            lambda F, a, p, n: F.triplet_margin_loss(a, p, n, swap=True),
                            [_r(4, 3), _r(4, 3), _r(4, 3)]),
    "triplet_margin_loss_default": (lambda L, a, p, n: L.triplet_margin_loss(a, p, n),
                                    lambda F, a, p, n: F.triplet_margin_loss(
                                        a, p, n, reduction="none"),
                            [_r(4, 3), _r(4, 3), _r(4, 3)]),
    "poisson_nll_loss": (lambda L, x, t: L.poisson_nll_loss(x, t, True, False, 1e-8, 1),
                         lambda F, x, t: F.poisson_nll_loss(x, t), [_r(3, 4), _pos(3, 4)]),
    "poisson_nll_loss_full": (lambda L, x, t: L.poisson_nll_loss(x, t, False, True, 1e-6, 2),
                              lambda F, x, t: F.poisson_nll_loss(x, t, False, True, eps=1e-6,
                                                                 reduction="sum"),
                              [_pos(3, 4), _pos(3, 4) * 3]),
    "bce_with_logits": (lambda L, x, t, w, p: L.binary_cross_entropy_with_logits(
        x, t, w.detach(), p.detach(), 2),
                        lambda F, x, t, w, p: F.binary_cross_entropy_with_logits(
                            x, t, w.detach(), reduction="sum", pos_weight=p.detach()),
                        [_r(3, 4), RNG.uniform(0, 1, (3, 4)), _pos(4), _pos(4)]),
    "bce_with_logits_default": (lambda L, x, t: L.binary_cross_entropy_with_logits(x, t),
                                lambda F, x, t: F.binary_cross_entropy_with_logits(
                                    x, t, reduction="none"),
                                [_r(5), RNG.uniform(0, 1, 5)]),
    "constant_pad_nd": (lambda L, x: L.constant_pad_nd(x, [1, 2, -1, 1], 0.5),
                        lambda F, x: F.pad(x, (1, 2, -1, 1), value=0.5), [_r(2, 3, 4)]),
    "constant_pad_nd_default": (lambda L, x: L.constant_pad_nd(x, (2, 0)),
                                lambda F, x: F.pad(x, (2, 0)), [_r(3, 2)]),
    "grid_sampler": (lambda L, x, g: L.grid_sampler(x, g, 0, 0, False),
                     lambda F, x, g: F.grid_sample(x, g, align_corners=False),
                     [_r(1, 2, 4, 5), RNG.uniform(-1.1, 1.1, (1, 3, 2, 2))]),
    "grid_sampler_2d": (lambda L, x, g: L.grid_sampler_2d(x, g, 1, 1, True),
                        lambda F, x, g: F.grid_sample(x, g, "nearest", "border", True),
                        [_r(1, 2, 4, 5), RNG.uniform(-1.1, 1.1, (1, 3, 2, 2))]),
    "grid_sampler_3d": (lambda L, x, g: L.grid_sampler_3d(x, g, 0, 2, False),
                        lambda F, x, g: F.grid_sample(x, g, "bilinear", "reflection", False),
                        [_r(1, 2, 3, 4, 3), RNG.uniform(-1.1, 1.1, (1, 2, 2, 2, 3))]),
    "affine_grid_generator": (lambda L, t: L.affine_grid_generator(t, [2, 3, 4, 5], False),
                              lambda F, t: F.affine_grid(t, [2, 3, 4, 5], False),
                              [_r(2, 2, 3)]),
    "rnn_tanh_cell": (lambda L, x, h, a, b, c, d: L.rnn_tanh_cell(x, h, a, b, c, d), None,
                      [_r(3, 4), _r(3, 5), _r(5, 4), _r(5, 5), _r(5), _r(5)]),
    "rnn_relu_cell": (lambda L, x, h, a, b: L.rnn_relu_cell(x, h, a, b), None,
                      [_r(3, 4), _r(3, 5), _r(5, 4), _r(5, 5)]),
    "gru_cell": (lambda L, x, h, a, b, c, d: L.gru_cell(x, h, a, b, c, d), None,
                 [_r(3, 4), _r(3, 5), _r(15, 4), _r(15, 5), _r(15), _r(15)]),
    "lstm_cell": (lambda L, x, h, c, a, b, d, e: L.lstm_cell(x, [h, c], a, b, d, e)[0] * 2
                  + L.lstm_cell(x, (h, c), a, b, d, e)[1], None,
                  [_r(3, 4), _r(3, 5), _r(3, 5), _r(20, 4), _r(20, 5), _r(20), _r(20)]),
    "norm_except_dim": (lambda L, v: L.norm_except_dim(v, 2, 1),
                        lambda F, v: (v * v).sum((0, 2), keepdim=True).sqrt(), [_r(3, 4, 5)]),
    "norm_except_dim_0": (lambda L, v: L.norm_except_dim(v),
                          lambda F, v: (v * v).sum((1, 2), keepdim=True).sqrt(),
                          [_r(3, 4, 5)]),
    "norm_except_dim_whole": (lambda L, v: L.norm_except_dim(v, 3, -1),
                              lambda F, v: (v.abs() ** 3).sum() ** (1 / 3), [_r(3, 4)]),
    "frobenius_norm": (lambda L, x: L.frobenius_norm(x, [1, 2]),
                       lambda F, x: (x * x).sum((1, 2)).sqrt(), [_r(2, 3, 4)]),
    "frobenius_norm_keep": (lambda L, x: L.frobenius_norm(x, 0, True),
                            lambda F, x: (x * x).sum(0, keepdim=True).sqrt(), [_r(3, 4)]),
    "nuclear_norm": (lambda L, x: L.nuclear_norm(x), None, [_r(3, 4)]),
    "nuclear_norm_keep": (lambda L, x: L.nuclear_norm(x, True), None, [_r(2, 4, 3)]),
    "nuclear_norm_dim": (lambda L, x: L.nuclear_norm(x, [0, 2], keepdim=True), None,
                         [_r(3, 2, 4)]),
    "ctc_loss": (lambda L, lp, t, il, tl: L.ctc_loss(lp.log_softmax(2), t, il, tl, 0, 1, False),
                 lambda F, lp, t, il, tl: F.ctc_loss(lp.log_softmax(2), t, il, tl),
                 [_r(8, 2, 5), RNG.integers(1, 5, (2, 3)), np.array([8, 6]),
                  np.array([3, 2])]),
    "ctc_loss_none": (lambda L, lp, t, il, tl: L.ctc_loss(lp.log_softmax(2), t, [8, 7],
                                                          [3, 1], reduction=0),
                      lambda F, lp, t, il, tl: F.ctc_loss(lp.log_softmax(2), t, [8, 7], [3, 1],
                                                          reduction="none"),
                      [_r(8, 2, 5), RNG.integers(1, 5, (2, 3)), np.array([8, 7]),
                       np.array([3, 1])]),
}


#: torch defines no derivative for these (its values are still compared)
NO_TORCH_GRAD = {"native_channel_shuffle"}


def _tensors(lib, arrays, dtype, grad=True):
    out = []
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            a = a.astype(dtype)
        out.append(lib.tensor(a.copy(), requires_grad=grad and a.dtype.kind == "f"))
    return out


def _first(y):
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.filterwarnings("ignore:.*(frobenius|nuclear)_norm is deprecated")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(n for n, case in CASES.items() if case[1]))
def test_matches_nn_functional(name, dtype):
    call, ref, arrays = CASES[name]
    ours = _tensors(mt, arrays, dtype)
    theirs = _tensors(mt, arrays, dtype)
    a, b = call(mt, *ours), ref(F, *theirs)
    if isinstance(b, tuple):
        for p, q in zip(a[1:], b[1:]):
            assert np.array_equal(p.numpy(), q.numpy())
    a, b = _first(a), _first(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    close(a, b, TOL[dtype], "value")
    g = np.random.default_rng(0).standard_normal(tuple(a.shape)).astype(dtype)
    a.backward(mt.tensor(g))
    b.backward(mt.tensor(g))
    for i, (p, q) in enumerate(zip(ours, theirs)):
        if q.grad is not None:
            close(p.grad, q.grad, TOL[dtype], f"grad {i}")


@pytest.mark.filterwarnings("ignore:.*(frobenius|nuclear)_norm is deprecated")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name, dtype):
    torch = _torch()
    if torch is None:
        pytest.skip("torch is not installed (the oracle half)")
    call, _, arrays = CASES[name]
    both(lambda *t: call(mt, *t), lambda *t: call(torch, *t), arrays, dtype, TOL[dtype],
         grad=name not in NO_TORCH_GRAD)


def test_every_name_is_exported():
    from mpitensor.nn import _torch_level as level

    for name in level.__all__:  # the top level may wrap it (NumPy's axis= spelling)
        assert inspect.unwrap(getattr(mt, name)) is inspect.unwrap(getattr(level, name)), name
        assert name in mt.__all__
    torch = _torch()
    if torch is not None:
        missing = [n for n in level.__all__ if not hasattr(torch, n)]
        assert not missing, f"not torch names: {missing}"
    for name in ("prelu", "hardshrink"):
        assert callable(getattr(mt.Tensor, name))


# ------------------------------------------------------------------------ random functions
@pytest.mark.parametrize("name", ["dropout", "alpha_dropout", "feature_dropout",
                                  "feature_alpha_dropout"])
def test_dropout_family_off_and_extremes(name):
    x = mt.tensor(_r(3, 4, 2))
    fn = getattr(mt, name)
    for y in (fn(x, 0.5, False), fn(x, 0.0, True), fn(input=x, p=0.3, train=False)):
        assert np.array_equal(y.numpy(), x.numpy())
    assert fn(x, 0.5, False) is x  # as torch: the input itself when nothing is dropped
    with pytest.raises(ValueError):
        fn(x, 1.5, True)
    with pytest.raises(TypeError):
        fn(x, 0.5)  # train has no default at torch's top level


def test_dropout_masks_and_in_place():
    mt.manual_seed(3)
    x = mt.tensor(_pos(50, 40))
    y = mt.dropout(x, 0.25, True)
    kept = y.numpy() != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(y.numpy()[kept], x.numpy()[kept] / 0.75, rtol=1e-15)
    assert not (mt.dropout(x, 1.0, True).numpy()).any()
    z = x.clone()
    assert mt.dropout_(z, 0.5, True) is z and (z.numpy() == 0).any()


def test_feature_dropout_drops_whole_channels():
    mt.manual_seed(4)
    x = mt.tensor(_pos(6, 20, 3, 2))
    y = mt.feature_dropout(x, 0.5, True).numpy()
    zero = (y == 0).reshape(6, 20, -1)
    assert np.array_equal(zero.all(-1), zero.any(-1))  # a channel is dropped whole or kept
    assert 0.3 < zero.all(-1).mean() < 0.7
    np.testing.assert_allclose(y[y != 0], 2 * x.numpy()[y != 0], rtol=1e-15)
    w = mt.tensor(_pos(8, 30))  # 2-D: the elements are the channels
    assert 0.3 < (mt.feature_dropout(w, 0.5, True).numpy() == 0).mean() < 0.7
    z = x.clone()
    assert mt.feature_dropout_(z, 0.5, True) is z and (z.numpy() == 0).any()
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        mt.feature_dropout(mt.ones(4), 0.5, True)
    a = mt.tensor(_pos(4, 30, 5))
    b = mt.feature_alpha_dropout(a, 0.5, True).numpy()
    spread = b.reshape(4, 30, -1)
    assert np.allclose(spread.std(-1)[spread.std(-1) < 1e-12], 0)  # dropped channels constant
    c = a.clone()
    assert mt.alpha_dropout_(c, 0.5, True) is c
    assert mt.feature_alpha_dropout_(a.clone(), 0.0, True).shape == a.shape


def test_rrelu_training_and_generator():
    mt.manual_seed(5)
    x = mt.tensor(-_pos(1000))
    y = mt.rrelu(x, 0.1, 0.3, True).numpy()
    slope = y / x.numpy()
    assert slope.min() >= 0.1 and slope.max() <= 0.3 and slope.std() > 0.03
    z = x.clone()
    assert mt.rrelu_(z, 0.1, 0.3, True) is z
    with pytest.raises(NotImplementedError, match="generator"):
        mt.rrelu(x, 0.1, 0.3, True, mt.Generator())
    ev = mt.rrelu(x, training=False, generator=mt.Generator())  # no draw: nothing to refuse
    np.testing.assert_allclose(ev.numpy(), x.numpy() * (0.125 + 1 / 3) / 2, rtol=1e-15)


@pytest.mark.parametrize("name,args", [("selu_", ()), ("celu_", (0.5,)),
                                       ("threshold_", (0.1, 2.0)), ("relu_", ())])
def test_in_place_activations(name, args):
    x = mt.tensor(_r(3, 4))
    want = getattr(F, name.rstrip("_"))(x, *args).numpy()
    y = x.clone()
    assert getattr(mt, name)(y, *args) is y
    np.testing.assert_array_equal(y.numpy(), want)


# ----------------------------------------------------------------- stateful normalisation
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_updates_running_stats(dtype):
    x = _r(5, 3, 4)
    out = {}
    for lib in filter(None, (mt, _torch())):
        rm = lib.tensor(np.array([0.1, -0.2, 0.3], dtype))
        rv = lib.tensor(np.array([1.5, 0.5, 2.0], dtype))
        w, b = (lib.tensor(_a.astype(dtype), requires_grad=True) for _a in (_W3, _B3))
        xi = lib.tensor(x.astype(dtype), requires_grad=True)
        y = lib.batch_norm(xi, w, b, rm, rv, True, 0.2, 1e-5, False)
        (y * y * lib.tensor(_G.astype(dtype))).sum().backward()
        inorm = lib.instance_norm(xi.detach(), None, None, rm.repeat(1), rv.repeat(1), True,
                                  0.1, 1e-5, False)
        out[lib.__name__] = [t.detach().numpy() for t in (y, rm, rv, xi.grad, w.grad, b.grad,
                                                          inorm)]
    if len(out) == 2:
        for p, q in zip(*out.values()):
            close(p, q, TOL[dtype])
    ours = out["mpitensor"]
    assert not np.allclose(ours[1], [0.1, -0.2, 0.3])  # updated in place
    close(ours[1], 0.8 * np.array([0.1, -0.2, 0.3]) + 0.2 * x.mean((0, 2)), TOL[dtype])


_W3, _B3, _G = _r(3), _r(3), _r(5, 3, 4)


def test_embedding_renorm_():
    w0 = _r(6, 4) * 3
    idx = np.array([0, 2, 2, 5])
    out = {}
    for lib in filter(None, (mt, _torch())):
        w = lib.tensor(w0.copy())
        assert lib.embedding_renorm_(w, lib.tensor(idx), 1.5, 2.0) is w
        out[lib.__name__] = w.numpy()
    ours = out["mpitensor"]
    norms = np.linalg.norm(ours, axis=1)
    assert np.all(norms[[0, 2, 5]] <= 1.5 + 1e-12)
    np.testing.assert_array_equal(ours[[1, 3, 4]], w0[[1, 3, 4]])
    if len(out) == 2:
        close(ours, out["torch"], 1e-12)
    leaf = mt.tensor(w0, requires_grad=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        mt.embedding_renorm_(leaf, mt.tensor(idx), 1.0, 2.0)
    with mt.no_grad():
        mt.embedding_renorm_(leaf, mt.tensor(idx), 1.0, 2.0)
    assert np.linalg.norm(leaf.detach().numpy()[0]) <= 1.0 + 1e-12


# ------------------------------------------------------------------------------- recurrent
def _rnn_params(mode, I, H, layers, bidir, bias, proj=0):
    gates = {"lstm": 4, "gru": 3}.get(mode, 1)
    P = proj or H
    params = []
    for layer in range(layers):
        for _ in range(2 if bidir else 1):
            width = I if layer == 0 else P * (2 if bidir else 1)
            params += [_r(gates * H, width) * 0.5, _r(gates * H, P) * 0.5]
            params += [_r(gates * H) * 0.5, _r(gates * H) * 0.5] if bias else []
            params += [_r(proj, H) * 0.5] if proj else []
    return params


RNN_CASES = [("lstm", 2, True, True, False, 0), ("lstm", 1, False, True, True, 3),
             ("lstm", 2, True, False, False, 2), ("gru", 2, True, True, True, 0),
             ("gru", 1, False, False, False, 0), ("rnn_tanh", 2, False, True, True, 0),
             ("rnn_relu", 1, True, True, False, 0)]


@pytest.mark.filterwarnings("ignore:LSTM with projections")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,layers,bidir,bias,batch_first,proj", RNN_CASES)
def test_stacked_recurrent_functions(mode, layers, bidir, bias, batch_first, proj, dtype):
    torch = _torch()
    T, B, I, H = 5, 3, 4, 6
    units = layers * (2 if bidir else 1)
    x = _r(B, T, I) if batch_first else _r(T, B, I)
    params = _rnn_params(mode, I, H, layers, bidir, bias, proj)
    h0, c0 = _r(units, B, proj or H), _r(units, B, H)
    results = {}
    for lib in filter(None, (mt, torch)):
        ts = _tensors(lib, [x, h0, c0] + params, dtype)
        hx = [ts[0 + 1], ts[2]] if mode == "lstm" else ts[1]
        out = getattr(lib, mode)(ts[0], hx, ts[3:], bias, layers, 0.0, True, bidir,
                                 batch_first)
        assert isinstance(out, tuple) and len(out) == (3 if mode == "lstm" else 2)
        loss = sum((o * o).sum() * (k + 1) for k, o in enumerate(out))
        loss.backward()
        used = ts if mode == "lstm" else ts[:2] + ts[3:]
        results[lib.__name__] = [o.detach().numpy() for o in out] + [t.grad.numpy()
                                                                      for t in used]
    ours = results["mpitensor"]
    assert ours[0].shape == ((B, T) if batch_first else (T, B)) + ((proj or H) * (
        2 if bidir else 1),)
    if torch is None:
        pytest.skip("torch is not installed (the oracle half); shapes checked")
    for i, (p, q) in enumerate(zip(ours, results["torch"])):
        close(p, q, TOL[dtype] * 10, f"output/grad {i}")


def test_stacked_recurrent_dropout_between_layers():
    mt.manual_seed(6)
    x = mt.tensor(_r(4, 2, 3))
    params = [mt.tensor(p) for p in _rnn_params("gru", 3, 5, 2, False, True)]
    h0 = mt.zeros(2, 2, 5, dtype=mt.float64)
    a = mt.gru(x, h0, params, True, 2, 0.5, False, False, False)[0]
    b = mt.gru(x, h0, params, True, 2, 0.0, True, False, False)[0]
    c = mt.gru(x, h0, params, True, 2, 0.5, True, False, False)[0]
    np.testing.assert_array_equal(a.numpy(), b.numpy())  # dropout only when train
    assert not np.allclose(a.numpy(), c.numpy())


# ------------------------------------------------------------------------------ bad input
BAD = [
    (lambda: mt.conv2d(mt.ones(3, 4), mt.ones(2, 3, 1, 1)), RuntimeError, None),
    (lambda: mt.conv2d(mt.ones(1, 2, 4, 4), mt.ones(3, 5, 1, 1)), RuntimeError, None),
    (lambda: mt.convolution(mt.ones(1, 2, 3, 3), mt.ones(2, 2), None, [1], [0], [1], False,
                            [0], 1), RuntimeError, "weight must be"),
    (lambda: mt.convolution(mt.ones(1, 2, 3, 3), mt.ones(2, 2, 1, 1), None, [1, 1, 1], [0],
                            [1], False, [0], 1), RuntimeError, "stride"),
    (lambda: mt.max_pool2d(mt.ones(5), 2), (RuntimeError, ValueError), None),
    (lambda: mt.layer_norm(mt.ones(3, 4), [5]), (RuntimeError, ValueError), None),
    (lambda: mt.batch_norm(mt.ones(2, 3), mt.ones(4), None, None, None, True, 0.1, 1e-5,
                           False), (RuntimeError, ValueError), None),
    (lambda: mt.kl_div(mt.ones(3), mt.ones(3), 3), ValueError, "reduction"),
    (lambda: mt.margin_ranking_loss(mt.ones(3), mt.ones(3), mt.ones(3), 0.0, "mean"),
     ValueError, "reduction"),
    (lambda: mt.grid_sampler(mt.ones(1, 1, 3, 3), mt.zeros(1, 2, 2, 2), 3, 0, False),
     ValueError, "interpolation_mode"),
    (lambda: mt.grid_sampler(mt.ones(1, 1, 3, 3), mt.zeros(1, 2, 2, 2), 0, 5, False),
     ValueError, "padding_mode"),
    (lambda: mt.grid_sampler_2d(mt.ones(1, 1, 2, 3, 3), mt.zeros(1, 2, 2, 2, 3), 0, 0, False),
     RuntimeError, "4-D"),
    (lambda: mt.grid_sampler_3d(mt.ones(1, 1, 3, 3), mt.zeros(1, 2, 2, 2), 0, 0, False),
     RuntimeError, "5-D"),
    (lambda: mt.grid_sampler(mt.ones(1, 1, 3, 3), mt.zeros(1, 2, 2, 2), 2, 0, False),
     NotImplementedError, "bicubic"),
    (lambda: mt.embedding_bag(mt.ones(3, 2), mt.tensor([0]), mt.tensor([0]), False, 3),
     ValueError, "mode"),
    (lambda: mt.embedding(mt.ones(3, 2), mt.tensor([5])), (IndexError, RuntimeError), None),
    (lambda: mt.rnn_tanh_cell(mt.ones(4), mt.ones(5), mt.ones(5, 4), mt.ones(5, 5)),
     RuntimeError, "batch"),
    (lambda: mt.gru_cell(mt.ones(2, 4), mt.ones(2, 5), mt.ones(14, 4), mt.ones(15, 5)),
     RuntimeError, "w_ih"),
    (lambda: mt.lstm_cell(mt.ones(2, 4), mt.ones(2, 5), mt.ones(20, 4), mt.ones(20, 5)),
     RuntimeError, "hx"),
    (lambda: mt.lstm_cell(mt.ones(2, 4), [mt.ones(2, 5), mt.ones(3, 5)], mt.ones(20, 4),
                          mt.ones(20, 5)), RuntimeError, "hidden state 1"),
    (lambda: mt.lstm(mt.ones(3, 2, 4), [mt.ones(1, 2, 5)] * 2, [mt.ones(20, 4)], True, 1, 0.0,
                     False, False, False), RuntimeError, "weights"),
    (lambda: mt.gru(mt.ones(3, 4), mt.ones(1, 5), [mt.ones(15, 4), mt.ones(15, 5)], False, 1,
                    0.0, False, False, False), RuntimeError, "3-D"),
    (lambda: mt.gru(mt.ones(3, 2, 4), mt.ones(1, 3, 5), [mt.ones(15, 4), mt.ones(15, 5)],
                    False, 1, 0.0, False, False, False), RuntimeError, "h0 of size"),
    (lambda: mt.gru(mt.ones(3, 2, 4, dtype=mt.float64), mt.ones(1, 2, 5, dtype=mt.float64),
                    [mt.ones(15, 4), mt.ones(15, 5)], False, 1, 0.0, False, False, False),
     RuntimeError, "dtype"),
    (lambda: mt.lstm_cell(mt.ones(2, 3, dtype=mt.float64), [mt.ones(2, 4, dtype=mt.float64)] * 2,
                          mt.ones(16, 3), mt.ones(16, 4)), RuntimeError, "dtype"),
    (lambda: mt.nuclear_norm(mt.ones(3)), (RuntimeError, ValueError), None),
    (lambda: mt.embedding_renorm_(mt.ones(3), mt.tensor([0]), 1.0, 2.0), RuntimeError, "2-D"),
]


@pytest.mark.filterwarnings("ignore:nuclear_norm is deprecated")
@pytest.mark.parametrize("k", range(len(BAD)))
def test_bad_input_raises_clearly(k):
    call, exc, match = BAD[k]
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------------- a user's program
def _cnn_losses(lib, seed=11):
    """A small CNN written with torch's top-level functions, 3 SGD steps, then one
    evaluation with the running statistics; the losses and the final running mean."""
    rng = np.random.default_rng(seed)
    shapes = {"c1w": (6, 1, 3, 3), "c1b": (6,), "bn_w": (6,), "bn_b": (6,),
              "c2w": (8, 6, 3, 3), "c2b": (8,), "fw": (10, 8), "fb": (10,)}
    init = {k: (rng.standard_normal(s) * (0.3 if len(s) > 1 else 0.1)).astype(np.float32)
            for k, s in shapes.items()}
    init["bn_w"] += 1.0
    data = [(rng.standard_normal((8, 1, 12, 12)).astype(np.float32),
             rng.integers(0, 10, 8).astype(np.int64)) for _ in range(4)]
    p = {k: lib.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    running_mean, running_var = lib.zeros(6), lib.ones(6)
    opt = lib.optim.SGD(list(p.values()), lr=0.1, momentum=0.9)

    def forward(x, train):
        h = lib.conv2d(x, p["c1w"], p["c1b"], 1, 1)
        h = lib.batch_norm(h, p["bn_w"], p["bn_b"], running_mean, running_var, train, 0.1,
                           1e-5, True)
        h = lib.max_pool2d(lib.relu(h), 2)
        h = lib.conv2d(h, p["c2w"], p["c2b"], [1, 1], [0, 0], [1, 1], 1)
        h = lib.max_pool2d(lib.relu(h), [2, 2], [], 0, 1, False)
        h = lib.dropout(h, 0.5, False)
        h = lib.adaptive_avg_pool1d(h.flatten(2), 1).flatten(1)
        return lib.nn.functional.linear(h, p["fw"], p["fb"])

    losses = []
    for x, y in data[:3]:
        loss = lib.nn.functional.cross_entropy(forward(lib.tensor(x), True), lib.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    with lib.no_grad():
        x, y = data[3]
        losses.append(float(lib.nn.functional.cross_entropy(forward(lib.tensor(x), False),
                                                            lib.tensor(y)).item()))
    return losses, running_mean.numpy().copy()


def test_cnn_program_trains_as_under_torch():
    losses, rm = _cnn_losses(mt)
    assert all(np.isfinite(losses)) and losses[2] != losses[0]
    assert np.abs(rm).sum() > 0  # the running statistics moved
    torch = _torch()
    if torch is None:
        pytest.skip("torch is not installed (the oracle half)")
    want, want_rm = _cnn_losses(torch)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_allclose(rm, want_rm, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,bidir", [("lstm", True), ("gru", False), ("rnn_tanh", True)])
def test_stacked_recurrent_packed_form(mode, bidir):
    torch = _torch()
    T, B, I, H, layers = 5, 3, 4, 6, 2
    units = layers * (2 if bidir else 1)
    x, lengths = _r(T, B, I), [5, 3, 2]
    params = _rnn_params(mode, I, H, layers, bidir, True)
    h0, c0 = _r(units, B, H), _r(units, B, H)
    results = {}
    for lib in filter(None, (mt, torch)):
        ts = _tensors(lib, [x, h0, c0] + params, np.float64)
        packed = lib.nn.utils.rnn.pack_padded_sequence(ts[0], lengths)
        hx = [ts[1], ts[2]] if mode == "lstm" else ts[1]
        out = getattr(lib, mode)(packed.data, packed.batch_sizes, hx, ts[3:], True, layers,
                                 0.0, True, bidir)
        sum((o * o).sum() for o in out).backward()
        # the padded run agrees on the rows that are still running
        results[lib.__name__] = [o.detach().numpy() for o in out] + [ts[0].grad.numpy(),
                                                                     ts[3].grad.numpy()]
    ours = results["mpitensor"]
    assert ours[0].shape == (sum(lengths), H * (2 if bidir else 1))
    if torch is None:
        pytest.skip("torch is not installed (the oracle half); shapes checked")
    for i, (p, q) in enumerate(zip(ours, results["torch"])):
        close(p, q, 1e-9, f"output/grad {i}")
    with pytest.raises(RuntimeError, match="batch_sizes"):
        getattr(mt, mode)(mt.ones(9, I), mt.tensor([3, 3, 2]), mt.zeros(units, 3, H)
                          if mode != "lstm" else [mt.zeros(units, 3, H)] * 2,
                          [mt.tensor(p) for p in params], True, layers, 0.0, True, bidir)


def test_argument_names_and_defaults_are_torchs():
    """Every function's parameters, in order, with their defaults, are one of torch's
    operator schemas (``self`` is ``input`` in Python, as torch's binding names it)."""
    torch = _torch()
    if torch is None:
        pytest.skip("torch is not installed (the oracle half)")
    from mpitensor.nn import _torch_level as level

    def same(a, b):
        if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
            a, b = list(a) if isinstance(a, (tuple, list)) else [a], b
            b = list(b) if isinstance(b, (tuple, list)) else [b]
            return a == b or (len(a) == 1 and all(v == a[0] for v in b)) or a == [] == b
        return a == b or (a is None and b is None)

    # one Python function for two overloads: nuclear_norm(input, keepdim) and (input, dim,
    # keepdim); embedding_bag's second overload has no defaults (both called in CASES)
    for name in sorted(set(level.__all__) - {"nuclear_norm"}):
        ours = [(p.name, p.default) for p in inspect.signature(getattr(level, name)).parameters
                .values()]
        matched = False
        for schema in torch._C._jit_get_schemas_for_operator("aten::" + name):
            args = [a for a in schema.arguments if a.name != "out"]
            if [("input" if a.name == "self" else a.name) for a in args] != [n for n, _ in ours]:
                continue
            matched = all(
                d is inspect.Parameter.empty if not a.has_default_value()
                else same(d, a.default_value) or (n == "reduction" and d == 0)
                for a, (n, d) in zip(args, ours))
            matched = matched or name == "embedding_bag"  # its padding_idx overload: no defaults
            if matched:
                break
        assert matched, f"{name}: {ours} is none of torch's schemas"


def test_deprecated_norms_warn_at_the_callers_line():
    with pytest.warns(UserWarning, match="frobenius_norm is deprecated") as got:
        mt.frobenius_norm(mt.ones(2, 3), [0, 1])
    assert got[0].filename == __file__
    with pytest.warns(UserWarning, match="nuclear_norm is deprecated") as got:
        value = mt.nuclear_norm(mt.eye(3) * 2)
    assert got[0].filename == __file__ and float(value) == pytest.approx(6.0, rel=1e-12)


@pytest.mark.parametrize("mode,layers,bidir,bias,batch_first,proj", RNN_CASES)
def test_stacked_recurrent_functions_match_the_modules(mode, layers, bidir, bias,
                                                       batch_first, proj):
    """The flat-weight functions give what ``nn.LSTM``/``nn.GRU``/``nn.RNN`` give with the
    same weights (no torch needed)."""
    T, B, I, H = 4, 2, 3, 5
    units = layers * (2 if bidir else 1)
    x = mt.tensor(_r(B, T, I) if batch_first else _r(T, B, I))
    params = [mt.tensor(p) for p in _rnn_params(mode, I, H, layers, bidir, bias, proj)]
    h0, c0 = mt.tensor(_r(units, B, proj or H)), mt.tensor(_r(units, B, H))
    kw = dict(num_layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidir)
    if mode == "lstm":
        module = mt.nn.LSTM(I, H, proj_size=proj, **kw)
    elif mode == "gru":
        module = mt.nn.GRU(I, H, **kw)
    else:
        module = mt.nn.RNN(I, H, nonlinearity=mode[4:], **kw)
    module = module.double()
    with mt.no_grad():
        for w, p in zip(module._flat_weights, params):
            w.copy_(p)
    hx = [h0, c0] if mode == "lstm" else h0
    got = getattr(mt, mode)(x, hx, params, bias, layers, 0.0, False, bidir, batch_first)
    out, state = module(x, tuple(hx) if mode == "lstm" else hx)
    want = (out,) + (tuple(state) if mode == "lstm" else (state,))
    for g, w in zip(got, want):
        close(g, w, 1e-12)
