"""torch.func: functional_call, grad, vmap (a loop), vjp, jacrev/jacfwd, stack_module_state.
Each program runs under mpitensor and, where torch is installed, under torch as the oracle,
with the same weights (float64, so values agree to a few ulps of the accumulated sums)."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
except ImportError:  # the oracle half of each comparison is skipped, not the test
    torch = None

LIBS = [mt] + ([torch] if torch is not None else [])
RTOL = 1e-12  # float64 sums of a few dozen terms, in different orders


def _np(t):
    return np.asarray(t.detach().numpy())


def _tree_np(x):
    if isinstance(x, dict):
        return {k: _tree_np(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return [_tree_np(v) for v in x]
    return _np(x)


def _compare(mine, theirs, rtol=RTOL, atol=1e-14):
    if isinstance(mine, dict):
        assert list(mine) == list(theirs)
        for k in mine:
            _compare(mine[k], theirs[k], rtol, atol)
    elif isinstance(mine, list):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            _compare(a, b, rtol, atol)
    else:
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine, theirs, rtol=rtol, atol=atol)


def _oracle(program, *args):
    """(mpitensor's result, torch's or None), each as NumPy trees."""
    mine = _tree_np(program(mt, *args))
    theirs = _tree_np(program(torch, *args)) if torch is not None else None
    return mine, theirs


def _check(program, *args):
    mine, theirs = _oracle(program, *args)
    if theirs is not None:
        _compare(mine, theirs)
    return mine


def mlp(T, sizes=(3, 5, 2), seed=0):
    """A small float64 MLP with weights drawn from NumPy (the same under both libraries)."""
    rng = np.random.default_rng(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = T.nn.Linear(a, b).double()
        with T.no_grad():
            lin.weight.copy_(T.tensor(rng.standard_normal((b, a)) * 0.5, dtype=T.float64))
            lin.bias.copy_(T.tensor(rng.standard_normal(b) * 0.1, dtype=T.float64))
        layers += [lin, T.nn.Tanh()] if i < len(sizes) - 2 else [lin]
    return T.nn.Sequential(*layers)


def data(T, *shape, seed=1):
    return T.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=T.float64)


# ------------------------------------------------------------------------------ functional_call


def functional_call_program(T):
    from importlib import import_module
    func = import_module(f"{T.__name__}.func")
    model = mlp(T)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    other = {k: v * 2 for k, v in model.named_parameters()}
    x = data(T, 4, 3)
    out = func.functional_call(model, other, (x,))
    partial = func.functional_call(model, {"2.bias": T.zeros(2, dtype=T.float64)}, x)
    after = {k: bool((v == before[k]).all()) for k, v in model.named_parameters()}
    assert all(after.values())                    # the module's own tensors are back
    return [out, partial, model(x)]


def test_functional_call_equals_torch_and_restores():
    out, partial, plain = _check(functional_call_program)
    assert not np.allclose(out, plain)
    model = mlp(mt)
    x = data(mt, 4, 3)
    with mt.no_grad():
        model[2].weight.mul_(2)
        model[2].bias.mul_(2)
        model[0].weight.mul_(2)
        model[0].bias.mul_(2)
    np.testing.assert_array_equal(out, _np(model(x)))
    np.testing.assert_allclose(partial, plain - _np(mlp(mt)[2].bias), rtol=1e-15, atol=1e-15)


def test_functional_call_strict_ties_buffers_and_errors():
    from mpitensor.func import functional_call

    model = mlp(mt)
    with pytest.raises(RuntimeError, match=r"missing keys \['0.bias', '2.bias', '2.weight'\]"):
        functional_call(model, {"0.weight": mt.zeros(5, 3, dtype=mt.float64)}, (data(mt, 3),),
                        strict=True)
    with pytest.raises(ValueError, match="more than one"):
        functional_call(model, ({"0.bias": mt.zeros(5)}, {"0.bias": mt.ones(5)}), (data(mt, 3),))
    # tied weights: one tensor under two names
    tied = mt.nn.Sequential(mt.nn.Linear(2, 2, bias=False), mt.nn.Linear(2, 2, bias=False))
    tied[1].weight = tied[0].weight
    x = mt.ones(2)
    w = mt.eye(2) * 3
    out = functional_call(tied, {"0.weight": w}, (x,))
    assert out.tolist() == [9.0, 9.0]
    out = functional_call(tied, {"0.weight": w}, (x,), tie_weights=False)
    assert out.tolist() == _np(tied[1](w @ x)).tolist()
    with pytest.raises(ValueError, match="tied"):
        functional_call(tied, {"0.weight": w, "1.weight": w * 2}, (x,))
    # a buffer, and the call restoring it after an exception
    bn = mt.nn.BatchNorm1d(2).eval()
    y = functional_call(bn, {"running_mean": mt.ones(2)}, (mt.ones(3, 2),))
    assert np.allclose(_np(y), 0.0)
    with pytest.raises(RuntimeError):
        functional_call(bn, {"running_mean": mt.ones(2)}, (mt.ones(3, 5),))
    assert bn.running_mean.tolist() == [0.0, 0.0]


# ------------------------------------------------------------------------------ grad, vmap


def grad_program(T):
    from importlib import import_module
    func = import_module(f"{T.__name__}.func")
    model = mlp(T)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = data(T, 4, 3), data(T, 4, 2, seed=2)

    def loss(p, xb, yb):
        return ((func.functional_call(model, p, (xb,)) - yb) ** 2).mean()

    g = func.grad(loss)(params, x, y)
    g2, value = func.grad_and_value(loss, argnums=(0, 1))(params, x, y)
    ga, aux = func.grad(lambda a, b: ((a * b).sum(), a.sum()), has_aux=True)(x, y[:, :1])
    return [g, g2[0], g2[1], value, ga, aux]


def test_grad_and_grad_and_value_equal_torch():
    g, g_again, gx, value, ga, aux = _check(grad_program)
    assert list(g) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    _compare(g, g_again, rtol=0, atol=0)
    # the gradient w.r.t. the parameters equals backward() on the module itself
    model = mlp(mt)
    x, y = data(mt, 4, 3), data(mt, 4, 2, seed=2)
    ((model(x) - y) ** 2).mean().backward()
    for k, p in model.named_parameters():
        np.testing.assert_array_equal(g[k], _np(p.grad))
    assert gx.shape == (4, 3) and value.shape == ()
    np.testing.assert_array_equal(ga, np.broadcast_to(_np(data(mt, 4, 2, seed=2))[:, :1], (4, 3)))


def per_sample_program(T):
    from importlib import import_module
    func = import_module(f"{T.__name__}.func")
    model = mlp(T)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = data(T, 6, 3), data(T, 6, 2, seed=2)

    def sample_loss(p, xs, ys):
        return ((func.functional_call(model, p, (xs.unsqueeze(0),)) - ys.unsqueeze(0)) ** 2).sum()

    return func.vmap(func.grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)


def test_per_sample_gradients_vmap_of_grad():
    g = _check(per_sample_program)
    model = mlp(mt)
    x, y = data(mt, 6, 3), data(mt, 6, 2, seed=2)
    for i in range(6):                     # the same as one backward per sample
        model.zero_grad()
        ((model(x[i:i + 1]) - y[i:i + 1]) ** 2).sum().backward()
        for k, p in model.named_parameters():
            np.testing.assert_array_equal(g[k][i], _np(p.grad))


def vmap_program(T):
    vmap = T.vmap
    a, b = data(T, 3, 4), data(T, 4, 3, seed=2)
    c = data(T, 2, 3, seed=3)
    out = [vmap(T.dot)(a, b.t()), vmap(T.outer, in_dims=(0, None))(a, c[0])]
    out.append(vmap(lambda x, y: x * y, in_dims=(1, 0))(b, a))           # in_dim 1
    out.append(vmap(lambda x: x.sum(0), out_dims=1)(a.reshape(3, 2, 2)))  # out_dim 1
    pair = vmap(lambda x: (x.sin(), x.cos()), out_dims=(0, 1))(a)
    out += list(pair)
    nested = vmap(lambda d, s: d["w"] * s + d["b"], in_dims=({"w": 0, "b": None}, 0))(
        {"w": a, "b": c[1, :1]}, a[:, 0])
    out.append(nested)
    out.append(vmap(vmap(lambda u, v: u * v))(a, a))                        # two levels
    out.append(vmap(lambda x: x.sum(), in_dims=-1)(b))
    return out


def test_vmap_in_dims_out_dims_equal_torch():
    got = _check(vmap_program)
    a = _np(data(mt, 3, 4))
    np.testing.assert_allclose(got[0], (a * _np(data(mt, 4, 3, seed=2)).T).sum(1), rtol=1e-15)
    assert got[4].shape == (3, 4) and got[5].shape == (4, 3)
    np.testing.assert_array_equal(got[7], a * a)


def test_vmap_errors_and_randomness():
    with pytest.raises(ValueError, match="different sizes"):
        mt.vmap(lambda x, y: x + y)(mt.ones(2), mt.ones(3))
    with pytest.raises(ValueError, match="no input is mapped"):
        mt.vmap(lambda x: x, in_dims=None)(mt.ones(2))
    with pytest.raises(ValueError, match="2 positional"):
        mt.vmap(lambda x, y: x, in_dims=(0,))(mt.ones(2), mt.ones(2))
    with pytest.raises(ValueError, match="out of range"):
        mt.vmap(lambda x: x, in_dims=2)(mt.ones(2, 2))
    with pytest.raises(RuntimeError, match="randomness='error'"):
        mt.vmap(lambda x: x + mt.randn(()))(mt.ones(3))
    drop = mt.nn.Dropout(0.5)
    if torch is not None:
        with pytest.raises(RuntimeError):
            torch.vmap(lambda x: x + torch.randn(()))(torch.ones(3))
    mt.manual_seed(0)
    same = mt.vmap(lambda x: drop(x), randomness="same")(mt.ones(4, 64))
    assert all((same[i] == same[0]).all() for i in range(4))
    diff = mt.vmap(lambda x: drop(x), randomness="different")(mt.ones(4, 64))
    assert not (diff[1] == diff[0]).all()
    with pytest.raises(ValueError, match="randomness"):
        mt.vmap(lambda x: x, randomness="sometimes")


# ------------------------------------------------------------------------------ jacobians, vjp


def jac_program(T):
    from importlib import import_module
    func = import_module(f"{T.__name__}.func")
    x, w = data(T, 3), data(T, 2, 3, seed=2)

    def f(x, w):
        return (w @ x).tanh(), x.exp()

    out = [list(func.jacrev(f)(x, w)), [list(j) for j in func.jacrev(f, argnums=(0, 1))(x, w)],
           list(func.jacfwd(f, argnums=1)(x, w))]
    value, vjp_fn = func.vjp(f, x, w)
    ct = (data(T, 2, seed=4), data(T, 3, seed=5))
    out += [list(value), list(vjp_fn(ct)), list(vjp_fn(ct))]
    return out


def test_jacrev_jacfwd_vjp_equal_torch():
    got = _check(jac_program)
    x, w = _np(data(mt, 3)), _np(data(mt, 2, 3, seed=2))
    t = np.tanh(w @ x)
    np.testing.assert_allclose(got[0][0], (1 - t ** 2)[:, None] * w, rtol=1e-15)
    np.testing.assert_array_equal(got[0][1], np.diag(np.exp(x)))
    _compare(got[4], got[5], rtol=0, atol=0)       # vjp_fn can be called again


def test_second_order_refused_clearly():
    from mpitensor import func

    with pytest.raises(NotImplementedError, match="double backward"):
        func.hessian(lambda x: (x ** 3).sum())
    nested = func.grad(lambda x: func.grad(lambda y: (y ** 3).sum())(x).sum())
    with pytest.raises(NotImplementedError, match="gradients of gradients"):
        nested(mt.ones(2))
    with pytest.raises(RuntimeError, match="one-element tensor"):
        func.grad(lambda x: x * 2)(mt.ones(2))


def ensemble_program(T):
    from importlib import import_module
    func = import_module(f"{T.__name__}.func")
    models = [mlp(T, seed=s) for s in range(3)]
    params, buffers = func.stack_module_state(models)
    base = mlp(T, seed=9)
    x = data(T, 5, 3)

    def run(p, b, xb):
        return func.functional_call(base, (p, b), (xb,))

    return [params["0.weight"], func.vmap(run, in_dims=(0, 0, None))(params, buffers, x)]


def test_stack_module_state_ensemble_equals_torch():
    stacked, outs = _check(ensemble_program)
    assert stacked.shape == (3, 5, 3) and outs.shape == (3, 5, 2)
    x = data(mt, 5, 3)
    for s in range(3):
        np.testing.assert_array_equal(outs[s], _np(mlp(mt, seed=s)(x)))
    params, _ = mt.func.stack_module_state([mlp(mt, seed=s) for s in range(2)])
    assert params["0.weight"].requires_grad and params["0.weight"].is_leaf


# ------------------------------------------------------------------------------ a user program

PROGRAM = '''
import numpy as np
import {lib} as torch
import {lib}.nn as nn
import {lib}.nn.functional as F
from {lib}.func import functional_call, grad, vmap


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


def loss_fn(predictions, targets):
    return F.nll_loss(predictions, targets)


rng = np.random.default_rng(0)
model = SmallCNN().double()
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.tensor(rng.standard_normal(tuple(p.shape)) * 0.3))
data = torch.tensor(rng.standard_normal((8, 1, 8, 8)))
targets = torch.tensor(rng.integers(0, 10, 8))

params = {{k: v.detach() for k, v in model.named_parameters()}}
buffers = {{k: v.detach() for k, v in model.named_buffers()}}


def compute_loss(params, buffers, sample, target):
    batch, batch_targets = sample.unsqueeze(0), target.unsqueeze(0)
    return loss_fn(functional_call(model, (params, buffers), (batch,)), batch_targets)


per_sample = vmap(grad(compute_loss), in_dims=(None, None, 0, 0))(params, buffers, data, targets)

# the slow way, one backward per sample, must agree
for i in range(8):
    model.zero_grad()
    loss_fn(model(data[i:i + 1]), targets[i:i + 1]).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(per_sample[name][i], p.grad, rtol=1e-12, atol=1e-14), name
result = {{k: v.numpy() for k, v in per_sample.items()}}
'''


def test_per_sample_gradients_program_in_the_tutorial_style():
    results = []
    for lib in ["mpitensor"] + (["torch"] if torch is not None else []):
        scope: dict = {}
        exec(compile(PROGRAM.format(lib=lib), f"<per-sample program, {lib}>", "exec"), scope)
        results.append(scope["result"])
    mine = results[0]
    assert mine["conv.weight"].shape == (8, 4, 1, 3, 3) and mine["fc.bias"].shape == (8, 10)
    if len(results) > 1:
        _compare(mine, results[1])


# ------------------------------------------------------------------------------ on the GPU


def _device_program(device):
    from mpitensor import backend, func

    model = mlp(mt).to(device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = data(mt, 6, 3).to(device), data(mt, 6, 2, seed=2).to(device)

    def sample_loss(p, xs, ys):
        return ((func.functional_call(model, p, (xs.unsqueeze(0),)) - ys.unsqueeze(0)) ** 2).sum()

    g = func.vmap(func.grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
    jac = mt.autograd.functional.jacobian(model, x[:2])
    xg = x.clone().requires_grad_(True)
    (gx,) = mt.autograd.grad(model(xg).pow(2).sum(), xg)
    assert mt.autograd.gradcheck(lambda t: model(t).tanh(),
                                 (xg[:2].detach().clone().requires_grad_(True),))
    assert g["0.weight"].device.type == device and jac.device.type == device
    return [backend.to_numpy(t._data) for t in (*g.values(), jac, gx)]


def test_device_program_on_cpu():
    got = _device_program("cpu")
    assert got[0].shape == (6, 5, 3) and got[4].shape == (2, 2, 2, 3)


@pytest.mark.gpu
def test_gpu_per_sample_gradients_jacobian_and_gradcheck_match_cpu():
    for a, b in zip(_device_program("cpu"), _device_program("cuda")):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
