"""torch.nn.grad's convolution gradients, torch.nn.attention's sdpa_kernel and causal
biases, and torch.nn.common_types' aliases, against torch."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F

from .nn_oracle import close, tol

torch = pytest.importorskip("torch")
rng = np.random.default_rng(6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nd,xs,ws,kw", [
    (1, (2, 4, 9), (6, 2, 3), dict(stride=2, padding=1, dilation=2, groups=2)),
    (2, (2, 4, 7, 6), (6, 2, 3, 2), dict(stride=2, padding=1, dilation=(1, 2), groups=2)),
    (3, (1, 2, 5, 4, 4), (3, 2, 2, 2, 2), dict(stride=1, padding=(1, 0, 1))),
])
def test_conv_grads(dtype, nd, xs, ws, kw):
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    conv = getattr(torch.nn.functional, f"conv{nd}d")
    g = rng.standard_normal(tuple(conv(torch.tensor(x), torch.tensor(w), **kw).shape))
    g = g.astype(dtype)
    terms = int(np.prod(ws)) * 4
    ours = getattr(nn.grad, f"conv{nd}d_input")(xs, mt.tensor(w), mt.tensor(g), **kw)
    theirs = getattr(torch.nn.grad, f"conv{nd}d_input")(xs, torch.tensor(w), torch.tensor(g),
                                                        **kw)
    close(ours, theirs, tol(dtype, terms), "input grad")
    ours = getattr(nn.grad, f"conv{nd}d_weight")(mt.tensor(x), ws, mt.tensor(g), **kw)
    theirs = getattr(torch.nn.grad, f"conv{nd}d_weight")(torch.tensor(x), ws,
                                                         torch.tensor(g), **kw)
    close(ours, theirs, tol(dtype, int(np.prod(g.shape))), "weight grad")
    with pytest.raises(RuntimeError):
        nn.grad.conv1d_input((2, 4, 9), mt.ones(6, 4, 3), mt.ones(2, 6, 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", ["causal_lower_right", "causal_upper_left"])
def test_causal_bias(dtype, variant):
    from torch.nn.attention import bias as tb

    from mpitensor.nn.attention import bias as ob
    q, k = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4))
    assert getattr(ob, variant)(3, 5)._materialize().tolist() == \
        getattr(tb, variant)(3, 5)._materialize().tolist()
    ours = F.scaled_dot_product_attention(mt.tensor(q.astype(dtype)), mt.tensor(k.astype(dtype)),
                                          mt.tensor(k.astype(dtype)),
                                          attn_mask=getattr(ob, variant)(3, 5))
    theirs = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(q.astype(dtype)), torch.tensor(k.astype(dtype)),
        torch.tensor(k.astype(dtype)), attn_mask=getattr(tb, variant)(3, 5))
    close(ours, theirs, tol(dtype, 10), "attention")


def test_sdpa_kernel():
    from mpitensor.nn.attention import SDPBackend, sdpa_kernel
    assert {b.name: b.value for b in SDPBackend} == \
        {n: int(b) for n, b in torch.nn.attention.SDPBackend.__members__.items()}
    q = mt.randn(1, 2, 3, 4)
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
        F.scaled_dot_product_attention(q, q, q)
    with sdpa_kernel("flash"):
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, q, q)
    F.scaled_dot_product_attention(q, q, q)  # the old choice is back
    with pytest.raises(ValueError):
        with sdpa_kernel("turbo"):
            pass
    with pytest.raises(NotImplementedError):
        nn.attention.activate_flash_attention_impl("FA3")
    assert nn.attention.list_flash_attention_impls() == []


def test_common_types():
    from torch.nn import common_types as theirs
    names = [n for n in dir(theirs) if n.startswith("_size") or n.startswith("_ratio")
             or n.startswith("_scalar_or_tuple")]
    assert all(hasattr(nn.common_types, n) for n in names)


def test_factory_kwargs():
    for kw in ({"device": "cpu", "dtype": 1}, None, {"factory_kwargs": {"device": "cpu"},
                                                     "dtype": 2}):
        assert nn.factory_kwargs(kw) == torch.nn.factory_kwargs(kw)
    for bad in ({"foo": 1}, {"factory_kwargs": {"device": "cpu"}, "device": "cpu"}):
        with pytest.raises(TypeError):
            torch.nn.factory_kwargs(bad)
        with pytest.raises(TypeError):
            nn.factory_kwargs(bad)
