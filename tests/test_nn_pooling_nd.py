"""3-D, adaptive, unpooling, power-average and fractional pooling (functional and modules),
plus CrossMapLRN2d: values, indices and gradients against torch in float32 and float64, and
torch's error types for bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F

from .nn_oracle import both, tol

torch = pytest.importorskip("torch")
TF = torch.nn.functional
DTYPES = [np.float32, np.float64]
rng = np.random.default_rng(0)


def _x(*shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("args", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), dilation=(1, 1, 2),
         ceil_mode=True),
    dict(kernel_size=2),
])
@pytest.mark.parametrize("shape", [(2, 3, 7, 6, 5), (3, 6, 5, 4)])
def test_max_pool3d(dtype, args, shape):
    both(lambda x: F.max_pool3d(x, return_indices=True, **args),
         lambda x: TF.max_pool3d(x, return_indices=True, **args), [_x(*shape)], dtype,
         tol(dtype))
    both(lambda x: nn.MaxPool3d(**args)(x), lambda x: torch.nn.MaxPool3d(**args)(x),
         [_x(*shape)], dtype, tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("args", [
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3, 1), stride=1, divisor_override=5),
])
def test_avg_pool3d(dtype, args):
    both(lambda x: nn.AvgPool3d(**args)(x), lambda x: torch.nn.AvgPool3d(**args)(x),
         [_x(2, 3, 7, 6, 5)], dtype, tol(dtype, 27))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [(3, None, 4), 1, (7, 6, 5), (4, 4, 3)])
def test_adaptive_3d(dtype, size):
    both(lambda x: nn.AdaptiveAvgPool3d(size)(x), lambda x: torch.nn.AdaptiveAvgPool3d(size)(x),
         [_x(2, 3, 7, 6, 5)], dtype, tol(dtype, 210))
    both(lambda x: F.adaptive_max_pool3d(x, size, True),
         lambda x: TF.adaptive_max_pool3d(x, size, True), [_x(3, 7, 6, 5)], dtype, tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [(3, 4), 2, (None, 3), (7, 6)])
def test_adaptive_max_pool2d(dtype, size):
    both(lambda x: nn.AdaptiveMaxPool2d(size, return_indices=True)(x),
         lambda x: torch.nn.AdaptiveMaxPool2d(size, return_indices=True)(x),
         [_x(2, 3, 7, 6)], dtype, tol(dtype))
    both(lambda x: F.adaptive_max_pool2d_with_indices(x, size),
         lambda x: TF.adaptive_max_pool2d_with_indices(x, size), [_x(3, 7, 6)], dtype,
         tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lp_pool(dtype):
    both(lambda x: nn.LPPool2d(2.5, (2, 3), ceil_mode=True)(x.abs()),
         lambda x: torch.nn.LPPool2d(2.5, (2, 3), ceil_mode=True)(x.abs()),
         [_x(2, 3, 7, 6)], dtype, tol(dtype, 30))
    both(lambda x: nn.LPPool3d(2, 2, stride=(1, 2, 1))(x),
         lambda x: torch.nn.LPPool3d(2, 2, stride=(1, 2, 1))(x),
         [_x(2, 3, 5, 6, 4)], dtype, tol(dtype, 30))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("output_size", [None, "explicit"])
def test_max_unpool(dtype, nd, output_size):
    shape = (2, 3, 8, 6, 4)[:2 + nd]
    pool = TF.max_pool2d if nd == 2 else TF.max_pool3d
    _, idx = pool(torch.tensor(_x(*shape)), 2, return_indices=True)
    size = None if output_size is None else tuple(s + 1 for s in shape[2:])
    cls, tcls = getattr(nn, f"MaxUnpool{nd}d"), getattr(torch.nn, f"MaxUnpool{nd}d")
    both(lambda v: cls(2)(v, mt.tensor(idx.numpy()), size),
         lambda v: tcls(2)(v, idx, size), [_x(*idx.shape)], dtype, tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_pool2d_with_indices_and_unbatched_unpool(dtype):
    both(lambda x: F.max_pool2d_with_indices(x, 3, 2, 1),
         lambda x: TF.max_pool2d_with_indices(x, 3, 2, 1), [_x(2, 3, 7, 6)], dtype, tol(dtype))
    _, idx = TF.max_pool2d(torch.tensor(_x(3, 6, 4)), 2, return_indices=True)
    both(lambda v: F.max_unpool2d(v, mt.tensor(idx.numpy()), 2),
         lambda v: TF.max_unpool2d(v, idx, 2), [_x(3, 3, 2)], dtype, tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd,kw", [
    (2, dict(kernel_size=3, output_size=(4, 3))),
    (2, dict(kernel_size=(2, 3), output_ratio=(0.5, 0.6))),
    (3, dict(kernel_size=2, output_ratio=(0.5, 0.6, 0.7))),
    (3, dict(kernel_size=(2, 1, 3), output_size=(3, 5, 1))),
])
def test_fractional_max_pool(dtype, nd, kw):
    shape = (2, 3, 9, 7, 8)[:2 + nd]
    samples = torch.rand(2, 3, nd, dtype=torch.float64 if dtype == np.float64 else torch.float32)
    cls, tcls = getattr(nn, f"FractionalMaxPool{nd}d"), getattr(torch.nn, f"FractionalMaxPool{nd}d")
    both(lambda x: cls(return_indices=True, _random_samples=mt.tensor(samples.numpy()), **kw)(x),
         lambda x: tcls(return_indices=True, _random_samples=samples, **kw)(x),
         [_x(*shape)], dtype, tol(dtype))


def test_fractional_draws_its_own_samples():
    mt.manual_seed(0)
    x = mt.tensor(_x(2, 3, 9, 9).astype(np.float32))
    out = F.fractional_max_pool2d(x, 2, output_ratio=0.5)
    assert tuple(out.shape) == (2, 3, 4, 4)
    # every output is the max of some 2x2 window of its plane
    win = np.lib.stride_tricks.sliding_window_view(x.numpy(), (2, 2), axis=(2, 3)).max((-1, -2))
    for n in range(2):
        for c in range(3):
            assert np.isin(out.numpy()[n, c], win[n, c]).all()
    assert nn.FractionalMaxPool3d(2, output_size=3)._random_samples is None


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_cross_map_lrn2d(size):
    x = _x(2, 6, 3, 3)
    a = mt.tensor(x, requires_grad=True)
    ya = nn.CrossMapLRN2d(size, 0.3, 0.7, 2)(a)
    yb = torch.nn.CrossMapLRN2d(size, 0.3, 0.7, 2)(torch.tensor(x))
    np.testing.assert_allclose(ya.detach().numpy(), yb.numpy(), rtol=1e-13, atol=1e-13)
    # the gradient is the exact derivative of that forward (central differences)
    g = _x(2, 6, 3, 3)
    ya.backward(mt.tensor(g))
    h = 1e-6
    d = np.zeros_like(x)
    d[1, 2, 1, 0] = h

    def f(v):
        return (nn.CrossMapLRN2d(size, 0.3, 0.7, 2)(mt.tensor(v)).numpy() * g).sum()

    assert abs((f(x + d) - f(x - d)) / (2 * h) - a.grad.numpy()[1, 2, 1, 0]) < 1e-7
    assert repr(nn.CrossMapLRN2d(3)) == repr(torch.nn.CrossMapLRN2d(3))


def test_reprs_match_torch():
    for name, args, kw in [("MaxPool3d", (3, 2), {}), ("AvgPool3d", (3,), {}),
                           ("AdaptiveAvgPool3d", ((2, None, 3),), {}),
                           ("AdaptiveMaxPool2d", (3,), {}), ("AdaptiveMaxPool3d", (3, True), {}),
                           ("MaxUnpool2d", (2,), {}), ("MaxUnpool3d", (2, 1), {}),
                           ("LPPool2d", (2, 3), {}), ("LPPool3d", (1.5, 2, 1), {})]:
        assert repr(getattr(nn, name)(*args, **kw)) == repr(getattr(torch.nn, name)(*args, **kw))


def _raises_like(fm, ft):
    with pytest.raises(Exception) as theirs:
        ft()
    with pytest.raises(type(theirs.value)):
        fm()


@pytest.mark.parametrize("case", [
    ("max_pool3d", (2, 3, 4), dict(kernel_size=2)),
    ("max_pool3d", (1, 2, 4, 4, 4), dict(kernel_size=2, padding=2)),
    ("max_pool3d", (1, 2, 2, 2, 2), dict(kernel_size=3)),
    ("avg_pool3d", (2, 4, 4), dict(kernel_size=2)),
    ("avg_pool3d", (1, 2, 4, 4, 4), dict(kernel_size=2, padding=2)),
    ("adaptive_avg_pool3d", (2, 4, 4), dict(output_size=2)),
    ("adaptive_max_pool2d", (4,), dict(output_size=2)),
    ("adaptive_max_pool3d", (2, 4, 4), dict(output_size=2)),
    ("lp_pool2d", (4,), dict(norm_type=2, kernel_size=2)),
    ("fractional_max_pool2d", (1, 2, 4, 4), dict(kernel_size=3, output_size=3)),
    ("fractional_max_pool2d", (1, 2, 4, 4), dict(kernel_size=2)),
])
def test_bad_arguments_raise_torch_error_types(case):
    name, shape, kw = case
    x = _x(*shape)
    _raises_like(lambda: getattr(F, name)(mt.tensor(x), **kw),
                 lambda: getattr(TF, name)(torch.tensor(x), **kw))


def test_bad_unpool_arguments():
    out, idx = TF.max_pool2d(torch.tensor(_x(1, 2, 4, 4)), 2, return_indices=True)
    ours = (mt.tensor(out.numpy()), mt.tensor(idx.numpy()))
    _raises_like(lambda: F.max_unpool2d(*ours, 2, output_size=(9, 9)),
                 lambda: TF.max_unpool2d(out, idx, 2, output_size=(9, 9)))
    _raises_like(lambda: F.max_unpool2d(ours[0], ours[1][..., :1], 2),
                 lambda: TF.max_unpool2d(out, idx[..., :1], 2))
    with pytest.raises(ValueError):
        nn.FractionalMaxPool2d(2)
    with pytest.raises(ValueError):
        nn.FractionalMaxPool2d(2, output_ratio=1.5)
    with pytest.raises(ValueError):
        nn.CrossMapLRN2d(3)(mt.zeros(2, 3, 4))


@pytest.mark.gpu
def test_gpu_pooling_matches_cpu():
    x = _x(2, 3, 6, 5, 4).astype(np.float32)
    a = mt.tensor(x, requires_grad=True)
    b = mt.tensor(x, device="cuda", requires_grad=True)
    for f in (lambda v: F.max_pool3d(v, 2, 1, 1), lambda v: F.avg_pool3d(v, 3, 2, 1),
              lambda v: F.adaptive_avg_pool3d(v, (2, 3, 2)),
              lambda v: F.adaptive_max_pool3d(v, 2)):
        ya, yb = f(a), f(b)
        np.testing.assert_allclose(yb.cpu().detach().numpy(), ya.detach().numpy(), rtol=1e-5)
        ya.sum().backward()
        yb.sum().backward()
        np.testing.assert_allclose(b.grad.cpu().numpy(), a.grad.numpy(), rtol=1e-5, atol=1e-6)
        a.grad = b.grad = None
