"""mpitensor.optim: SGD against torch.optim.SGD, state dicts, zero_grad, arguments, schedulers.

Gradients come from a fixed quadratic (g = A p + b, plus per-step noise) evaluated on each
library's own current parameters, so any difference in the update compounds over the steps.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

import mpitensor as mt
from mpitensor.nn import Parameter
from mpitensor.optim import SGD, Optimizer, lr_scheduler
from mpitensor.optim.sgd import sgd

SHAPES = [(3, 4), (5,), ()]

COMBOS = [
    dict(momentum=m, dampening=d, weight_decay=w, nesterov=n, maximize=x)
    for m, d, w, n, x in itertools.product((0.0, 0.9), (0.0, 0.3), (0.0, 0.01), (False, True),
                                           (False, True))
    if not (n and (m == 0 or d != 0))
]


def _problem(dtype, seed=0):
    rng = np.random.default_rng(seed)
    ps, mats = [], []
    for shape in SHAPES:
        n = int(np.prod(shape))
        q = rng.standard_normal((n, n))
        mats.append(((q @ q.T / n + np.eye(n)) * 0.5, rng.standard_normal(n)))
        ps.append(rng.standard_normal(shape).astype(dtype))
    noise = rng.standard_normal((40, sum(int(np.prod(s)) for s in SHAPES)))
    return ps, mats, noise


def _grads(values, mats, noise_row, dtype):
    out, k = [], 0
    for v, (a, b) in zip(values, mats):
        n = v.size
        g = a @ v.reshape(-1).astype(np.float64) + b + 0.1 * noise_row[k:k + n]
        out.append(g.reshape(v.shape).astype(dtype))
        k += n
    return out


def _run_mt(ps0, mats, noise, dtype, kw, steps, lr=0.05, opt=None, params=None, start=0):
    params = params or [Parameter(mt.tensor(p.copy())) for p in ps0]
    opt = opt or SGD(params, lr=lr, **kw)
    for s in range(start, steps):
        for p, g in zip(params, _grads([p._data for p in params], mats, noise[s], dtype)):
            p.grad = mt.tensor(g)
        opt.step()
    return params, opt


def _run_torch(torch, ps0, mats, noise, dtype, kw, steps, lr=0.05):
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in ps0]
    opt = torch.optim.SGD(params, lr=lr, **kw)
    for s in range(steps):
        for p, g in zip(params, _grads([p.detach().numpy() for p in params], mats, noise[s],
                                       dtype)):
            p.grad = torch.from_numpy(g)
        opt.step()
    return params, opt


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kw", COMBOS, ids=lambda kw: "-".join(f"{k[:3]}{v}" for k, v in
                                                               kw.items()))
def test_sgd_matches_torch(kw, dtype):
    torch = pytest.importorskip("torch")
    ps0, mats, noise = _problem(dtype)
    mine, opt = _run_mt(ps0, mats, noise, dtype, kw, 20)
    ref, topt = _run_torch(torch, ps0, mats, noise, dtype, kw, 20)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    for p, r in zip(mine, ref):
        assert p.dtype == dtype and p.shape == tuple(r.shape)
        np.testing.assert_allclose(p._data, r.detach().numpy(), **tol)
    # the momentum buffers too, and the same state_dict layout as torch
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for k, st in tsd["state"].items():
        assert set(st) == set(sd["state"][k])
        if st.get("momentum_buffer") is not None:
            np.testing.assert_allclose(sd["state"][k]["momentum_buffer"]._data,
                                       st["momentum_buffer"].numpy(), **tol)
    assert sd["param_groups"][0]["params"] == tsd["param_groups"][0]["params"]
    for key in ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"):
        assert sd["param_groups"][0][key] == tsd["param_groups"][0][key]


def test_sgd_param_groups_and_none_grads_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    a0, b0, c0 = (rng.standard_normal(s) for s in [(4,), (2, 3), (3,)])
    mine = [Parameter(mt.tensor(x.copy())) for x in (a0, b0, c0)]
    ref = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in (a0, b0, c0)]
    opt = SGD([{"params": mine[:2]}, {"params": [mine[2]], "lr": 0.2, "nesterov": True}],
              lr=0.05, momentum=0.8)
    topt = torch.optim.SGD([{"params": ref[:2]}, {"params": [ref[2]], "lr": 0.2,
                                                  "nesterov": True}], lr=0.05, momentum=0.8)
    for step in range(12):
        for i, (p, r) in enumerate(zip(mine, ref)):
            if i == 1 and step % 3 == 0:  # no gradient this step: skipped, state untouched
                p.grad, r.grad = None, None
                continue
            g = rng.standard_normal(p.shape)
            p.grad, r.grad = mt.tensor(g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    for p, r in zip(mine, ref):
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kw", [dict(momentum=0.9), dict(momentum=0.9, dampening=0.5,
                                                         weight_decay=1e-2),
                                dict(momentum=0.5, nesterov=True, maximize=True)])
def test_state_dict_round_trip_continues_identically(kw):
    dtype = np.float64
    ps0, mats, noise = _problem(dtype, seed=1)
    full, _ = _run_mt(ps0, mats, noise, dtype, kw, 20)
    half, opt = _run_mt(ps0, mats, noise, dtype, kw, 9)
    sd = copy.deepcopy(opt.state_dict())
    weights = [p._data.copy() for p in half]
    # a fresh model and optimiser (other hyper-parameters: the state dict brings them back)
    params = [Parameter(mt.tensor(w)) for w in weights]
    opt2 = SGD(params, lr=1.0)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["momentum"] == kw["momentum"]
    assert opt2.param_groups[0]["params"] == params
    # the loaded buffers are copies: changing the dict later does not touch the optimiser
    sd["state"][0]["momentum_buffer"]._data[...] = 123.0
    resumed, _ = _run_mt(ps0, mats, noise, dtype, kw, 20, opt=opt2, params=params, start=9)
    for a, b in zip(full, resumed):
        np.testing.assert_array_equal(a._data, b._data)


def test_state_dict_layout_and_references():
    w = Parameter(mt.tensor([1.0, 2.0]))
    b = Parameter(mt.tensor([0.5]))
    opt = SGD([{"params": [w]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    assert opt.state_dict()["state"] == {}
    w.grad = mt.tensor([1.0, 1.0])
    opt.step()
    sd = opt.state_dict()
    assert list(sd["state"]) == [0]  # b had no gradient: no state
    assert sd["param_groups"][0]["params"] == [0] and sd["param_groups"][1]["params"] == [1]
    assert sd["param_groups"][1]["lr"] == 0.5
    buf = sd["state"][0]["momentum_buffer"]
    assert isinstance(buf, mt.Tensor) and buf._data is opt.state[w]["momentum_buffer"]._data
    np.testing.assert_array_equal(buf._data, [1.0, 1.0])
    np.testing.assert_allclose(w._data, [0.9, 1.9])


def test_load_state_dict_casts_dtype_and_accepts_arrays():
    w = Parameter(mt.tensor(np.zeros(3, dtype=np.float32)))
    opt = SGD([w], lr=0.1, momentum=0.9)
    sd = {"state": {0: {"momentum_buffer": np.ones(3, dtype=np.float64)}},
          "param_groups": [{"lr": 0.3, "momentum": 0.9, "dampening": 0, "weight_decay": 0,
                            "nesterov": False, "maximize": False, "params": [0]}]}
    opt.load_state_dict(sd)
    buf = opt.state[w]["momentum_buffer"]
    assert isinstance(buf, mt.Tensor) and buf.dtype == np.float32
    w.grad = mt.tensor(np.ones(3, dtype=np.float32))
    opt.step()
    np.testing.assert_allclose(w._data, np.full(3, -0.3 * 1.9, dtype=np.float32), rtol=1e-6)


def test_load_state_dict_mismatches():
    w, v = Parameter(mt.zeros(2)), Parameter(mt.zeros(3))
    opt = SGD([w, v], lr=0.1, momentum=0.9)
    w.grad, v.grad = mt.ones(2), mt.ones(3)
    opt.step()
    good = opt.state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        SGD([{"params": [w]}, {"params": [v]}], lr=0.1).load_state_dict(good)
    with pytest.raises(ValueError, match="doesn't match the size"):
        SGD([w], lr=0.1).load_state_dict(good)
    swapped = SGD([v, w], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"shape \(2,\).*shape \(3,\)"):
        swapped.load_state_dict(good)
    bad = copy.deepcopy(good)
    bad["state"][7] = {}
    with pytest.raises(ValueError, match="index 7"):
        SGD([w, v], lr=0.1).load_state_dict(bad)
    with pytest.raises(TypeError, match="'state' and 'param_groups'"):
        SGD([w, v], lr=0.1).load_state_dict({"state": {}})


def test_zero_grad():
    w = Parameter(mt.tensor([1.0, 2.0]))
    v = Parameter(mt.tensor([3.0]))
    opt = SGD([w, v], lr=0.1)
    w.grad = mt.tensor([5.0, 6.0])
    keep = w.grad
    opt.zero_grad(set_to_none=False)
    assert w.grad is keep and v.grad is None
    np.testing.assert_array_equal(keep._data, [0.0, 0.0])
    opt.zero_grad()
    assert w.grad is None and v.grad is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-0.1), "learning rate"),
    (dict(lr=float("nan")), "learning rate"),
    (dict(lr=0.1, momentum=-0.5), "momentum"),
    (dict(lr=0.1, dampening=-1), "dampening"),
    (dict(lr=0.1, weight_decay=-1e-4), "weight_decay"),
    (dict(lr=0.1, nesterov=True), "Nesterov"),
    (dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "Nesterov"),
    (dict(lr=0.1, differentiable=True), "differentiable"),
])
def test_bad_hyper_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGD([Parameter(mt.zeros(2))], **kwargs)


def test_bad_params():
    w = Parameter(mt.zeros(2))
    with pytest.raises(TypeError, match="wrap it in a list"):
        SGD(w, lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="ordered collection"):
        SGD({w}, lr=0.1)
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        SGD([w, np.zeros(2)], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        SGD([{"params": [w]}, {"params": [w]}], lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        SGD([w, w], lr=0.1)
    opt = SGD([w], lr=0.1)
    with pytest.raises(ValueError, match="learning rate"):
        opt.add_param_group({"params": [Parameter(mt.zeros(1))], "lr": -1})
    with pytest.raises(ValueError, match="Nesterov"):
        opt.add_param_group({"params": [Parameter(mt.zeros(1))], "nesterov": True})
    assert len(opt.param_groups) == 1
    with pytest.raises(NotImplementedError, match="not implement step"):
        Optimizer([w], {}).step()


def test_add_param_group_defaults_and_repr():
    w, v = Parameter(mt.zeros(2)), Parameter(mt.zeros(1))
    opt = SGD([w], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": v, "lr": 0.01})
    g = opt.param_groups[1]
    assert g["params"] == [v] and g["lr"] == 0.01 and g["momentum"] == 0.9
    text = repr(opt)
    assert text.startswith("SGD (\nParameter Group 0\n") and "    lr: 0.01\n" in text


def test_step_closure_and_skipping():
    w = Parameter(mt.tensor([1.0, -1.0]))
    opt = SGD([w], lr=0.5)
    calls = []

    def closure():
        calls.append(mt.is_grad_enabled())
        w.grad = mt.tensor([1.0, 1.0])
        return 3.5

    with mt.no_grad():
        assert opt.step(closure) == 3.5
    assert calls == [True]
    np.testing.assert_array_equal(w._data, [0.5, -1.5])
    w.grad = None
    assert opt.step() is None
    np.testing.assert_array_equal(w._data, [0.5, -1.5])


def test_step_is_in_place_and_keeps_buffers():
    w = Parameter(mt.tensor(np.arange(4.0)))
    data = w._data
    opt = SGD([w], lr=0.1, momentum=0.9, weight_decay=0.1)
    g = mt.tensor(np.ones(4))
    w.grad = g
    opt.step()
    buf = opt.state[w]["momentum_buffer"]._data
    opt.step()
    assert w._data is data and opt.state[w]["momentum_buffer"]._data is buf
    np.testing.assert_array_equal(g._data, np.ones(4))  # the gradient is never modified


def test_functional_sgd_shape_check():
    with pytest.raises(ValueError, match="shaped like its parameter"):
        sgd(np.zeros(3), np.zeros(2), None, lr=0.1)


def test_float16_and_complex_params():
    torch = pytest.importorskip("torch")
    for dtype in (np.float16, np.complex128):
        rng = np.random.default_rng(5)
        x0 = rng.standard_normal(6).astype(dtype)
        if dtype == np.complex128:
            x0 = x0 + 1j * rng.standard_normal(6)
        p = Parameter(mt.tensor(x0.copy()))
        r = torch.nn.Parameter(torch.from_numpy(x0.copy()))
        opt = SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
        topt = torch.optim.SGD([r], lr=0.1, momentum=0.9, weight_decay=0.01)
        for _ in range(5):
            g = rng.standard_normal(6).astype(dtype)
            p.grad, r.grad = mt.tensor(g.copy()), torch.from_numpy(g.copy())
            opt.step()
            topt.step()
        tol = 2e-3 if dtype == np.float16 else 1e-12
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=tol, atol=tol)


def test_step_lr_and_multistep_lr_match_torch():
    torch = pytest.importorskip("torch")
    for make, tmake in [
        (lambda o: lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
         lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)),
        (lambda o: lr_scheduler.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.1),
         lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.1)),
    ]:
        opt = SGD([{"params": [Parameter(mt.zeros(1))]},
                   {"params": [Parameter(mt.zeros(1))], "lr": 0.3}], lr=1.0)
        topt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))]},
                                {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.3}],
                               lr=1.0)
        s, ts = make(opt), tmake(topt)
        seen = []
        for epoch in range(12):
            assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-15)
            assert [g["lr"] for g in opt.param_groups] == s.get_last_lr()
            seen.append(s.get_last_lr()[0])
            if epoch == 6:  # resume a fresh scheduler from its state dict mid-run
                sd = s.state_dict()
                assert "optimizer" not in sd
                opt2 = SGD([{"params": [Parameter(mt.zeros(1))]},
                            {"params": [Parameter(mt.zeros(1))], "lr": 0.3}], lr=1.0)
                opt2.load_state_dict(opt.state_dict())
                s2 = make(opt2)
                s2.load_state_dict(sd)
                s2.optimizer.param_groups[0]["lr"] = s.get_last_lr()[0]
                s2.optimizer.param_groups[1]["lr"] = s.get_last_lr()[1]
                s, opt = s2, opt2
            opt.step()
            topt.step()
            s.step()
            ts.step()
        assert len(set(seen)) > 2


def test_scheduler_bad_arguments():
    opt = SGD([Parameter(mt.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="step_size"):
        lr_scheduler.StepLR(opt, step_size=0)
    with pytest.raises(TypeError, match="not an Optimizer"):
        lr_scheduler.StepLR(object(), step_size=1)
    with pytest.raises(KeyError, match="initial_lr"):
        lr_scheduler.MultiStepLR(SGD([Parameter(mt.zeros(1))], lr=1.0), [1], last_epoch=3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("fused", [True, False])
def test_sgd_on_cupy_matches_numpy(dtype, fused):
    cp = mt.backend.get_cupy()
    # float16: the fused kernel rounds once per step (float32 inside), NumPy after every op;
    # the maximize runs diverge, so those ulp differences grow to about 1 %
    tol = {np.float64: 1e-12, np.float32: 2e-5, np.float16: 2e-2}[dtype]
    for kw in COMBOS:
        ps0, mats, noise = _problem(dtype)
        ref, _ = _run_mt(ps0, mats, noise, dtype, kw, 20)
        params = [Parameter(mt.Tensor(cp.asarray(p))) for p in ps0]
        opt = SGD(params, lr=0.05, fused=fused, **kw)
        for s in range(20):
            host = [p._data.get() for p in params]
            for p, g in zip(params, _grads(host, mats, noise[s], dtype)):
                p.grad = mt.Tensor(cp.asarray(g))
            opt.step()
        for p, r in zip(params, ref):
            assert mt.backend.is_cupy_array(p._data) and p._data.dtype == dtype
            np.testing.assert_allclose(p._data.get().astype(np.float64),
                                       r._data.astype(np.float64), rtol=tol, atol=tol,
                                       err_msg=str(kw))
        if kw["momentum"]:
            buf = opt.state[params[0]]["momentum_buffer"]._data
            assert mt.backend.is_cupy_array(buf) and buf.dtype == dtype


@pytest.mark.parametrize("make", [lambda ps: mt.optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: mt.optim.SGD(ps, lr=0.1),
                                  lambda ps: mt.optim.Adam(ps, lr=0.1)])
def test_step_between_forward_and_backward_is_caught(make):
    """An optimizer step writes the parameters in place: a graph recorded before it that saved
    a parameter raises at backward, as torch does, instead of using the new values."""
    w = mt.nn.Parameter(mt.tensor([1.0, 2.0]))
    opt = make([w])
    (w * w).sum().backward()
    loss = (w * w).sum()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    w.grad = None
    (w * w).sum().backward()  # a graph recorded after the step is fine
    assert w.grad is not None
