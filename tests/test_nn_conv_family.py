"""The convolution family against PyTorch: ``F.conv1d/conv3d``, ``F.conv_transpose1d/2d/3d``
and the modules ``Conv1d``, ``Conv2d``, ``Conv3d``, ``ConvTranspose1d/2d/3d``.

Values and the input, weight and bias gradients over many geometries (stride, padding as ints,
tuples and strings, output padding, dilation, groups, bias, unbatched inputs). float64 is held
to 1e-10 of the largest entry; float32 is compared with torch's float64 result on the same
(float32) inputs, to float32's rounding times the reduction length of each output (so the
bound follows from the arithmetic, not from one machine's BLAS). Bad arguments raise torch's
exception classes (checked by making the same call in torch). Module reprs, state-dict keys,
attributes, the default init's bounds, ``output_size=``, and the padding modes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RNG = np.random.default_rng(25)
EPS32 = float(np.finfo(np.float32).eps)


def _np(t):
    return np.asarray(t.detach()._data)


def _assert_close(got, want, dtype, length, what):
    """float64: 1e-10 of the largest entry; float32: eps32 times the reduction length."""
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    tol = 1e-10 if dtype == np.float64 else 2 * EPS32 * length
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=tol * scale,
                               err_msg=what)
    assert np.asarray(got).dtype == dtype, what


def _check(fname, x, w, b, dtype, lengths, **kw):
    """Our ``F.<fname>`` against torch's (float64, on the same rounded inputs): the output and
    the gradients of input, weight and bias for a random output gradient."""
    x, w = x.astype(dtype), w.astype(dtype)
    b = None if b is None else b.astype(dtype)
    X, W = mt.tensor(x, requires_grad=True), mt.tensor(w, requires_grad=True)
    B = None if b is None else mt.tensor(b, requires_grad=True)
    y = getattr(F, fname)(X, W, B, **kw)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    tw = torch.tensor(w.astype(np.float64), requires_grad=True)
    tb = None if b is None else torch.tensor(b.astype(np.float64), requires_grad=True)
    ty = getattr(TF, fname)(tx, tw, tb, **kw)
    assert tuple(y.shape) == tuple(ty.shape), fname
    gy = RNG.standard_normal(tuple(ty.shape)).astype(dtype)
    (y * mt.tensor(gy)).sum().backward()
    (ty * torch.tensor(gy.astype(np.float64))).sum().backward()
    fwd, dx, dw = lengths
    _assert_close(_np(y), ty.detach().numpy(), dtype, fwd, f"{fname} output {kw}")
    _assert_close(_np(X.grad), tx.grad.numpy(), dtype, dx, f"{fname} input grad {kw}")
    _assert_close(_np(W.grad), tw.grad.numpy(), dtype, dw, f"{fname} weight grad {kw}")
    if b is not None:
        _assert_close(_np(B.grad), tb.grad.numpy(), dtype, dw, f"{fname} bias grad {kw}")


def _tup(v, nd):
    return (v,) * nd if isinstance(v, int) else tuple(v)


# (spatial sizes, kernel, options) per dimensionality; each run with and without bias,
# batched and unbatched, float32 and float64
CONV_CASES = {
    1: [((9,), (3,), {}),
        ((12,), (4,), {"stride": 2, "padding": 1}),
        ((11,), (3,), {"stride": (3,), "padding": (2,), "dilation": 2}),
        ((10,), (4,), {"padding": "same"}),
        ((10,), (2,), {"padding": "same", "dilation": 3}),
        ((10,), (3,), {"padding": "valid", "groups": 2}),
        ((8,), (1,), {"groups": 4})],
    3: [((5, 6, 4), (3, 3, 3), {}),
        ((6, 5, 7), (2, 3, 2), {"stride": (2, 1, 3), "padding": (1, 0, 2)}),
        ((7, 7, 7), (3, 2, 3), {"dilation": (2, 1, 2), "padding": 1, "groups": 2}),
        ((5, 6, 4), (2, 3, 4), {"padding": "same"}),
        ((5, 6, 4), (3, 3, 3), {"padding": "valid", "stride": 2, "groups": 4})],
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nd", [1, 3])
def test_conv_values_and_gradients_match_torch(nd, dtype):
    fname = f"conv{nd}d"
    for sizes, k, kw in CONV_CASES[nd]:
        g = kw.get("groups", 1)
        cin, cout = 4, 4 * (2 if g < 4 else 1)
        for batched, bias in ((True, True), (False, False), (True, False)):
            shape = ((3, cin) if batched else (cin,)) + sizes
            x = RNG.standard_normal(shape)
            w = RNG.standard_normal((cout, cin // g, *k))
            b = RNG.standard_normal(cout) if bias else None
            kk = math.prod(k)
            # one output sums C/G*prod(k) products; a weight entry sums N*prod(out); an input
            # entry at most O/G*prod(k)
            lengths = ((cin // g) * kk, (cout // g) * kk, 3 * math.prod(sizes))
            _check(fname, x, w, b, dtype, lengths, **kw)


TRANSPOSE_CASES = {
    1: [((5,), (3,), {}),
        ((6,), (4,), {"stride": 2, "padding": 1}),
        ((5,), (3,), {"stride": 3, "padding": 2, "output_padding": 2, "dilation": 2}),
        ((4,), (3,), {"stride": 1, "dilation": 3, "output_padding": 2}),  # op >= stride
        ((7,), (2,), {"stride": 2, "groups": 2, "output_padding": 1})],
    2: [((4, 5), (3, 3), {}),
        ((4, 4), (4, 4), {"stride": 2, "padding": 1}),
        ((3, 5), (2, 3), {"stride": (2, 3), "padding": (0, 1), "output_padding": (1, 2)}),
        ((4, 3), (3, 2), {"dilation": (2, 1), "groups": 2, "padding": (2, 0)}),
        ((3, 3), (3, 3), {"stride": 1, "dilation": 2, "output_padding": 1}),
        ((5, 5), (1, 1), {"stride": 2, "groups": 4})],
    3: [((3, 4, 2), (3, 3, 3), {}),
        ((3, 3, 3), (4, 4, 4), {"stride": 2, "padding": 1}),
        ((2, 3, 4), (2, 3, 2), {"stride": (2, 1, 3), "padding": (1, 0, 1),
                                "output_padding": (1, 0, 2), "dilation": (1, 2, 1),
                                "groups": 2})],
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_transpose_values_and_gradients_match_torch(nd, dtype):
    fname = f"conv_transpose{nd}d"
    for sizes, k, kw in TRANSPOSE_CASES[nd]:
        g = kw.get("groups", 1)
        cin, cout = 4, 6 if g < 4 else 4
        for batched, bias in ((True, True), (False, True), (True, False)):
            shape = ((3, cin) if batched else (cin,)) + sizes
            x = RNG.standard_normal(shape)
            w = RNG.standard_normal((cin, cout // g, *k))
            b = RNG.standard_normal(cout) if bias else None
            kk = math.prod(k)
            # an output entry sums at most C_in/G*prod(k) products, an input-gradient entry
            # C_out/G*prod(k), a weight-gradient entry N*prod(input sizes)
            lengths = ((cin // g) * kk, (cout // g) * kk, 3 * math.prod(sizes))
            _check(fname, x, w, b, dtype, lengths, **kw)


@pytest.mark.parametrize("fname,x,w,kw", [
    # conv2d's banded im2col and compiled loops (one group, big im2col matrices)
    ("conv_transpose2d", (8, 128, 8, 8), (128, 64, 4, 4), {"stride": 2, "padding": 1}),
    ("conv_transpose2d", (16, 100, 1, 1), (100, 256, 4, 4), {}),
    # the input gradient through Winograd's F(2x2, 3x3) (3x3, stride 1, 64+ channels)
    ("conv_transpose2d", (4, 64, 12, 12), (64, 64, 3, 3), {"padding": 1}),
    ("conv1d", (8, 64, 300), (96, 64, 5), {"padding": 2}),
    ("conv_transpose1d", (8, 96, 150), (96, 64, 4), {"stride": 2, "padding": 1}),
])
def test_fast_paths_of_conv2d_kernels(fname, x, w, kw):
    """Shapes big enough to take conv2d's bands, compiled loops and Winograd (float32)."""
    cin, k = x[1], math.prod(w[2:])
    length = max(cin * k, w[1] * k, x[0] * math.prod(x[2:]) * 4)
    b = RNG.standard_normal(w[1] if fname.startswith("conv_t") else w[0])
    _check(fname, RNG.standard_normal(x), RNG.standard_normal(w), b, np.float32,
           (length, length, length), **kw)


def test_conv_transpose_is_the_adjoint_of_conv():
    """<conv(x), y> == <x, conv_transpose(y)> for the same weight and geometry."""
    x = RNG.standard_normal((2, 6, 9, 8))
    w = RNG.standard_normal((4, 3, 3, 2))
    kw = {"stride": 2, "padding": 1, "dilation": (1, 2), "groups": 2}
    y = F.conv2d(mt.tensor(x), mt.tensor(w), **kw)
    gy = RNG.standard_normal(tuple(y.shape))
    back = F.conv_transpose2d(mt.tensor(gy), mt.tensor(w), output_padding=(0, 1), **kw)
    assert tuple(back.shape) == x.shape
    lhs = float((_np(y) * gy).sum())
    rhs = float((x * _np(back)).sum())
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


# --------------------------------------------------------------------------------------------
# modules


def _module_pair(cls_name, *args, **kwargs):
    ours = getattr(nn, cls_name)(*args, dtype=mt.float64, **kwargs)
    theirs = getattr(torch.nn, cls_name)(*args, dtype=torch.float64, **kwargs)
    return ours, theirs


MODULE_CASES = [
    ("Conv1d", (4, 6, 3), {}),
    ("Conv1d", (4, 6, 4), {"stride": 2, "padding": 2, "dilation": 2, "groups": 2,
                           "bias": False}),
    ("Conv1d", (4, 6, 4), {"padding": "same", "padding_mode": "reflect"}),
    ("Conv1d", (4, 6, 3), {"padding": 2, "padding_mode": "replicate", "stride": 2}),
    ("Conv1d", (4, 6, 3), {"padding": 3, "padding_mode": "circular"}),
    ("Conv2d", (4, 6, (3, 2)), {"padding": "same", "padding_mode": "circular"}),
    ("Conv2d", (4, 6, 3), {"padding": (1, 2), "padding_mode": "reflect", "dilation": (2, 1),
                           "groups": 2}),
    ("Conv3d", (4, 6, 3), {}),
    ("Conv3d", (4, 6, (2, 3, 2)), {"padding": "same", "padding_mode": "reflect"}),
    ("Conv3d", (4, 6, 2), {"padding": (1, 0, 2), "padding_mode": "replicate", "stride": 2}),
    ("Conv3d", (4, 6, 3), {"padding": 1, "padding_mode": "circular", "groups": 2}),
    ("ConvTranspose1d", (4, 6, 3), {"stride": 2, "output_padding": 1}),
    ("ConvTranspose2d", (4, 6, 4), {"stride": 2, "padding": 1, "bias": False}),
    ("ConvTranspose2d", (4, 6, (3, 2)), {"stride": (2, 1), "dilation": (1, 2), "groups": 2}),
    ("ConvTranspose3d", (4, 6, 2), {"stride": 2, "padding": (0, 1, 0),
                                    "output_padding": (1, 0, 1)}),
]

SPATIAL = {"1": (7,), "2": (6, 5), "3": (5, 4, 6)}


@pytest.mark.parametrize("cls_name,args,kwargs", MODULE_CASES)
def test_module_matches_torch(cls_name, args, kwargs):
    ours, theirs = _module_pair(cls_name, *args, **kwargs)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
                 "groups", "padding_mode", "output_padding", "transposed",
                 "_reversed_padding_repeated_twice"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert tuple(ours.weight.shape) == tuple(theirs.weight.shape)
    ours.load_state_dict({k: mt.tensor(v.detach().numpy()) for k, v in
                          theirs.state_dict().items()})
    x = RNG.standard_normal((2, args[0], *SPATIAL[cls_name[-2]]))
    X, tx = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, ty = ours(X), theirs(tx)
    gy = RNG.standard_normal(tuple(ty.shape))
    (y * mt.tensor(gy)).sum().backward()
    (ty * torch.tensor(gy)).sum().backward()
    for got, want, what in [(_np(y), ty.detach().numpy(), "output"),
                            (_np(X.grad), tx.grad.numpy(), "input grad"),
                            (_np(ours.weight.grad), theirs.weight.grad.numpy(), "weight grad")]:
        _assert_close(got, want, np.float64, 1, f"{cls_name} {what}")
    if theirs.bias is not None:
        _assert_close(_np(ours.bias.grad), theirs.bias.grad.numpy(), np.float64, 1, "bias")


@pytest.mark.parametrize("cls_name,args", [
    ("Conv1d", (4, 6, 3)), ("Conv3d", (4, 6, (2, 3, 1))), ("ConvTranspose1d", (4, 6, 5)),
    ("ConvTranspose2d", (6, 4, 3)), ("ConvTranspose3d", (4, 8, 2)),
])
def test_default_init_follows_torch(cls_name, args):
    """kaiming-uniform(a=√5): weights and bias within ±1/√fan_in, fan_in read off
    weight.shape[1] * prod(kernel), as torch reads it (for a transposed weight: out/groups)."""
    m = getattr(nn, cls_name)(*args, groups=2)
    t = getattr(torch.nn, cls_name)(*args, groups=2)
    assert m.weight.dtype == mt.float32
    assert tuple(m.weight.shape) == tuple(t.weight.shape)
    bound = 1 / math.sqrt(m.weight.shape[1] * math.prod(m.weight.shape[2:]))
    w = _np(m.weight)
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.5 * bound
    assert np.abs(_np(m.bias)).max() <= bound
    assert tuple(m.bias.shape) == (args[1],)


def test_conv_transpose_output_size():
    m = nn.ConvTranspose2d(4, 2, 3, stride=(2, 3), padding=1)
    t = torch.nn.ConvTranspose2d(4, 2, 3, stride=(2, 3), padding=1)
    x = RNG.standard_normal((1, 4, 5, 6)).astype(np.float32)
    for size in ([9, 16], [10, 17], [1, 2, 10, 18], (9, 18)):
        got = m(mt.tensor(x), output_size=size)
        want = t(torch.tensor(x), output_size=size)
        assert tuple(got.shape) == tuple(want.shape)
    for bad in ([8, 16], [11, 16], [1, 2, 3], [10]):
        with pytest.raises(ValueError):
            t(torch.tensor(x), output_size=bad)
        with pytest.raises(ValueError):
            m(mt.tensor(x), output_size=bad)
    u = nn.ConvTranspose1d(2, 2, 3, stride=2)
    assert tuple(u(mt.randn(2, 5), output_size=[12]).shape) == (2, 12)


def test_module_paths():
    from mpitensor.nn.modules.conv import (  # noqa: F401
        Conv1d,
        Conv2d,
        Conv3d,
        ConvTranspose1d,
        ConvTranspose2d,
        ConvTranspose3d,
    )

    assert ConvTranspose2d is nn.ConvTranspose2d
    from mpitensor.nn.modules.conv import _ConvNd, _ConvTransposeNd

    for cls in (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d):
        assert issubclass(cls, _ConvNd)
        assert issubclass(cls, _ConvTransposeNd) == cls.__name__.startswith("ConvTranspose")
    for name in ("conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                 "conv_transpose3d"):
        assert name in F.__all__


# --------------------------------------------------------------------------------------------
# bad arguments: torch's exception class, raised before any work


def _raises_like_torch(call):
    """``call(lib, functional, tensor)`` raises in torch and raises the same class here."""
    try:
        call(torch.nn, TF, torch.tensor)
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        want = type(e)
    else:
        pytest.fail("torch accepted the call")
    with pytest.raises(want):
        call(nn, F, mt.tensor)


X3 = RNG.standard_normal((2, 4, 6)).astype(np.float32)
W3 = RNG.standard_normal((4, 2, 3)).astype(np.float32)
X5 = RNG.standard_normal((1, 4, 3, 3, 3)).astype(np.float32)
W5 = RNG.standard_normal((4, 2, 2, 2, 2)).astype(np.float32)

BAD_CALLS = [
    lambda n, f, t: f.conv1d(t(X3[None]), t(W3)),  # input rank
    lambda n, f, t: f.conv1d(t(X3), t(W3[0])),  # weight rank
    lambda n, f, t: f.conv1d(t(X3), t(W3), padding="full"),
    lambda n, f, t: f.conv1d(t(X3), t(W3), padding="same", stride=2),
    lambda n, f, t: f.conv1d(t(X3), t(W3), padding=-1),
    lambda n, f, t: f.conv1d(t(X3), t(W3), stride=0),
    lambda n, f, t: f.conv1d(t(X3), t(W3), dilation=0),
    lambda n, f, t: f.conv1d(t(X3), t(W3), groups=0),
    lambda n, f, t: f.conv1d(t(X3), t(W3), groups=3),  # channel mismatch
    lambda n, f, t: f.conv1d(t(X3), t(W3), stride=(1, 1)),
    lambda n, f, t: f.conv1d(t(X3), t(W3), dilation=4),  # kernel past the input
    lambda n, f, t: f.conv1d(t(X3), t(W3), t(np.zeros(3, np.float32))),  # bias size
    lambda n, f, t: f.conv1d(t(X3), t(W3.astype(np.float64))),  # mixed dtypes
    lambda n, f, t: f.conv3d(t(X5), t(W5), groups=2, padding=(1, 1)),
    lambda n, f, t: f.conv3d(t(X5[0, 0]), t(W5)),
    lambda n, f, t: f.conv_transpose1d(t(X3), t(W3), output_padding=1),  # op >= stride
    lambda n, f, t: f.conv_transpose1d(t(X3), t(W3), stride=2, output_padding=2),
    lambda n, f, t: f.conv_transpose1d(t(X3), t(W3), padding=-1),
    lambda n, f, t: f.conv_transpose1d(t(X3), t(W3), padding="same"),
    lambda n, f, t: f.conv_transpose1d(t(X3[:, :3]), t(W3)),  # channel mismatch
    lambda n, f, t: f.conv_transpose2d(t(X3), t(W3[..., None])),
    lambda n, f, t: f.conv_transpose3d(t(X5), t(W5), groups=3),
    # conv2d: its first errors were ValueError; they are torch's RuntimeError too now
    lambda n, f, t: f.conv2d(t(X3[None]), t(W3[..., None]), padding="full"),
    lambda n, f, t: f.conv2d(t(X3[None]), t(W3[..., None]), padding="same", stride=2),
    lambda n, f, t: f.conv2d(t(X3[None]), t(W3[..., None]), padding=-1),
    lambda n, f, t: f.conv2d(t(X3[None]), t(W3[..., None]), stride=0),
    lambda n, f, t: f.conv2d(t(X3[None]), t(W3[..., None]), dilation=(1, 0)),
    lambda n, f, t: f.conv2d(t(X3[None]), t(W3[..., None]), groups=0),
    lambda n, f, t: f.conv2d(t(X3[None]), t(W3[..., None]), stride=(1, 1, 1)),
    lambda n, f, t: n.Conv2d(4, 4, 3, padding=3, padding_mode="reflect")(t(X3[None])),
    lambda n, f, t: n.Conv1d(3, 4, 3, groups=2),
    lambda n, f, t: n.Conv1d(4, 3, 3, groups=2),
    lambda n, f, t: n.Conv1d(4, 4, 3, groups=0),
    lambda n, f, t: n.Conv3d(4, 4, 3, padding="full"),
    lambda n, f, t: n.Conv3d(4, 4, 3, padding="same", stride=2),
    lambda n, f, t: n.Conv1d(4, 4, 3, padding_mode="mirror"),
    lambda n, f, t: n.ConvTranspose2d(4, 4, 3, padding_mode="reflect"),
    lambda n, f, t: n.ConvTranspose1d(4, 4, 3, padding_mode="circular"),
    lambda n, f, t: n.Conv1d(4, 4, 3, padding=6, padding_mode="reflect")(t(X3)),
]


@pytest.mark.parametrize("call", BAD_CALLS, ids=range(len(BAD_CALLS)))
def test_bad_arguments_raise_torchs_exception_class(call):
    _raises_like_torch(call)


# --------------------------------------------------------------------------------------------
# CuPy


def test_family_on_cupy():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no usable GPU
        pytest.skip("CuPy is installed but no GPU is usable")
    for fname, x, w, kw in [
        ("conv1d", (2, 4, 9), (6, 2, 3), {"stride": 2, "padding": 1, "groups": 2}),
        ("conv3d", (2, 4, 5, 4, 6), (6, 4, 3, 2, 3), {"padding": "same"}),
        ("conv_transpose1d", (2, 4, 5), (4, 3, 4), {"stride": 2, "padding": 1}),
        ("conv_transpose2d", (2, 4, 4, 5), (4, 3, 3, 3), {"stride": 2, "output_padding": 1}),
        ("conv_transpose3d", (2, 4, 2, 3, 2), (4, 2, 2, 2, 2), {"stride": 2, "groups": 2}),
    ]:
        xa, wa = RNG.standard_normal(x), RNG.standard_normal(w)
        X = mt.tensor(cp.asarray(xa), requires_grad=True)
        W = mt.tensor(cp.asarray(wa), requires_grad=True)
        y = getattr(F, fname)(X, W, **kw)
        (y * y).sum().backward()
        tx = torch.tensor(xa, requires_grad=True)
        tw = torch.tensor(wa, requires_grad=True)
        ty = getattr(TF, fname)(tx, tw, **kw)
        (ty * ty).sum().backward()
        for got, want in [(y.detach()._data, ty.detach().numpy()),
                          (X.grad._data, tx.grad.numpy()), (W.grad._data, tw.grad.numpy())]:
            assert isinstance(got, cp.ndarray)
            _assert_close(cp.asnumpy(got), want, np.float64, 1, fname)
    m = nn.Conv1d(4, 4, 3, padding=2, padding_mode="reflect", dtype=mt.float64)
    m.weight = nn.Parameter(mt.tensor(cp.asarray(_np(m.weight))))
    m.bias = nn.Parameter(mt.tensor(cp.asarray(_np(m.bias))))
    out = m(mt.tensor(cp.asarray(RNG.standard_normal((2, 4, 7)))))
    assert isinstance(out._data, cp.ndarray)


# --------------------------------------------------------------------------------------------
# layers chained as models chain them (each layer's output layout feeds the next)


def _chain(lib, kind):
    nn_ = lib.nn
    if kind == "generator":
        return nn_.Sequential(
            nn_.ConvTranspose2d(8, 16, 4, 1, 0, bias=False), nn_.BatchNorm2d(16), nn_.ReLU(True),
            nn_.ConvTranspose2d(16, 8, 4, 2, 1, bias=False), nn_.BatchNorm2d(8), nn_.ReLU(True),
            nn_.ConvTranspose2d(8, 3, 4, 2, 1), nn_.Tanh())
    if kind == "conv1d":
        return nn_.Sequential(
            nn_.Conv1d(4, 8, 5, padding=2), nn_.ReLU(), nn_.Conv1d(8, 8, 3, stride=2),
            nn_.ReLU(), nn_.ConvTranspose1d(8, 4, 3, stride=2, output_padding=1),
            nn_.Conv1d(4, 2, 3, padding="same", padding_mode="reflect"))
    return nn_.Sequential(
        nn_.Conv3d(2, 4, 3, padding=1), nn_.ReLU(), nn_.Conv3d(4, 4, 2, stride=2),
        nn_.ConvTranspose3d(4, 2, 2, stride=2), nn_.Conv3d(2, 2, 3, padding="same",
                                                           padding_mode="circular"))


@pytest.mark.parametrize("kind,shape", [("generator", (3, 8, 1, 1)), ("conv1d", (3, 4, 20)),
                                        ("conv3d", (2, 2, 6, 4, 6))])
def test_chained_layers_match_torch(kind, shape):
    ours, theirs = _chain(mt, kind).double(), _chain(torch, kind).double()
    ours.load_state_dict({k: mt.tensor(v.detach().numpy()) for k, v in
                          theirs.state_dict().items()})
    x = RNG.standard_normal(shape)
    X, tx = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, ty = ours(X), theirs(tx)
    gy = RNG.standard_normal(tuple(ty.shape))
    (y * mt.tensor(gy)).sum().backward()
    (ty * torch.tensor(gy)).sum().backward()
    _assert_close(_np(y), ty.detach().numpy(), np.float64, 1, f"{kind} output")
    _assert_close(_np(X.grad), tx.grad.numpy(), np.float64, 1, f"{kind} input grad")
    for (name, p), tp in zip(ours.named_parameters(), theirs.parameters()):
        _assert_close(_np(p.grad), tp.grad.numpy(), np.float64, 1, f"{kind} {name} grad")


@pytest.mark.parametrize("fname,x,w,kw", [
    ("conv1d", (0, 4, 9), (6, 2, 3), {"groups": 2}),
    ("conv2d", (0, 4, 9, 8), (6, 4, 3, 3), {"stride": 2}),
    ("conv3d", (0, 4, 5, 5, 5), (6, 4, 3, 3, 3), {"padding": "same"}),
    ("conv_transpose1d", (0, 4, 5), (4, 3, 3), {"stride": 2}),
    ("conv_transpose2d", (0, 4, 5, 5), (4, 3, 3, 3), {"stride": 2, "output_padding": 1}),
    ("conv_transpose3d", (0, 4, 2, 3, 2), (4, 1, 2, 2, 2), {"groups": 2}),
])
def test_empty_batch_gives_torchs_empty_output_and_zero_gradients(fname, x, w, kw):
    cout = w[1] * kw.get("groups", 1) if "transpose" in fname else w[0]
    X, W = mt.zeros(*x, requires_grad=True), mt.randn(*w, requires_grad=True)
    B = mt.randn(cout, requires_grad=True)
    y = getattr(F, fname)(X, W, B, **kw)
    want = getattr(TF, fname)(torch.zeros(x), torch.randn(w), torch.randn(cout), **kw)
    assert tuple(y.shape) == tuple(want.shape)
    y.sum().backward()
    assert tuple(X.grad.shape) == x
    assert not _np(W.grad).any() and not _np(B.grad).any()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_3d_kernels_in_slabs_match_torch(monkeypatch, dtype):
    """The generic kernels' slab loops (one position of the first output dimension a slab)
    give what the whole matrices give."""
    from mpitensor.nn._kernels import convnd as _convnd

    monkeypatch.setattr(_convnd, "SLAB_BYTES", 1)
    for fname, sizes, k, kw in [
        ("conv3d", (5, 6, 4), (3, 2, 3), {"stride": (2, 1, 1), "padding": 1, "groups": 2}),
        ("conv3d", (7, 5, 5), (3, 3, 3), {"dilation": (2, 1, 1), "padding": "same"}),
        ("conv_transpose3d", (3, 4, 2), (3, 3, 2), {"stride": 2, "output_padding": 1}),
    ]:
        x = RNG.standard_normal((2, 4, *sizes))
        wshape = (4, 3, *k) if "transpose" in fname else (6, 4 // kw.get("groups", 1), *k)
        w = RNG.standard_normal(wshape)
        b = RNG.standard_normal(3 if "transpose" in fname else 6)
        kk = math.prod(k)
        _check(fname, x, w, b, dtype, (4 * kk, 6 * kk, 2 * math.prod(sizes)), **kw)


def test_whole_torch_modules_load_and_run(tmp_path):
    """A torch convolution pickled whole (torch.save(module)) loads as ours and computes the
    same: forward reads only the attributes torch's objects carry."""
    for m in [torch.nn.Conv1d(2, 3, 3, padding_mode="reflect", padding=1),
              torch.nn.Conv2d(2, 3, (3, 2), padding="same", padding_mode="circular"),
              torch.nn.Conv3d(2, 3, (3, 2, 1), padding=(1, 2, 0), padding_mode="replicate"),
              torch.nn.ConvTranspose2d(2, 3, 4, stride=2, output_padding=1)]:
        path = tmp_path / "m.pt"
        torch.save(m.double(), path)
        ours = mt.load(path, weights_only=False)
        assert type(ours).__name__ == type(m).__name__
        x = RNG.standard_normal((1, 2) + (6,) * (m.weight.dim() - 2))
        _assert_close(_np(ours(mt.tensor(x))), m(torch.tensor(x)).detach().numpy(),
                      np.float64, 1, type(m).__name__)
