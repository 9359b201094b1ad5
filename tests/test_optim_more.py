"""The rest of torch.optim (Adamax, NAdam, RAdam, ASGD, Rprop, SparseAdam, Adafactor, LBFGS)
against torch.

The same method as tests/test_optim_adaptive.py: the gradients come from a fixed quadratic
evaluated on each library's own parameters (so a difference compounds over the steps), and the
parameters, the per-parameter state and the state-dict layout are compared with torch's. In
float64 the tolerance is 1e-10 relative; in float32 it is float32's rounding (its epsilon)
times the steps taken, times a small factor for the few roundings each step makes.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import optim
from mpitensor.nn import Parameter
from tests.test_optim_adaptive import _grads, _problem

torch = pytest.importorskip("torch", reason="torch is the oracle these tests compare with")

STEPS = 15
NEW = ["Adamax", "NAdam", "RAdam", "ASGD", "Rprop", "SparseAdam", "Adafactor", "LBFGS", "Muon"]

CASES = [
    ("Adamax", dict()),
    ("Adamax", dict(weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6)),
    ("Adamax", dict(maximize=True)),
    ("NAdam", dict()),
    ("NAdam", dict(momentum_decay=0.1, weight_decay=0.05)),
    ("NAdam", dict(weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("NAdam", dict(betas=(0.5, 0.9), eps=1e-5)),
    ("RAdam", dict()),  # rho_t stays <= 5: the un-rectified branch every step
    ("RAdam", dict(betas=(0.9, 0.6))),  # rho_t passes 5 at step 4: both branches
    ("RAdam", dict(betas=(0.8, 0.5), weight_decay=0.1)),
    ("RAdam", dict(betas=(0.8, 0.5), weight_decay=0.1, decoupled_weight_decay=True,
                   maximize=True)),
    ("ASGD", dict()),
    ("ASGD", dict(t0=4.0, lambd=0.01, alpha=0.5)),  # averaging starts after step 4
    ("ASGD", dict(t0=2.5, weight_decay=0.05, maximize=True)),
    ("Rprop", dict()),
    ("Rprop", dict(etas=(0.3, 1.5), step_sizes=(1e-3, 0.2))),
    ("Rprop", dict(maximize=True)),
    ("SparseAdam", dict()),
    ("SparseAdam", dict(betas=(0.8, 0.95), eps=1e-6, maximize=True)),
    ("Adafactor", dict()),
    ("Adafactor", dict(weight_decay=0.1, maximize=True)),
    ("Adafactor", dict(eps=(1e-6, 1e-2), d=1.5, beta2_decay=-0.5)),
]
IDS = [f"{name}-" + "-".join(f"{k}={v}" for k, v in kw.items()) for name, kw in CASES]

STATE_KEYS = {
    "Adamax": {"step", "exp_avg", "exp_inf"},
    "NAdam": {"step", "mu_product", "exp_avg", "exp_avg_sq"},
    "RAdam": {"step", "exp_avg", "exp_avg_sq"},
    "ASGD": {"step", "eta", "mu", "ax"},
    "Rprop": {"step", "prev", "step_size"},
    "SparseAdam": {"step", "exp_avg", "exp_avg_sq"},
    # Adafactor factors the second moment of matrices (parameter 0 is 3x4) into rows and columns
    "Adafactor": {"step", "variance"},
}


def _expected_keys(name, index):
    if name == "Adafactor" and index == 0:
        return {"step", "row_var", "col_var"}
    return STATE_KEYS[name]
SCALARS = {"step", "mu_product", "eta", "mu"}  # 0-d Tensors of the default dtype, as in torch


def _tol(dtype, steps=STEPS):
    if np.dtype(dtype) == np.float32:
        eps = float(np.finfo(np.float32).eps)
        return dict(rtol=8 * steps * eps, atol=8 * steps * eps)
    return dict(rtol=1e-10, atol=1e-12)


def _holes(dtype, step, shape, salt):
    """Which entries of a SparseAdam gradient are absent (zero) at this step: a fixed pattern."""
    rng = np.random.default_rng(1000 * step + salt)
    return rng.random(shape) < 0.3


def _grad_arrays(name, values, mats, noise_row, dtype, step):
    gs = _grads(values, mats, noise_row, dtype)
    if name == "SparseAdam":
        for i, g in enumerate(gs):
            g[_holes(dtype, step, g.shape, i)] = 0
    return gs


def _run_mt(name, opt, params, mats, noise, dtype, start, stop):
    for s in range(start, stop):
        for p, g in zip(params, _grad_arrays(name, [p._data for p in params], mats, noise[s],
                                             dtype, s)):
            p.grad = mt.tensor(g)
        opt.step()


def _run_torch(name, opt, params, mats, noise, dtype, start, stop):
    for s in range(start, stop):
        gs = _grad_arrays(name, [p.detach().numpy() for p in params], mats, noise[s], dtype, s)
        for p, g in zip(params, gs):
            tg = torch.from_numpy(g)
            # torch's SparseAdam takes sparse gradients only: the same entries, as a sparse one
            p.grad = tg.to_sparse() if name == "SparseAdam" else tg
        opt.step()


def _pair(name, kw, dtype, seed=0, lr=0.05):
    ps0, mats, noise = _problem(dtype, seed)
    mine = [Parameter(mt.tensor(p.copy())) for p in ps0]
    ref = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in ps0]
    return (mine, getattr(optim, name)(mine, lr=lr, **kw), ref,
            getattr(torch.optim, name)(ref, lr=lr, **kw), mats, noise)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_matches_torch(name, kw, dtype):
    mine, opt, ref, topt, mats, noise = _pair(name, kw, dtype)
    _run_mt(name, opt, mine, mats, noise, dtype, 0, STEPS)
    _run_torch(name, topt, ref, mats, noise, dtype, 0, STEPS)
    tol = _tol(dtype)
    for p, r in zip(mine, ref):
        assert p.dtype == dtype and p.shape == tuple(r.shape)
        np.testing.assert_allclose(p._data, r.detach().numpy(), **tol)

    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"]) == [0, 1, 2]
    for k, tst in tsd["state"].items():
        st = sd["state"][k]
        assert set(st) == set(tst) == _expected_keys(name, k)
        for key, tv in tst.items():
            v = st[key]
            if name == "SparseAdam" and key == "step":
                assert type(v) is type(tv) is int and v == tv == STEPS
            elif key in SCALARS:
                assert isinstance(v, mt.Tensor) and v.shape == () and v.dtype == np.float32
                assert tv.dtype == torch.float32
                if key == "step":
                    assert float(v) == float(tv) == STEPS
                else:  # stored in float32 by both: the same float32 number
                    np.testing.assert_allclose(float(v), float(tv), rtol=4e-7)
            else:
                assert isinstance(v, mt.Tensor)
                assert v.dtype == dtype and v.shape == tuple(tv.shape)
                np.testing.assert_allclose(v._data, tv.numpy(), **tol)
    (g,), (tg,) = sd["param_groups"], tsd["param_groups"]
    assert set(g) == set(tg)
    for key in tg:
        if key not in ("foreach", "capturable"):
            assert g[key] == tg[key], key


@pytest.mark.parametrize("name, kw", [CASES[1], CASES[5], CASES[10], CASES[13], CASES[15],
                                      CASES[18], CASES[20]],
                         ids=[IDS[1], IDS[5], IDS[10], IDS[13], IDS[15], IDS[18], IDS[20]])
def test_state_dicts_travel_between_mpitensor_and_torch(name, kw):
    dtype = np.float64
    mine, opt, ref, topt, mats, noise = _pair(name, kw, dtype, seed=1)
    _run_mt(name, opt, mine, mats, noise, dtype, 0, 6)
    _run_torch(name, topt, ref, mats, noise, dtype, 0, 6)

    def to_torch(v):
        return torch.from_numpy(np.array(v._data)) if isinstance(v, mt.Tensor) else v

    def to_mt(v):
        return mt.tensor(v.numpy().copy()) if isinstance(v, torch.Tensor) else v

    sd = opt.state_dict()
    t_from_ours = [torch.nn.Parameter(torch.from_numpy(p._data.copy())) for p in mine]
    topt2 = getattr(torch.optim, name)(t_from_ours, lr=1.0)
    topt2.load_state_dict({"state": {k: {key: to_torch(v) for key, v in st.items()}
                                     for k, st in sd["state"].items()},
                           "param_groups": copy.deepcopy(sd["param_groups"])})
    tsd = topt.state_dict()
    m_from_torch = [Parameter(mt.tensor(r.detach().numpy().copy())) for r in ref]
    opt2 = getattr(optim, name)(m_from_torch, lr=1.0)
    opt2.load_state_dict({"state": {k: {key: to_mt(v) for key, v in st.items()}
                                    for k, st in tsd["state"].items()},
                          "param_groups": copy.deepcopy(tsd["param_groups"])})
    assert opt2.param_groups[0]["lr"] == 0.05
    _run_mt(name, opt, mine, mats, noise, dtype, 6, 12)
    _run_torch(name, topt2, t_from_ours, mats, noise, dtype, 6, 12)
    _run_mt(name, opt2, m_from_torch, mats, noise, dtype, 6, 12)
    _run_torch(name, topt, ref, mats, noise, dtype, 6, 12)
    # a loaded dict is cast to the parameters' dtype (torch does so too), so NAdam's and
    # ASGD's float32 scalars become float64: loaded runs are compared with loaded runs
    for a, b, c, d in zip(mine, t_from_ours, m_from_torch, ref):
        np.testing.assert_allclose(a._data, d.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(c._data, b.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a._data, c._data, rtol=1e-7, atol=1e-9)
    for k, st in opt2.state_dict()["state"].items():
        for key, v in st.items():
            tv = topt2.state_dict()["state"][k][key]
            if isinstance(tv, torch.Tensor):
                assert v.dtype == np.dtype(str(tv.dtype).replace("torch.", "")), key


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_state_dict_round_trip_continues_identically(tmp_path, name, kw):
    dtype = np.float64
    ps0, mats, noise = _problem(dtype, seed=1)
    full = [Parameter(mt.tensor(p.copy())) for p in ps0]
    _run_mt(name, getattr(optim, name)(full, lr=0.05, **kw), full, mats, noise, dtype, 0, 10)
    half = [Parameter(mt.tensor(p.copy())) for p in ps0]
    opt = getattr(optim, name)(half, lr=0.05, **kw)
    _run_mt(name, opt, half, mats, noise, dtype, 0, 5)
    path = tmp_path / "opt.mt"
    mt.save(opt.state_dict(), str(path))
    params = [Parameter(mt.tensor(p._data.copy())) for p in half]
    opt2 = getattr(optim, name)(params, lr=1.0)
    opt2.load_state_dict(mt.load(str(path)))
    for key, value in kw.items():
        got = opt2.param_groups[0][key]
        assert (tuple(got) if isinstance(got, (tuple, list)) else got) == value, key
    _run_mt(name, opt2, params, mats, noise, dtype, 5, 10)
    for a, b in zip(full, params):
        if name in ("NAdam", "ASGD"):
            # their float32 scalars (mu_product; eta, mu) come back as float64, the parameters'
            # dtype, as torch's load_state_dict casts them: the next steps round differently
            np.testing.assert_allclose(a._data, b._data, rtol=1e-7, atol=1e-9)
        else:
            np.testing.assert_array_equal(a._data, b._data)


@pytest.mark.parametrize("name", ["Adamax", "NAdam", "RAdam", "ASGD", "Rprop", "SparseAdam",
                                  "Adafactor"])
def test_groups_and_missing_grads_match_torch(name):
    rng = np.random.default_rng(3)
    x0 = [rng.standard_normal(s) for s in [(4,), (2, 3), (3,)]]
    mine = [Parameter(mt.tensor(x.copy())) for x in x0]
    ref = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in x0]
    opt = getattr(optim, name)([{"params": mine[:2]}, {"params": [mine[2]], "lr": 0.2}],
                               lr=0.05)
    topt = getattr(torch.optim, name)([{"params": ref[:2]}, {"params": [ref[2]], "lr": 0.2}],
                                      lr=0.05)
    for step in range(10):
        for i, (p, r) in enumerate(zip(mine, ref)):
            if i == 1 and step % 3 == 0:
                p.grad, r.grad = None, None
                continue
            g = rng.standard_normal(p.shape)
            p.grad = mt.tensor(g)
            r.grad = torch.from_numpy(g.copy())
            if name == "SparseAdam":
                r.grad = r.grad.to_sparse()
        opt.step()
        topt.step()
    for p, r in zip(mine, ref):
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert float(opt.state[mine[1]]["step"]) == float(topt.state[ref[1]]["step"]) == 6
    assert [g["params"] for g in opt.state_dict()["param_groups"]] == \
        [g["params"] for g in topt.state_dict()["param_groups"]] == [[0, 1], [2]]


@pytest.mark.parametrize("name, kw", [("Adamax", dict(weight_decay=0.1)),
                                      ("NAdam", dict(weight_decay=0.1)),
                                      ("RAdam", dict(betas=(0.9, 0.6))),
                                      ("ASGD", dict(t0=2.5)), ("Rprop", dict())],
                         ids=["Adamax", "NAdam", "RAdam", "ASGD", "Rprop"])
def test_complex_parameters_match_torch(name, kw):
    dtype = np.complex128
    mine, opt, ref, topt, mats, noise = _pair(name, kw, dtype, seed=2)
    _run_mt(name, opt, mine, mats, noise, dtype, 0, 10)
    _run_torch(name, topt, ref, mats, noise, dtype, 0, 10)
    for p, r in zip(mine, ref):
        assert p.dtype == dtype
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k, tst in topt.state_dict()["state"].items():
        for key, tv in tst.items():
            if key not in SCALARS:
                np.testing.assert_allclose(opt.state_dict()["state"][k][key]._data, tv.numpy(),
                                           rtol=1e-10, atol=1e-12)


def test_sparse_adam_leaves_absent_entries_alone_as_torch_does():
    x0 = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]])
    p = Parameter(mt.tensor(x0.copy()))
    r = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    opt, topt = optim.SparseAdam([p], lr=0.1), torch.optim.SparseAdam([r], lr=0.1)
    for g in (np.array([[1.0, 0, 0], [0, 2.0, 0]]), np.array([[0, 0, 0], [0, -1.0, 4.0]])):
        p.grad = mt.tensor(g)
        r.grad = torch.from_numpy(g).to_sparse()
        opt.step()
        topt.step()
    np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-14)
    assert p._data[0, 2] == 0.5 and opt.state[p]["exp_avg"]._data[0, 2] == 0.0
    # torch refuses a dense gradient; here every gradient is dense and read as documented
    r.grad = torch.ones_like(r)
    with pytest.raises(RuntimeError):
        topt.step()


@pytest.mark.parametrize("name", ["SparseAdam", "Adafactor"])
def test_complex_parameters_are_refused(name):
    p = Parameter(mt.tensor(np.array([1 + 1j, 2.0])))
    opt = getattr(optim, name)([p])
    p.grad = mt.tensor(np.array([1 + 0j, 1.0]))
    with pytest.raises(TypeError, match="real floating point"):
        opt.step()


BAD = [
    ("Adamax", dict(lr=-1.0)), ("Adamax", dict(eps=-1.0)), ("Adamax", dict(betas=(1.0, 0.9))),
    ("Adamax", dict(betas=(0.9, -0.1))), ("Adamax", dict(weight_decay=-0.1)),
    ("NAdam", dict(lr=-1.0)), ("NAdam", dict(eps=-1.0)), ("NAdam", dict(betas=(1.0, 0.9))),
    ("NAdam", dict(weight_decay=-1.0)), ("NAdam", dict(momentum_decay=-0.1)),
    ("RAdam", dict(lr=-1.0)), ("RAdam", dict(eps=-1.0)), ("RAdam", dict(betas=(0.9, 1.0))),
    ("RAdam", dict(weight_decay=-1.0)),
    ("ASGD", dict(lr=-1.0)), ("ASGD", dict(weight_decay=-1.0)),
    ("Rprop", dict(lr=-1.0)), ("Rprop", dict(etas=(1.5, 2.0))), ("Rprop", dict(etas=(0.5, 0.9))),
    ("Rprop", dict(etas=(0.0, 1.2))),
    ("SparseAdam", dict(lr=-1.0)), ("SparseAdam", dict(eps=-1.0)),
    ("SparseAdam", dict(betas=(1.0, 0.9))), ("SparseAdam", dict(betas=(0.9, 1.5))),
    ("LBFGS", dict(lr=-1.0)),
    ("Adafactor", dict(lr=-1.0)), ("Adafactor", dict(beta2_decay=0.5)),
    ("Adafactor", dict(eps=(-1.0, 1e-3))), ("Adafactor", dict(eps=(None, -1e-3))),
    ("Adafactor", dict(d=0.5)), ("Adafactor", dict(weight_decay=-0.1)),
    ("Muon", dict(lr=-1.0)), ("Muon", dict(weight_decay=-0.1)), ("Muon", dict(momentum=-0.5)),
    ("Muon", dict(adjust_lr_fn="spectral")),
]


@pytest.mark.parametrize("name, kwargs", BAD, ids=[f"{n}-{k}" for n, k in BAD])
def test_bad_arguments_raise_what_torch_raises(name, kwargs):
    with pytest.raises(Exception) as theirs:
        getattr(torch.optim, name)([torch.nn.Parameter(torch.ones(2, 2))], **kwargs)
    w = Parameter(mt.ones(2, 2))
    with pytest.raises(theirs.type):
        getattr(optim, name)([w], **kwargs)
    if name != "LBFGS":  # a group with the bad value is refused too
        opt = getattr(optim, name)([w])
        with pytest.raises(theirs.type):
            opt.add_param_group({"params": [Parameter(mt.ones(1, 1))], **kwargs})
        assert len(opt.param_groups) == 1


@pytest.mark.parametrize("name", NEW)
def test_signatures_defaults_and_exports_match_torch(name):
    assert name in optim.__all__
    ours = inspect.signature(getattr(optim, name).__init__).parameters.values()
    theirs = inspect.signature(getattr(torch.optim, name).__init__).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == \
        [(p.name, p.kind, p.default) for p in theirs]
    mine = getattr(optim, name)([Parameter(mt.zeros(1, 1))]).defaults  # 2-D: Muon's kind
    ref = getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(1, 1))]).defaults
    assert mine == ref


@pytest.mark.parametrize("name", ["Adamax", "NAdam", "RAdam", "ASGD", "Rprop"])
def test_differentiable_is_refused_and_flags_are_accepted(name):
    w = Parameter(mt.ones(2))
    with pytest.raises(ValueError, match="differentiable"):
        getattr(optim, name)([w], differentiable=True)
    opt = getattr(optim, name)([w], foreach=True, capturable=True, maximize=True)
    assert opt.param_groups[0]["maximize"] is True


# ---- LBFGS --------------------------------------------------------------------------------------

def _lbfgs_problem(dtype):
    """A smooth, strictly convex quartic in 7 unknowns held by two parameters (2x2 and 3)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((7, 7))
    a = (a @ a.T / 7 + 0.5 * np.eye(7)).astype(dtype)
    b = rng.standard_normal(7).astype(dtype)
    x0 = np.linspace(-1.5, 2.0, 7).astype(dtype)
    return a, b, x0


def _lbfgs_run(lib, dtype, kw, steps):
    a, b, x0 = _lbfgs_problem(dtype)
    if lib is torch:
        p = torch.nn.Parameter(torch.from_numpy(x0[:4].reshape(2, 2).copy()))
        q = torch.nn.Parameter(torch.from_numpy(x0[4:].copy()))
        opt = torch.optim.LBFGS([p, q], **kw)
        am, bm = torch.from_numpy(a), torch.from_numpy(b)
    else:
        p = Parameter(mt.tensor(x0[:4].reshape(2, 2).copy()))
        q = Parameter(mt.tensor(x0[4:].copy()))
        opt = optim.LBFGS([p, q], **kw)
        am, bm = mt.tensor(a), mt.tensor(b)
    calls = []

    def closure():
        opt.zero_grad()
        v = lib.cat([p.reshape(-1), q])
        loss = (v * (am @ v)).sum() * 0.5 + (v * bm).sum() + (v ** 4).sum() * 0.05
        loss.backward()
        calls.append(1)
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(steps)]
    values = np.concatenate([p.detach().numpy().ravel() if lib is torch else p._data.ravel(),
                             q.detach().numpy() if lib is torch else q._data])
    return values, losses, opt, len(calls)


LBFGS_CASES = [
    dict(),
    dict(line_search_fn="strong_wolfe"),
    dict(lr=0.5, history_size=2, max_iter=7),
    dict(history_size=3, max_iter=5, line_search_fn="strong_wolfe"),
    dict(max_iter=10, max_eval=4),
    dict(max_iter=50, tolerance_grad=1e-3, tolerance_change=1e-4),
    dict(lr=0.2, max_iter=3, line_search_fn="strong_wolfe", history_size=1),
]


def _np(v):
    return np.asarray(v._data) if isinstance(v, mt.Tensor) else (
        v.detach().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))


@pytest.mark.parametrize("kw", LBFGS_CASES, ids=[str(k) for k in LBFGS_CASES])
def test_lbfgs_matches_torch_float64(kw):
    mine, losses, opt, calls = _lbfgs_run(mt, np.float64, kw, 4)
    ref, tlosses, topt, tcalls = _lbfgs_run(torch, np.float64, kw, 4)
    np.testing.assert_allclose(mine, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(losses, tlosses, rtol=1e-10, atol=1e-12)
    assert calls == tcalls
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert list(sd["state"]) == list(tsd["state"]) == [0]
    st, tst = sd["state"][0], tsd["state"][0]
    assert set(st) == set(tst)
    for key, tv in tst.items():
        v = st[key]
        if key in ("func_evals", "n_iter"):
            assert type(v) is int and v == tv, key
        elif isinstance(tv, list):
            assert len(v) == len(tv), key
            for x, tx in zip(v, tv):
                assert (x is None) == (tx is None), key
                if tx is not None:
                    assert isinstance(x, mt.Tensor)
                    np.testing.assert_allclose(_np(x), _np(tx), rtol=1e-9, atol=1e-12)
        else:
            assert isinstance(v, mt.Tensor) == isinstance(tv, torch.Tensor), key
            np.testing.assert_allclose(_np(v), _np(tv), rtol=1e-9, atol=1e-12)
    assert sd["param_groups"] == tsd["param_groups"]


@pytest.mark.parametrize("kw", [dict(max_iter=4), dict(max_iter=4, line_search_fn="strong_wolfe"),
                                dict(max_iter=4, history_size=2)],
                         ids=["fixed", "strong_wolfe", "history2"])
def test_lbfgs_matches_torch_float32(kw):
    # far from the optimum (two calls of 4 iterations), so rounding noise cannot steer a test
    # of the line search or a stopping rule differently in the two libraries
    mine, losses, _, calls = _lbfgs_run(mt, np.float32, kw, 2)
    ref, tlosses, _, tcalls = _lbfgs_run(torch, np.float32, kw, 2)
    tol = _tol(np.float32, steps=8 * 4)
    np.testing.assert_allclose(mine, ref, **tol)
    np.testing.assert_allclose(losses, tlosses, **tol)
    assert calls == tcalls


def _lbfgs_resume(opt, sd, kw, steps):
    """A fresh LBFGS on copies of ``opt``'s parameters, loaded with ``sd``, run ``steps`` calls."""
    a, b, _ = _lbfgs_problem(np.float64)
    p = Parameter(mt.tensor(opt.param_groups[0]["params"][0]._data.copy()))
    q = Parameter(mt.tensor(opt.param_groups[0]["params"][1]._data.copy()))
    opt2 = optim.LBFGS([p, q], lr=0.01)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["history_size"] == kw["history_size"]
    am, bm = mt.tensor(a), mt.tensor(b)

    def closure():
        opt2.zero_grad()
        v = mt.cat([p.reshape(-1), q])
        loss = (v * (am @ v)).sum() * 0.5 + (v * bm).sum() + (v ** 4).sum() * 0.05
        loss.backward()
        return loss

    for _ in range(steps):
        opt2.step(closure)
    return np.concatenate([p._data.ravel(), q._data])


@pytest.mark.parametrize("kw", [dict(history_size=3), dict(history_size=3,
                                                           line_search_fn="strong_wolfe")],
                         ids=["fixed", "strong_wolfe"])
def test_lbfgs_state_dict_resumes_identically_and_comes_from_torch(tmp_path, kw):
    kw = dict(kw, max_iter=3)
    full, _, _, _ = _lbfgs_run(mt, np.float64, kw, 4)
    _, _, opt, _ = _lbfgs_run(mt, np.float64, kw, 2)
    path = tmp_path / "lbfgs.mt"
    mt.save(opt.state_dict(), str(path))
    np.testing.assert_array_equal(_lbfgs_resume(opt, mt.load(str(path)), kw, 2), full)
    # torch's own state dict (its history lists, H_diag, t) resumes ours as well
    _, _, topt, _ = _lbfgs_run(torch, np.float64, kw, 2)
    np.testing.assert_allclose(_lbfgs_resume(opt, topt.state_dict(), kw, 2), full,
                               rtol=1e-10, atol=1e-12)


def test_lbfgs_arguments_like_torch():
    w = Parameter(mt.ones(2))
    u = Parameter(mt.ones(3))
    with pytest.raises(ValueError, match="single parameter group"):
        optim.LBFGS([{"params": [w]}, {"params": [u]}])
    with pytest.raises(ValueError):
        torch.optim.LBFGS([{"params": [torch.nn.Parameter(torch.ones(2))]},
                           {"params": [torch.nn.Parameter(torch.ones(2))]}])
    # torch raises this one at the first step; here it is raised before any work
    with pytest.raises(RuntimeError, match="strong_wolfe"):
        optim.LBFGS([w], line_search_fn="backtracking")
    tw = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(RuntimeError):
        def closure():
            loss = (tw * tw).sum()
            loss.backward()
            return loss

        torch.optim.LBFGS([tw], line_search_fn="backtracking").step(closure)
    opt = optim.LBFGS([w])
    assert opt.defaults["max_eval"] == 25
    with pytest.raises(TypeError):
        opt.step()  # the closure is required, as in torch


def test_lbfgs_returns_the_first_loss_and_stops_at_a_zero_gradient():
    w = Parameter(mt.tensor([3.0, -1.0]))
    opt = optim.LBFGS([w], line_search_fn="strong_wolfe")
    seen = []

    def closure():
        seen.append(mt.is_grad_enabled())
        opt.zero_grad()
        loss = ((w - 1.0) ** 2).sum()
        loss.backward()
        return loss

    with mt.no_grad():
        first = opt.step(closure)
    assert float(first) == 8.0 and all(seen)
    np.testing.assert_allclose(w._data, [1.0, 1.0], atol=1e-7)
    evals = opt.state[w]["func_evals"]
    opt.step(closure)  # at the optimum: one evaluation, then nothing to do
    assert opt.state[w]["func_evals"] == evals + 1


# ---- swap_in_optimizer_params_and_state --------------------------------------------------------

@pytest.mark.parametrize("name", ["Adam", "NAdam", "Rprop"])
def test_swap_in_params_and_state_like_torch(name):
    rng = np.random.default_rng(9)
    x0 = [rng.standard_normal(s) for s in [(3, 2), (4,)]]
    mine = [Parameter(mt.tensor(x.copy())) for x in x0]
    ref = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in x0]
    opt = getattr(optim, name)([{"params": [mine[0]]}, {"params": [mine[1]], "lr": 0.2}], lr=0.05)
    topt = getattr(torch.optim, name)([{"params": [ref[0]]}, {"params": [ref[1]], "lr": 0.2}],
                                      lr=0.05)
    for _ in range(3):
        for p, r in zip(mine, ref):
            g = rng.standard_normal(p.shape)
            p.grad, r.grad = mt.tensor(g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    before = [p._data.copy() for p in mine]
    live_state = {k: {n: np.array(v._data) for n, v in st.items()}
                  for k, st in opt.state_dict()["state"].items()}
    # other weights and a copy of the state, with another learning rate for group 0
    y0 = [rng.standard_normal(x.shape) for x in x0]
    sd = opt.state_dict()
    swap_sd = {"state": {k: {n: mt.tensor(np.array(v._data)) for n, v in st.items()}
                         for k, st in sd["state"].items()},
               "param_groups": [dict(g) for g in sd["param_groups"]]}
    tsd = topt.state_dict()
    tswap_sd = {"state": {k: {n: v.clone() for n, v in st.items()}
                          for k, st in tsd["state"].items()},
                "param_groups": [dict(g) for g in tsd["param_groups"]]}
    swap_sd["param_groups"][0]["lr"] = tswap_sd["param_groups"][0]["lr"] = 0.3
    swap = {f"p{i}": Parameter(mt.tensor(y.copy())) for i, y in enumerate(y0)}
    tswap = {f"p{i}": torch.nn.Parameter(torch.from_numpy(y.copy())) for i, y in enumerate(y0)}
    for (p, r) in zip(swap.values(), tswap.values()):
        g = rng.standard_normal(p.shape)
        p.grad, r.grad = mt.tensor(g), torch.from_numpy(g.copy())
    with optim.swap_in_optimizer_params_and_state(opt, swap, swap_sd):
        assert opt.param_groups[0]["params"][0] is swap["p0"]
        assert opt.param_groups[0]["lr"] == 0.3
        opt.step()
    with torch.optim.swap_in_optimizer_params_and_state(topt, tswap, tswap_sd):
        topt.step()
    for p, r in zip(swap.values(), tswap.values()):
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k, st in tswap_sd["state"].items():  # the step's in-place updates land in the dicts
        for n, tv in st.items():
            np.testing.assert_allclose(np.asarray(swap_sd["state"][k][n]._data), tv.numpy(),
                                       rtol=1e-10, atol=1e-12)
    # the live optimiser and its parameters are as they were
    assert opt.param_groups[0]["params"][0] is mine[0] and opt.param_groups[0]["lr"] == 0.05
    for p, b in zip(mine, before):
        np.testing.assert_array_equal(p._data, b)
    for k, st in opt.state_dict()["state"].items():
        for n, v in st.items():
            np.testing.assert_array_equal(np.asarray(v._data), live_state[k][n])


def test_swap_in_refuses_a_wrong_parameter_count():
    w = Parameter(mt.ones(2))
    opt = optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError, match="1 parameters in 1 groups"):
        with optim.swap_in_optimizer_params_and_state(opt, {}, opt.state_dict()):
            pass
    assert opt.param_groups[0]["params"][0] is w


# ---- Muon -------------------------------------------------------------------------------------

MUON_CASES = [dict(), dict(nesterov=False), dict(adjust_lr_fn="match_rms_adamw", weight_decay=0.0),
              dict(momentum=0.5, ns_steps=3, lr=0.02, ns_coefficients=(3.0, -3.2, 1.2))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kw", MUON_CASES, ids=[str(k) for k in MUON_CASES])
def test_muon_matches_torch(kw, dtype):
    # torch orthogonalises in bfloat16; so does Muon here, operation for operation. A product
    # summed in another order can round to the neighbouring bfloat16 now and then: the bound is
    # one bfloat16 step (2**-8 relative, on entries of order 1) of the update per step
    rng = np.random.default_rng(11)
    shapes = [(4, 6), (6, 4), (16, 8)]
    x0 = [rng.standard_normal(s).astype(dtype) for s in shapes]
    mine = [Parameter(mt.tensor(x.copy())) for x in x0]
    ref = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in x0]
    opt, topt = optim.Muon(mine, **kw), torch.optim.Muon(ref, **kw)
    steps = 10
    noise = [[rng.standard_normal(s) for s in shapes] for _ in range(steps)]
    for k in range(steps):
        for p, r, e in zip(mine, ref, noise[k]):
            p.grad = mt.tensor((np.sin(p._data) + e).astype(dtype))
            r.grad = torch.from_numpy((np.sin(r.detach().numpy()) + e).astype(dtype))
        opt.step()
        topt.step()
    lr = kw.get("lr", 1e-3)
    for p, r, shape in zip(mine, ref, shapes):
        scale = (0.2 * max(shape) ** 0.5 if kw.get("adjust_lr_fn") == "match_rms_adamw"
                 else max(1.0, shape[0] / shape[1]) ** 0.5)
        bound = steps * lr * scale * 2.0 ** -8 + _tol(dtype, steps)["atol"]
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=0, atol=bound)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"]) == [0, 1, 2]
    for k, tst in tsd["state"].items():
        assert set(sd["state"][k]) == set(tst) == {"momentum_buffer"}
        np.testing.assert_allclose(sd["state"][k]["momentum_buffer"]._data,
                                   tst["momentum_buffer"].numpy(), rtol=1e-3, atol=1e-3)
    (g,), (tg,) = sd["param_groups"], tsd["param_groups"]
    assert g == tg


def test_muon_takes_only_matrices_like_torch():
    with pytest.raises(ValueError):
        torch.optim.Muon([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="only 2-D parameters"):
        optim.Muon([Parameter(mt.zeros(3))])
    opt = optim.Muon([Parameter(mt.zeros(2, 2))])
    with pytest.raises(ValueError, match="only 2-D parameters"):
        opt.add_param_group({"params": [Parameter(mt.zeros(2, 2, 2))]})
