"""nn.utils: gradient clipping and parameter vectors, against torch as the oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import nn

torch = pytest.importorskip("torch")


def _pair(seed=0, dtype=np.float32, scale=1.0, empty=True):
    rng = np.random.default_rng(seed)
    # torch refuses the inf-norm of an empty gradient; mpitensor counts it as 0
    shapes = [(4, 3), (3,), (2, 2, 2)] + ([(0,)] if empty else [])
    grads = [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]
    ours = [nn.Parameter(mt.zeros(s, dtype=mt.float32 if dtype == np.float32 else mt.float64))
            for s in shapes]
    theirs = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float32 if dtype == np.float32
                                              else torch.float64)) for s in shapes]
    for o, t, g in zip(ours, theirs, grads):
        o.grad = mt.from_numpy(g.copy())
        t.grad = torch.from_numpy(g.copy())
    return ours, theirs


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf, "inf", 0.5])
@pytest.mark.parametrize("max_norm", [0.1, 1e6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_grad_norm_matches_torch(norm_type, max_norm, dtype):
    ours, theirs = _pair(dtype=dtype, empty=float(norm_type) != math.inf)
    a = nn.utils.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    b = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=float(norm_type))
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(float(a), float(b), rtol=rtol)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=1e-7)


def test_clip_grad_norm_skips_missing_grads_and_handles_none_at_all():
    p = nn.Parameter(mt.ones(3))
    assert float(nn.utils.clip_grad_norm_([p], 1.0)) == 0.0
    q = nn.Parameter(mt.ones(2))
    q.grad = mt.tensor([3.0, 4.0])
    total = nn.utils.clip_grad_norm_([p, q], 1.0)
    assert float(total) == pytest.approx(5.0)
    np.testing.assert_allclose(q.grad.numpy(), [0.6, 0.8], rtol=1e-5)
    assert p.grad is None


def test_nonfinite_norm():
    p = nn.Parameter(mt.ones(2))
    p.grad = mt.tensor([float("inf"), 1.0])
    with pytest.raises(RuntimeError, match="error_if_nonfinite"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert math.isinf(float(nn.utils.clip_grad_norm_([p], 1.0)))
    with pytest.raises(TypeError):
        nn.utils.clip_grad_norm_([p], 1.0, norm_type="big")


def test_clip_grad_value_matches_torch():
    ours, theirs = _pair(scale=3.0)
    nn.utils.clip_grad_value_(ours, 0.7)
    torch.nn.utils.clip_grad_value_(theirs, 0.7)
    for o, t in zip(ours, theirs):
        np.testing.assert_array_equal(o.grad.numpy(), t.grad.numpy())


def test_clip_inside_a_training_step_matches_torch():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    ours = nn.Linear(4, 5)
    theirs = torch.nn.Linear(4, 5)
    for m, lib in ((ours, mt), (theirs, torch)):
        m.load_state_dict({"weight": lib.from_numpy(w.copy()),
                           "bias": lib.from_numpy(np.zeros(5, np.float32))})
    for m, lib, opt_cls in ((ours, mt, mt.optim.SGD), (theirs, torch, torch.optim.SGD)):
        opt = opt_cls(m.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            (m(lib.from_numpy(x)) ** 2).sum().backward()
            lib.nn.utils.clip_grad_norm_(m.parameters(), 0.25)
            opt.step()
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_parameters_to_vector_and_back():
    m = nn.Linear(3, 2)
    v = nn.utils.parameters_to_vector(m.parameters())
    assert tuple(v.shape) == (8,)
    np.testing.assert_array_equal(v.detach().numpy()[:6], m.weight.detach().numpy().ravel())
    nn.utils.vector_to_parameters(mt.arange(8, dtype=mt.float32), m.parameters())
    np.testing.assert_array_equal(m.bias.detach().numpy(), [6.0, 7.0])
    v.sum().backward()  # differentiable, as in torch
    np.testing.assert_array_equal(m.weight.grad.numpy(), np.ones((2, 3)))
    with pytest.raises(ValueError, match="8"):
        nn.utils.vector_to_parameters(mt.zeros(7), m.parameters())
    with pytest.raises(ValueError, match="1-d"):
        nn.utils.vector_to_parameters(mt.zeros(2, 4), m.parameters())
