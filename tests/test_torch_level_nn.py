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
    "nuclear_norm_keep": (lambda L, x: L.nuclear_norm(x, True), None, [_r(4, 3)]),
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_nn_functional(name, dtype):
    call, ref, arrays = CASES[name]
    if ref is None:
        pytest.skip("compared with torch only (no nn.functional call of this form)")
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
