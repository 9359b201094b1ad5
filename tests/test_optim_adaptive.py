"""mpitensor.optim's adaptive optimisers (Adam, AdamW, Adadelta, Adagrad, RMSprop) against torch.

Gradients come from a fixed quadratic (g = A p + b, plus per-step noise) evaluated on each
library's own current parameters, so a difference in the update compounds over the steps.
Besides the parameters, the per-parameter state and the state-dict layout are compared with
torch's, and state dicts travel both ways between the two libraries.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import optim
from mpitensor.nn import Parameter

SHAPES = [(3, 4), (5,), ()]
STEPS = 12

CASES = [
    ("Adam", dict()),
    ("Adam", dict(weight_decay=0.1)),
    ("Adam", dict(amsgrad=True)),
    ("Adam", dict(maximize=True)),
    ("Adam", dict(amsgrad=True, weight_decay=0.05, maximize=True, betas=(0.8, 0.95),
                  eps=1e-6)),
    ("Adam", dict(weight_decay=0.1, decoupled_weight_decay=True)),
    ("AdamW", dict()),
    ("AdamW", dict(weight_decay=0.2, amsgrad=True)),
    ("AdamW", dict(maximize=True, betas=(0.5, 0.9))),
    ("Adadelta", dict()),
    ("Adadelta", dict(rho=0.5, eps=1e-4)),
    ("Adadelta", dict(weight_decay=0.1, maximize=True)),
    ("Adagrad", dict()),
    ("Adagrad", dict(lr_decay=0.05)),
    ("Adagrad", dict(initial_accumulator_value=0.3, weight_decay=0.05)),
    ("Adagrad", dict(maximize=True, eps=1e-6, lr_decay=0.01)),
    ("RMSprop", dict()),
    ("RMSprop", dict(centered=True)),
    ("RMSprop", dict(momentum=0.9)),
    ("RMSprop", dict(alpha=0.5, weight_decay=0.1)),
    ("RMSprop", dict(centered=True, momentum=0.8, weight_decay=0.05, maximize=True)),
]
IDS = [f"{name}-" + "-".join(f"{k}={v}" for k, v in kw.items()) for name, kw in CASES]

STATE_KEYS = {
    "Adam": {"step", "exp_avg", "exp_avg_sq"},
    "AdamW": {"step", "exp_avg", "exp_avg_sq"},
    "Adadelta": {"step", "square_avg", "acc_delta"},
    "Adagrad": {"step", "sum"},
    "RMSprop": {"step", "square_avg"},
}


def _expected_keys(name, kw):
    keys = set(STATE_KEYS[name])
    if kw.get("amsgrad"):
        keys.add("max_exp_avg_sq")
    if kw.get("momentum"):
        keys.add("momentum_buffer")
    if kw.get("centered"):
        keys.add("grad_avg")
    return keys


def _problem(dtype, seed=0):
    rng = np.random.default_rng(seed)
    ps, mats = [], []
    for shape in SHAPES:
        n = int(np.prod(shape))
        q = rng.standard_normal((n, n))
        mats.append(((q @ q.T / n + np.eye(n)) * 0.5, rng.standard_normal(n)))
        p = rng.standard_normal(shape)
        if np.dtype(dtype).kind == "c":
            p = p + 1j * rng.standard_normal(shape)
        ps.append(np.asarray(p).astype(dtype))
    noise = rng.standard_normal((40, sum(int(np.prod(s)) for s in SHAPES)))
    return ps, mats, noise


def _grads(values, mats, noise_row, dtype):
    out, k = [], 0
    for v, (a, b) in zip(values, mats):
        n = v.size
        flat = v.reshape(-1)
        g = a @ flat.astype(np.complex128 if flat.dtype.kind == "c" else np.float64)
        g = g + b + 0.1 * noise_row[k:k + n]
        out.append(np.asarray(g).reshape(v.shape).astype(dtype))
        k += n
    return out


def _mt_opt(name, params, kw, lr=0.05):
    return getattr(optim, name)(params, lr=lr, **kw)


def _torch_opt(torch, name, params, kw, lr=0.05):
    return getattr(torch.optim, name)(params, lr=lr, **kw)


def _run_mt(opt, params, mats, noise, dtype, start, stop):
    for s in range(start, stop):
        for p, g in zip(params, _grads([p._data for p in params], mats, noise[s], dtype)):
            p.grad = mt.tensor(g)
        opt.step()


def _run_torch(opt, params, mats, noise, dtype, start, stop):
    for s in range(start, stop):
        for p, g in zip(params, _grads([p.detach().numpy() for p in params], mats, noise[s],
                                       dtype)):
            p.grad = _torch().from_numpy(g)
        opt.step()


def _torch():
    return pytest.importorskip("torch")


def _tol(dtype):
    if np.dtype(dtype) in (np.float32, np.complex64):
        return dict(rtol=1e-5, atol=1e-6)
    return dict(rtol=1e-10, atol=1e-12)


def _to_numpy(v):
    if isinstance(v, mt.Tensor):
        return np.asarray(v._data)
    return v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_matches_torch(name, kw, dtype):
    torch = _torch()
    ps0, mats, noise = _problem(dtype)
    mine = [Parameter(mt.tensor(p.copy())) for p in ps0]
    ref = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in ps0]
    opt, topt = _mt_opt(name, mine, kw), _torch_opt(torch, name, ref, kw)
    _run_mt(opt, mine, mats, noise, dtype, 0, STEPS)
    _run_torch(topt, ref, mats, noise, dtype, 0, STEPS)
    tol = _tol(dtype)
    for p, r in zip(mine, ref):
        assert p.dtype == dtype and p.shape == tuple(r.shape)
        np.testing.assert_allclose(p._data, r.detach().numpy(), **tol)

    # the same state, under the same keys, in the same state-dict layout as torch
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"]) == [0, 1, 2]
    for k, tst in tsd["state"].items():
        st = sd["state"][k]
        assert set(st) == set(tst) == _expected_keys(name, kw)
        for key, tv in tst.items():
            v = st[key]
            assert isinstance(v, mt.Tensor)
            if key == "step":
                assert v.shape == () and v.dtype == np.float32 and float(v) == float(tv) == STEPS
            else:
                assert v.dtype == dtype and v.shape == tuple(tv.shape)
                np.testing.assert_allclose(v._data, tv.numpy(), **tol)
    (g,), (tg,) = sd["param_groups"], tsd["param_groups"]
    assert set(g) == set(tg)
    for key in tg:
        if key not in ("foreach", "fused", "capturable"):
            assert g[key] == tg[key], key


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop"])
def test_complex_parameters_match_torch(name):
    torch = _torch()
    kw = dict(RMSprop=dict(centered=True, momentum=0.5),
              Adam=dict(amsgrad=True, weight_decay=0.01)).get(name, {})
    dtype = np.complex128
    ps0, mats, noise = _problem(dtype, seed=2)
    mine = [Parameter(mt.tensor(p.copy())) for p in ps0]
    ref = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in ps0]
    opt, topt = _mt_opt(name, mine, kw), _torch_opt(torch, name, ref, kw)
    _run_mt(opt, mine, mats, noise, dtype, 0, 8)
    _run_torch(topt, ref, mats, noise, dtype, 0, 8)
    for p, r in zip(mine, ref):
        assert p.dtype == dtype
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k, tst in topt.state_dict()["state"].items():
        for key, tv in tst.items():
            if key != "step":
                np.testing.assert_allclose(opt.state_dict()["state"][k][key]._data, tv.numpy(),
                                           rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, kw", [CASES[4], CASES[7], CASES[11], CASES[14], CASES[20]],
                         ids=[IDS[4], IDS[7], IDS[11], IDS[14], IDS[20]])
def test_groups_and_missing_grads_match_torch(name, kw):
    torch = _torch()
    rng = np.random.default_rng(3)
    x0 = [rng.standard_normal(s) for s in [(4,), (2, 3), (3,)]]
    mine = [Parameter(mt.tensor(x.copy())) for x in x0]
    ref = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in x0]
    opt = getattr(optim, name)([{"params": mine[:2]}, {"params": [mine[2]], "lr": 0.2}],
                               lr=0.05, **kw)
    topt = getattr(torch.optim, name)([{"params": ref[:2]}, {"params": [ref[2]], "lr": 0.2}],
                                      lr=0.05, **kw)
    for step in range(10):
        for i, (p, r) in enumerate(zip(mine, ref)):
            if i == 1 and step % 3 == 0:  # no gradient this step: skipped, state untouched
                p.grad, r.grad = None, None
                continue
            g = rng.standard_normal(p.shape)
            p.grad, r.grad = mt.tensor(g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    for p, r in zip(mine, ref):
        np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert float(opt.state[mine[1]]["step"]) == float(topt.state[ref[1]]["step"]) == 6
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == \
        [g["params"] for g in tsd["param_groups"]] == [[0, 1], [2]]


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_state_dict_round_trip_continues_identically(tmp_path, name, kw):
    dtype = np.float64
    ps0, mats, noise = _problem(dtype, seed=1)
    full = [Parameter(mt.tensor(p.copy())) for p in ps0]
    _run_mt(_mt_opt(name, full, kw), full, mats, noise, dtype, 0, 10)

    half = [Parameter(mt.tensor(p.copy())) for p in ps0]
    opt = _mt_opt(name, half, kw)
    _run_mt(opt, half, mats, noise, dtype, 0, 5)
    path = tmp_path / "opt.mt"
    mt.save(opt.state_dict(), str(path))
    sd = mt.load(str(path))
    # a fresh model and optimiser with other settings: the state dict brings them back
    params = [Parameter(mt.tensor(p._data.copy())) for p in half]
    opt2 = getattr(optim, name)(params, lr=1.0)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == 0.05
    for key, value in kw.items():
        got = opt2.param_groups[0][key]
        assert (tuple(got) if key == "betas" else got) == value, key
    # the loaded state is a copy: changing the dict later does not touch the optimiser
    for st in sd["state"].values():
        for key, v in st.items():
            if key != "step":
                v._data[...] = 123.0
    _run_mt(opt2, params, mats, noise, dtype, 5, 10)
    for a, b in zip(full, params):
        np.testing.assert_array_equal(a._data, b._data)


@pytest.mark.parametrize("name, kw", [CASES[4], CASES[8], CASES[10], CASES[14], CASES[20]],
                         ids=[IDS[4], IDS[8], IDS[10], IDS[14], IDS[20]])
def test_state_dicts_travel_between_mpitensor_and_torch(name, kw):
    torch = _torch()
    dtype = np.float64
    ps0, mats, noise = _problem(dtype, seed=5)
    mine = [Parameter(mt.tensor(p.copy())) for p in ps0]
    ref = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in ps0]
    opt, topt = _mt_opt(name, mine, kw), _torch_opt(torch, name, ref, kw)
    _run_mt(opt, mine, mats, noise, dtype, 0, 6)
    _run_torch(topt, ref, mats, noise, dtype, 0, 6)

    # ours -> torch: a torch optimiser on copies of our weights, loaded with our state dict
    sd = opt.state_dict()
    t_from_ours = [torch.nn.Parameter(torch.from_numpy(p._data.copy())) for p in mine]
    topt2 = _torch_opt(torch, name, t_from_ours, {}, lr=1.0)
    topt2.load_state_dict({
        "state": {k: {key: torch.from_numpy(np.array(v._data)) for key, v in st.items()}
                  for k, st in sd["state"].items()},
        "param_groups": copy.deepcopy(sd["param_groups"]),
    })
    # torch -> ours: the other way round
    tsd = topt.state_dict()
    m_from_torch = [Parameter(mt.tensor(r.detach().numpy().copy())) for r in ref]
    opt2 = _mt_opt(name, m_from_torch, {}, lr=1.0)
    opt2.load_state_dict({
        "state": {k: {key: v.numpy().copy() for key, v in st.items()}
                  for k, st in tsd["state"].items()},
        "param_groups": copy.deepcopy(tsd["param_groups"]),
    })
    assert isinstance(opt2.state[m_from_torch[0]]["step"], mt.Tensor)

    _run_mt(opt, mine, mats, noise, dtype, 6, 12)
    _run_torch(topt2, t_from_ours, mats, noise, dtype, 6, 12)
    _run_mt(opt2, m_from_torch, mats, noise, dtype, 6, 12)
    _run_torch(topt, ref, mats, noise, dtype, 6, 12)
    for a, b, c, d in zip(mine, t_from_ours, m_from_torch, ref):
        for other in (b.detach().numpy(), c._data, d.detach().numpy()):
            np.testing.assert_allclose(a._data, other, rtol=1e-10, atol=1e-12)


def test_adagrad_state_exists_from_construction_like_torch():
    torch = _torch()
    x0 = np.arange(3.0)
    opt = optim.Adagrad([Parameter(mt.tensor(x0))], initial_accumulator_value=0.25)
    topt = torch.optim.Adagrad([torch.nn.Parameter(torch.from_numpy(x0))],
                               initial_accumulator_value=0.25)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert list(sd["state"]) == list(tsd["state"]) == [0]
    np.testing.assert_array_equal(sd["state"][0]["sum"]._data, tsd["state"][0]["sum"].numpy())
    assert float(sd["state"][0]["step"]) == 0.0
    # a group added later gets its state at its first step, as in torch
    late = Parameter(mt.tensor([1.0, 2.0]))
    opt.add_param_group({"params": [late]})
    assert late not in opt.state or not opt.state[late]
    late.grad = mt.tensor([1.0, 1.0])
    opt.step()
    assert float(opt.state[late]["step"]) == 1.0
    np.testing.assert_allclose(opt.state[late]["sum"]._data, [1.25, 1.25])


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop"])
def test_step_is_in_place_and_leaves_the_gradient_alone(name):
    w = Parameter(mt.tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3)))
    data = w._data
    kw = dict(RMSprop=dict(momentum=0.9, centered=True), Adam=dict(amsgrad=True)).get(name, {})
    opt = getattr(optim, name)([w], **kw)
    g = mt.tensor(np.full((2, 3), 0.5))
    w.grad = g
    opt.step()
    buffers = {k: v._data for k, v in opt.state[w].items()}
    opt.step()
    assert w._data is data
    assert all(opt.state[w][k]._data is v for k, v in buffers.items())
    np.testing.assert_array_equal(g._data, np.full((2, 3), 0.5))
    assert not np.array_equal(w._data, np.linspace(-1.0, 1.0, 6).reshape(2, 3))


def test_closure_and_skipping():
    w = Parameter(mt.tensor([1.0, -1.0]))
    opt = optim.Adam([w], lr=0.1)
    calls = []

    def closure():
        calls.append(mt.is_grad_enabled())
        w.grad = mt.tensor([1.0, 1.0])
        return 2.5

    with mt.no_grad():
        assert opt.step(closure) == 2.5
    assert calls == [True]
    np.testing.assert_allclose(w._data, [0.9, -1.1])
    w.grad = None
    before = w._data.copy()
    assert opt.step() is None
    np.testing.assert_array_equal(w._data, before)
    assert float(opt.state[w]["step"]) == 1.0


def test_gradient_of_the_wrong_shape():
    w = Parameter(mt.zeros(3))
    opt = optim.RMSprop([w])
    w.grad = mt.zeros(2)
    with pytest.raises(ValueError, match="shaped like its parameter"):
        opt.step()


def test_adamw_keeps_decoupled_decay_after_loading_an_adam_dict():
    w = Parameter(mt.tensor([1.0, 2.0]))
    adam = optim.Adam([w], lr=0.1, weight_decay=0.1)
    w.grad = mt.tensor([0.1, 0.2])
    adam.step()
    adamw = optim.AdamW([Parameter(mt.tensor([1.0, 2.0]))])
    adamw.load_state_dict(adam.state_dict())
    assert adamw.param_groups[0]["decoupled_weight_decay"] is True
    assert adamw.param_groups[0]["weight_decay"] == 0.1
    assert adamw.defaults["weight_decay"] == 1e-2


BAD = [
    ("Adam", dict(lr=-1e-3), "lr"),
    ("Adam", dict(lr=float("nan")), "lr"),
    ("Adam", dict(eps=-1.0), "eps"),
    ("Adam", dict(betas=(1.0, 0.999)), "beta1"),
    ("Adam", dict(betas=(0.9, -0.1)), "beta2"),
    ("Adam", dict(betas=(0.9,)), "pair"),
    ("Adam", dict(betas=0.9), "pair"),
    ("Adam", dict(weight_decay=-0.1), "weight_decay"),
    ("Adam", dict(differentiable=True), "differentiable"),
    ("AdamW", dict(betas=(0.9, 1.5)), "beta2"),
    ("AdamW", dict(weight_decay=-1e-2), "weight_decay"),
    ("Adadelta", dict(rho=1.1), "rho"),
    ("Adadelta", dict(rho=-0.1), "rho"),
    ("Adadelta", dict(lr=-1.0), "lr"),
    ("Adadelta", dict(eps=-1e-6), "eps"),
    ("Adadelta", dict(weight_decay=-1.0), "weight_decay"),
    ("Adagrad", dict(lr_decay=-0.1), "lr_decay"),
    ("Adagrad", dict(initial_accumulator_value=-1.0), "initial_accumulator_value"),
    ("Adagrad", dict(eps=-1e-10), "eps"),
    ("Adagrad", dict(weight_decay=-1.0), "weight_decay"),
    ("RMSprop", dict(alpha=-0.5), "alpha"),
    ("RMSprop", dict(momentum=-0.9), "momentum"),
    ("RMSprop", dict(eps=-1e-8), "eps"),
    ("RMSprop", dict(weight_decay=-1.0), "weight_decay"),
    ("RMSprop", dict(lr=-0.01), "lr"),
]


@pytest.mark.parametrize("name, kwargs, match", BAD,
                         ids=[f"{n}-{k}" for n, k, _ in BAD])
def test_bad_hyper_parameters(name, kwargs, match):
    w = Parameter(mt.ones(2))
    with pytest.raises(ValueError, match=match):
        getattr(optim, name)([w], **kwargs)
    # a group with the bad value is refused too, and the optimiser keeps its one group
    opt = getattr(optim, name)([w])
    group = {"params": [Parameter(mt.ones(1))], **kwargs}
    with pytest.raises(ValueError, match=match):
        opt.add_param_group(group)
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop"])
def test_non_numbers_and_bad_params(name):
    cls = getattr(optim, name)
    w = Parameter(mt.ones(2))
    with pytest.raises(TypeError, match="lr must be a real number"):
        cls([w], lr="0.1")
    with pytest.raises(TypeError, match="wrap it in a list"):
        cls(w)
    with pytest.raises(ValueError, match="empty parameter list"):
        cls([])


def test_defaults_match_torch():
    torch = _torch()
    for name in ("Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop"):
        ours = getattr(optim, name)([Parameter(mt.zeros(1))]).defaults
        theirs = getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(1))]).defaults
        assert set(ours) == set(theirs), name
        for key, value in theirs.items():
            assert ours[key] == value, (name, key)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_cupy_parameters_match_numpy(name, kw, dtype):
    cp = mt.backend.get_cupy()
    ps0, mats, noise = _problem(dtype)
    ref = [Parameter(mt.tensor(p.copy())) for p in ps0]
    _run_mt(_mt_opt(name, ref, kw), ref, mats, noise, dtype, 0, STEPS)
    params = [Parameter(mt.Tensor(cp.asarray(p))) for p in ps0]
    opt = _mt_opt(name, params, kw)
    for s in range(STEPS):
        host = [p._data.get() for p in params]
        for p, g in zip(params, _grads(host, mats, noise[s], dtype)):
            p.grad = mt.Tensor(cp.asarray(g))
        opt.step()
    tol = _tol(dtype)
    for p, r in zip(params, ref):
        assert mt.backend.is_cupy_array(p._data) and p._data.dtype == dtype
        np.testing.assert_allclose(p._data.get(), r._data, **tol)
    for key, v in opt.state[params[0]].items():
        if key == "step":
            assert isinstance(v._data, np.ndarray) and float(v) == STEPS
        else:
            assert mt.backend.is_cupy_array(v._data) and v._data.dtype == dtype


def test_signatures_and_exports_match_torch():
    import inspect

    torch = _torch()
    for name in ("Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop"):
        assert name in optim.__all__
        ours = inspect.signature(getattr(optim, name).__init__).parameters.values()
        theirs = inspect.signature(getattr(torch.optim, name).__init__).parameters.values()
        assert [(p.name, p.kind, p.default) for p in ours] == \
            [(p.name, p.kind, p.default) for p in theirs], name
