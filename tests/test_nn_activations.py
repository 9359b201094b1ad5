"""Activation functions of ``mpitensor.nn.functional`` and their modules, against PyTorch.

Forward values and gradients (float64 to 1e-10, float32 to 1e-5) over several shapes and
options, with inputs placed on the kinks (0, the bounds) where torch picks a one-sided
gradient; the in-place forms through the in-place machinery (leaf errors, versions, autograd
through them); half precision; module reprs and state dicts; bad arguments. Finite-difference
checks run without torch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F
from mpitensor.nn._functional.activations import erf
from tests.test_nn_functional import _fd_check

RNG = np.random.default_rng(2024)
TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]
SHAPES = [(), (7,), (3, 5), (2, 3, 4)]


def _torch():
    return pytest.importorskip("torch")


def _np(t: mt.Tensor) -> np.ndarray:
    return np.asarray(t.detach()._data)


def _close(got, want, dtype, what=""):
    tol = TOL[dtype]
    want = np.asarray(want)
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what,
                               equal_nan=True)


def _input(shape, dtype, kinks=()):
    """Random values of ``shape``, with the kinks planted among them where there is room."""
    x = RNG.standard_normal(shape) * 3
    flat = x.reshape(-1)
    for i, k in enumerate(kinks[: max(flat.size - 2, 0)]):
        flat[i] = k
    return x.astype(dtype)


# name -> (mpitensor call, torch call, kinks in the input)
CASES = {
    "gelu": (lambda f, x: f.gelu(x), [0.0]),
    "gelu_tanh": (lambda f, x: f.gelu(x, approximate="tanh"), [0.0]),
    "silu": (lambda f, x: f.silu(x), [0.0]),
    "mish": (lambda f, x: f.mish(x), [0.0, 25.0, -30.0]),
    "elu": (lambda f, x: f.elu(x), [0.0]),
    "elu_alpha": (lambda f, x: f.elu(x, alpha=0.3), [0.0]),
    "selu": (lambda f, x: f.selu(x), [0.0]),
    "celu": (lambda f, x: f.celu(x, alpha=1.7), [0.0]),
    "leaky_relu": (lambda f, x: f.leaky_relu(x), [0.0]),
    "leaky_relu_slope": (lambda f, x: f.leaky_relu(x, 0.2), [0.0]),
    "relu6": (lambda f, x: f.relu6(x), [0.0, 6.0]),
    "hardtanh": (lambda f, x: f.hardtanh(x), [-1.0, 1.0]),
    "hardtanh_bounds": (lambda f, x: f.hardtanh(x, -0.5, 2.0), [-0.5, 2.0]),
    "hardsigmoid": (lambda f, x: f.hardsigmoid(x), [-3.0, 3.0]),
    "hardswish": (lambda f, x: f.hardswish(x), [-3.0, 3.0]),
    "hardshrink": (lambda f, x: f.hardshrink(x), [0.5, -0.5]),
    "hardshrink_l": (lambda f, x: f.hardshrink(x, 1.5), [1.5]),
    "softshrink": (lambda f, x: f.softshrink(x), [0.5, -0.5]),
    "softshrink_l": (lambda f, x: f.softshrink(x, 2.0), [2.0]),
    "tanhshrink": (lambda f, x: f.tanhshrink(x), []),
    "softplus": (lambda f, x: f.softplus(x), [0.0, 20.0, 25.0]),
    "softplus_beta": (lambda f, x: f.softplus(x, beta=2, threshold=5), [2.5, 3.0]),
    "softsign": (lambda f, x: f.softsign(x), [0.0]),
    "logsigmoid": (lambda f, x: f.logsigmoid(x), [0.0, -50.0, 50.0]),
    "sigmoid": (lambda f, x: f.sigmoid(x), []),
    "tanh": (lambda f, x: f.tanh(x), []),
    "threshold": (lambda f, x: f.threshold(x, 0.3, -2.0), [0.3]),
    "rrelu_eval": (lambda f, x: f.rrelu(x, 0.1, 0.3), [0.0]),
    "softmin": (lambda f, x: f.softmin(x, dim=-1), []),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_activation_matches_torch(name, shape, dtype):
    torch = _torch()
    import torch.nn.functional as TF

    call, kinks = CASES[name]
    if name == "softmin" and shape == ():
        shape = (4,)
    x = _input(shape, dtype, kinks)
    xm = mt.tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    out, tout = call(F, xm), call(TF, xt)
    assert _np(out).dtype == tout.detach().numpy().dtype
    assert tuple(out.shape) == tuple(tout.shape)
    _close(_np(out), tout.detach().numpy(), dtype, "value")
    g = RNG.standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    _close(_np(xm.grad), xt.grad.numpy(), dtype, "gradient")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_glu_matches_torch(dtype, dim):
    torch = _torch()
    x = _input((4, 6, 2), dtype)
    xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, tout = F.glu(xm, dim), torch.nn.functional.glu(xt, dim)
    _close(_np(out), tout.detach().numpy(), dtype)
    g = RNG.standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    _close(_np(xm.grad), xt.grad.numpy(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xshape,wn", [((5,), 1), ((3, 4), 4), ((3, 4), 1), ((2, 3, 5, 5), 3),
                                        ((2, 3, 4), 3)])
def test_prelu_matches_torch(dtype, xshape, wn):
    torch = _torch()
    x = _input(xshape, dtype, [0.0])
    w = RNG.uniform(0.05, 0.5, wn).astype(dtype)
    xm, wm = mt.tensor(x, requires_grad=True), mt.tensor(w, requires_grad=True)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    out, tout = F.prelu(xm, wm), torch.nn.functional.prelu(xt, wt)
    _close(_np(out), tout.detach().numpy(), dtype)
    g = RNG.standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    _close(_np(xm.grad), xt.grad.numpy(), dtype, "input gradient")
    _close(_np(wm.grad), wt.grad.numpy(), dtype, "weight gradient")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, None])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_softmin_dim_and_dtype_match_torch(dtype, dim):
    torch = _torch()
    x = _input((3, 4), np.float32)
    tdt = None if dtype is None else getattr(torch, np.dtype(dtype).name)
    mdt = None if dtype is None else getattr(mt, np.dtype(dtype).name)
    with warnings.catch_warnings(record=True) as w1:
        warnings.simplefilter("always")
        out = F.softmin(mt.tensor(x), dim, dtype=mdt)
    with warnings.catch_warnings(record=True) as w2:
        warnings.simplefilter("always")
        tout = torch.nn.functional.softmin(torch.tensor(x), dim, dtype=tdt)
    assert _np(out).dtype == tout.numpy().dtype
    _close(_np(out), tout.numpy(), np.float32)
    assert bool(w1) == bool(w2) == (dim is None)


@pytest.mark.parametrize("fname", ["softmax", "log_softmax"])
@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_softmax_legacy_dim_and_dtype_match_torch(fname, ndim):
    torch = _torch()
    x = _input((2, 3, 4, 5)[:ndim], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = getattr(F, fname)(mt.tensor(x), dtype=mt.float64)
        tout = getattr(torch.nn.functional, fname)(torch.tensor(x), dtype=torch.float64)
    assert _np(out).dtype == np.float64
    _close(_np(out), tout.numpy(), np.float64)


# --------------------------------------------------------------------------------------------
# in place

INPLACE = {
    # name: (F call with inplace / the _ function, torch call)
    "elu": lambda f, x: f.elu(x, 0.7, inplace=True),
    "elu_": lambda f, x: f.elu_(x, 0.7),
    "selu": lambda f, x: f.selu(x, inplace=True),
    "selu_": lambda f, x: f.selu_(x),
    "celu": lambda f, x: f.celu(x, 1.3, inplace=True),
    "celu_": lambda f, x: f.celu_(x, 1.3),
    "leaky_relu": lambda f, x: f.leaky_relu(x, 0.1, inplace=True),
    "leaky_relu_": lambda f, x: f.leaky_relu_(x, 0.1),
    "relu6": lambda f, x: f.relu6(x, inplace=True),
    "hardtanh": lambda f, x: f.hardtanh(x, -0.5, 0.5, inplace=True),
    "hardtanh_": lambda f, x: f.hardtanh_(x, -0.5, 0.5),
    "hardsigmoid": lambda f, x: f.hardsigmoid(x, inplace=True),
    "hardswish": lambda f, x: f.hardswish(x, inplace=True),
    "silu": lambda f, x: f.silu(x, inplace=True),
    "mish": lambda f, x: f.mish(x, inplace=True),
    "threshold": lambda f, x: f.threshold(x, 0.1, 5.0, inplace=True),
    "threshold_": lambda f, x: f.threshold_(x, 0.1, 5.0),
    "rrelu_eval": lambda f, x: f.rrelu(x, 0.1, 0.2, inplace=True),
    "rrelu_": lambda f, x: f.rrelu_(x, 0.1, 0.2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_forms_match_torch_and_record_autograd(name, dtype):
    torch = _torch()
    call = INPLACE[name]
    x = _input((3, 4), dtype, [0.0, 6.0])
    leaf = mt.tensor(x, requires_grad=True)
    tleaf = torch.tensor(x, requires_grad=True)
    y = leaf * 2.0  # a non-leaf: in-place is allowed, and recorded
    ty = tleaf * 2.0
    v0 = y._version
    out = call(F, y)
    tout = call(torch.nn.functional, ty)
    assert out is y and tout is ty
    assert y._version > v0
    _close(_np(y), ty.detach().numpy(), dtype, "value")
    g = RNG.standard_normal((3, 4)).astype(dtype)
    (y * mt.tensor(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    _close(_np(leaf.grad), tleaf.grad.numpy(), dtype, "gradient through the in-place op")


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_on_a_leaf_that_requires_grad_raises(name):
    leaf = mt.tensor(_input((3,), np.float64), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        INPLACE[name](F, leaf)


def test_inplace_without_grad_writes_and_bumps_the_version():
    x = mt.tensor([-1.0, 0.5, 3.0])
    v = x._version
    assert F.hardtanh_(x) is x
    assert x.tolist() == [-1.0, 0.5, 1.0] and x._version == v + 1
    with mt.no_grad():
        leaf = mt.tensor([-2.0, 2.0], requires_grad=True)
        F.leaky_relu_(leaf, 0.5)
    assert leaf.tolist() == [-1.0, 2.0]
    a = np.array([-1.0, 2.0])
    F.elu(a, inplace=True)
    np.testing.assert_allclose(a, [math.expm1(-1.0), 2.0])


def test_inplace_into_a_view_updates_the_base_graph():
    torch = _torch()
    x = RNG.standard_normal((4, 3))
    leaf, tleaf = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    base, tbase = leaf * 1.0, tleaf * 1.0
    F.elu_(base[1:3], 0.5)
    torch.nn.functional.elu_(tbase[1:3], 0.5)
    _close(_np(base), tbase.detach().numpy(), np.float64)
    base.sum().backward()
    tbase.sum().backward()
    _close(_np(leaf.grad), tleaf.grad.numpy(), np.float64)


def test_backward_after_the_saved_input_changed_refuses():
    x = mt.tensor([1.0, -1.0], requires_grad=True)
    h = x * 1.0
    y = F.gelu(h)
    h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# --------------------------------------------------------------------------------------------
# half precision


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "mish", "elu", "selu", "softplus",
                                  "logsigmoid", "hardswish", "hardsigmoid", "leaky_relu",
                                  "tanhshrink", "softsign", "softshrink"])
def test_half_precision_matches_torch(name, half):
    torch = _torch()
    call, _ = CASES[name]
    x = _input((64,), np.float32)
    xm = mt.tensor(x).to(getattr(mt, half)).requires_grad_()
    xt = torch.tensor(x).to(getattr(torch, half)).requires_grad_()
    out, tout = call(F, xm), call(torch.nn.functional, xt)
    assert out.dtype == getattr(mt, half)
    got = _np(out.float())
    want = tout.detach().float().numpy()
    tol = 1e-2 if half == "bfloat16" else 2e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    out.float().sum().backward()
    tout.float().sum().backward()
    assert xm.grad.dtype == getattr(mt, half)
    np.testing.assert_allclose(_np(xm.grad.float()), xt.grad.float().numpy(), rtol=2 * tol,
                               atol=2 * tol)


# --------------------------------------------------------------------------------------------
# no torch needed


def test_erf_is_accurate():
    x = np.concatenate([np.linspace(-7, 7, 4001), [0.0, 1e-300, 2.4999, 2.5, 6.0, 30.0]])
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(erf(x), want, rtol=0, atol=4e-15)
    assert np.isnan(erf(np.array([np.nan]))[0])
    assert erf(np.array([np.inf, -np.inf])).tolist() == [1.0, -1.0]
    assert erf(np.float32([0.5])).dtype == np.float32


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "mish", "elu_alpha", "selu",
                                  "celu", "softplus_beta", "softsign", "logsigmoid",
                                  "tanhshrink", "softmin"])
def test_finite_differences(name):
    call, _ = CASES[name]
    x = RNG.standard_normal((3, 4)) * 2
    _fd_check(lambda t: call(F, t), [x], [0])


def test_glu_and_prelu_finite_differences():
    _fd_check(lambda t: F.glu(t, 1), [RNG.standard_normal((2, 4, 3))], [0])
    x = RNG.standard_normal((2, 3, 4))
    w = np.array([0.1, 0.3, 0.2])
    _fd_check(F.prelu, [x, w], [0, 1])


def test_rrelu_training_draws_slopes_in_range_and_backprops_them():
    mt.manual_seed(0)
    x = mt.tensor(-np.abs(RNG.standard_normal(10000)) - 0.1, requires_grad=True)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    slopes = _np(y) / _np(x)
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3
    assert abs(slopes.mean() - 0.2) < 0.01 and slopes.std() > 0.05
    y.sum().backward()
    np.testing.assert_allclose(_np(x.grad), slopes, rtol=1e-12)
    mt.manual_seed(0)
    again = F.rrelu(mt.tensor(_np(x)), 0.1, 0.3, training=True)
    np.testing.assert_array_equal(_np(again), _np(y))
    pos = mt.tensor([1.0, 2.0])
    assert F.rrelu(pos, training=True).tolist() == [1.0, 2.0]


def test_rrelu_module_follows_train_and_eval():
    m = nn.RReLU(0.1, 0.3)
    x = mt.tensor(-np.ones(1000))
    assert np.allclose(_np(m.eval()(x)), -0.2)
    assert _np(m.train()(x)).std() > 0.01


def test_integer_inputs_like_torch():
    x = mt.tensor([-2, 0, 3, 7])
    assert F.relu6(x).tolist() == [0, 0, 3, 6] and F.relu6(x).dtype == mt.int64
    assert F.hardtanh(x).tolist() == [-1, 0, 1, 1]
    assert F.threshold(x, 1, 5).tolist() == [5, 5, 3, 7]
    assert F.softsign(x).dtype == mt.float32
    assert F.sigmoid(x).dtype == mt.float32
    for fn in (F.gelu, F.silu, F.elu, F.leaky_relu, F.softplus, F.logsigmoid, F.hardswish):
        with pytest.raises(NotImplementedError):
            fn(x)


@pytest.mark.parametrize("call, exc", [
    (lambda: F.gelu(mt.ones(2), approximate="fast"), RuntimeError),
    (lambda: F.hardtanh(mt.ones(2), 2.0, 1.0), ValueError),
    (lambda: F.glu(mt.ones(3)), RuntimeError),
    (lambda: F.glu(mt.tensor(1.0)), RuntimeError),
    (lambda: F.glu(mt.ones(2, 2), 2), IndexError),
    (lambda: F.softshrink(mt.ones(2), -1.0), RuntimeError),
    (lambda: F.rrelu(mt.ones(2), 0.5, 0.2), RuntimeError),
    (lambda: F.prelu(mt.ones(2, 4), mt.ones(3)), RuntimeError),
    (lambda: F.prelu(mt.ones(3), mt.ones(3)), RuntimeError),
    (lambda: F.prelu(mt.tensor(1.0), mt.ones(1)), RuntimeError),
    (lambda: F.prelu(mt.ones(2, 3), mt.ones(1, 3)), RuntimeError),
    (lambda: F.elu([1.0, 2.0]), TypeError),
    (lambda: F.leaky_relu(mt.ones(2), "big"), TypeError),
    (lambda: F.celu(mt.ones(2), 0.0), RuntimeError),
    (lambda: nn.Hardtanh(1.0, -1.0), ValueError),
    (lambda: nn.PReLU(0), ValueError),
    (lambda: nn.GELU("fast"), ValueError),
    (lambda: nn.Softmax2d()(mt.ones(2, 2)), ValueError),
])
def test_bad_arguments_raise(call, exc):
    with pytest.raises(exc):
        call()


# --------------------------------------------------------------------------------------------
# modules

MODULES = [
    ("GELU", (), {}), ("GELU", ("tanh",), {}), ("SiLU", (), {}), ("SiLU", (True,), {}),
    ("Mish", (), {}), ("Mish", (True,), {}), ("ELU", (), {}), ("ELU", (0.5, True), {}),
    ("SELU", (), {}), ("SELU", (True,), {}), ("CELU", (), {}), ("CELU", (2.0, True), {}),
    ("LeakyReLU", (), {}), ("LeakyReLU", (0.2, True), {}), ("ReLU6", (), {}),
    ("ReLU6", (True,), {}), ("Hardtanh", (), {}), ("Hardtanh", (-2, 3, True), {}),
    ("Hardsigmoid", (), {}), ("Hardsigmoid", (True,), {}), ("Hardswish", (), {}),
    ("Hardswish", (True,), {}), ("Hardshrink", (), {}), ("Hardshrink", (0.3,), {}),
    ("Softshrink", (), {}), ("Softshrink", (1,), {}), ("Tanhshrink", (), {}),
    ("Softplus", (), {}), ("Softplus", (2, 10), {}), ("Softsign", (), {}),
    ("LogSigmoid", (), {}), ("Sigmoid", (), {}), ("Tanh", (), {}),
    ("Threshold", (0.1, 20), {}), ("Threshold", (0.1, 20.0, True), {}), ("GLU", (), {}),
    ("GLU", (1,), {}), ("PReLU", (), {}), ("PReLU", (4,), {"init": 0.1}), ("RReLU", (), {}),
    ("RReLU", (0.1, 0.3, True), {}), ("Softmin", (), {}), ("Softmin", (1,), {}),
    ("Softmax2d", (), {}),
]


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
@pytest.mark.parametrize("name,args,kwargs", MODULES)
def test_module_repr_state_dict_and_forward_match_torch(name, args, kwargs):
    torch = _torch()
    ours = getattr(nn, name)(*args, **kwargs).eval()
    theirs = getattr(torch.nn, name)(*args, **kwargs).eval()
    assert repr(ours) == repr(theirs)
    ours, theirs = ours.double(), theirs.double()
    sd, tsd = ours.state_dict(), theirs.state_dict()
    assert list(sd) == list(tsd)
    for k in sd:
        np.testing.assert_array_equal(_np(sd[k]), tsd[k].numpy())
    x = _input((2, 4, 3, 2), np.float64, [0.0])
    xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    # in-place modules need a non-leaf input
    out, tout = ours(xm * 1.0), theirs(xt * 1.0)
    _close(_np(out), tout.detach().numpy(), np.float64)
    out.sum().backward()
    tout.sum().backward()
    _close(_np(xm.grad), xt.grad.numpy(), np.float64)
    for (n, p), (tn, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert n == tn
        _close(_np(p.grad), tp.grad.numpy(), np.float64, n)


def test_prelu_module_learns_through_an_optimizer():
    m = nn.PReLU(3, dtype=mt.float64)
    assert m.weight.dtype == mt.float64 and m.weight.tolist() == [0.25] * 3
    opt = mt.optim.SGD(m.parameters(), lr=0.1)
    x = mt.tensor(-np.ones((2, 3, 2)))
    m(x).sum().backward()
    opt.step()
    assert np.allclose(_np(m.weight), 0.25 + 0.1 * 4)


def test_hardtanh_deprecated_keywords_warn():
    with pytest.warns(FutureWarning):
        m = nn.Hardtanh(min_value=-2.0)
    assert m.min_val == -2.0


def test_sigmoid_keeps_its_lower_tail():
    """sigmoid(x) = 1/(1+exp(-x)) keeps its relative accuracy far out in the lower tail (a
    0.5*tanh(x/2)+0.5 form gave 0 at x = -40) and never overflows at the ends."""
    x64 = mt.tensor([-700.0, -40.0, -20.0, 0.0, 20.0, 700.0], dtype=mt.float64,
                    requires_grad=True)
    want = 1 / (1 + np.exp(-x64.detach().numpy()))
    y = mt.sigmoid(x64)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=4e-16, atol=0)
    y.sum().backward()
    np.testing.assert_allclose(x64.grad.numpy(), want * (1 - want), rtol=1e-15, atol=0)
    x32 = mt.tensor([-1000.0, -80.0, -40.0, 0.0, 1000.0], dtype=mt.float32)
    got = mt.sigmoid(x32).numpy()
    np.testing.assert_allclose(got, [0.0, 1.8048513e-35, 4.2483543e-18, 0.5, 1.0], rtol=1e-6)
