"""mpitensor.distributions transforms, the biject_to/transform_to registries and the families
built on TransformedDistribution, against torch.distributions as the oracle (float64, same
inputs): forward, inverse, log-det, shapes and the cache of every transform; log_prob, cdf,
icdf, entropy and moments of every family; gradients of log_prob; KL pairs; argument
validation. Samples (mpitensor's generator, not torch's numbers) are checked by statistics:
6-sigma bounds from the standard error of the mean of many draws, and rsample gradients by the
reparameterisation identity. Last, a SAC-style tanh-squashed Gaussian policy trained 3 steps
with the same base noise under both libraries."""

from __future__ import annotations

import math
from typing import Any, Callable, List

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import distributions as D
from mpitensor.distributions import constraints as MC
from mpitensor.distributions import transformed_distribution as MTD
from mpitensor.distributions import transforms as MT

torch = pytest.importorskip("torch")
TD = torch.distributions
TT = torch.distributions.transforms
TC = torch.distributions.constraints

RNG = np.random.default_rng(11)
TOL = dict(rtol=1e-10, atol=1e-12)  # float64 closed forms: a few ulps of cancellation


@pytest.fixture(autouse=True)
def _float64():
    old_mt, old_t = mt.get_default_dtype(), torch.get_default_dtype()
    mt.set_default_dtype(mt.float64)
    torch.set_default_dtype(torch.float64)
    yield
    mt.set_default_dtype(old_mt)
    torch.set_default_dtype(old_t)


def _np(t: Any) -> np.ndarray:
    return t.detach().numpy() if hasattr(t, "detach") else np.asarray(t)


def _close(a: Any, b: Any, **kw: Any) -> None:
    np.testing.assert_allclose(_np(a), _np(b), **{**TOL, **kw})


X34 = RNG.normal(size=(3, 4))
POS34 = RNG.uniform(0.3, 2.0, size=(3, 4))
SQ = RNG.normal(size=(2, 3, 3))

# (name, factory(transforms module, library), input): every transform of torch's module
CASES: List[tuple] = [
    ("exp", lambda T, L: T.ExpTransform(), X34),
    ("power", lambda T, L: T.PowerTransform(L.tensor([0.5, 1.7, -1.2, 3.0])), POS34),
    ("sigmoid", lambda T, L: T.SigmoidTransform(), X34),
    ("tanh", lambda T, L: T.TanhTransform(), X34),
    ("softplus", lambda T, L: T.SoftplusTransform(), X34),
    ("affine_num", lambda T, L: T.AffineTransform(1.5, -2.0), X34),
    ("affine_event", lambda T, L: T.AffineTransform(
        L.tensor([1.0, 2.0, 3.0, 4.0]), L.tensor([-2.0, 0.5, 1.0, 3.0]), event_dim=1), X34),
    ("abs", lambda T, L: T.AbsTransform(), X34),
    ("softmax", lambda T, L: T.SoftmaxTransform(), X34),
    ("stick", lambda T, L: T.StickBreakingTransform(), X34),
    ("lower_chol", lambda T, L: T.LowerCholeskyTransform(), SQ),
    ("pos_def", lambda T, L: T.PositiveDefiniteTransform(), SQ),
    ("corr_chol", lambda T, L: T.CorrCholeskyTransform(), RNG.normal(size=(2, 6))),
    ("compose", lambda T, L: T.ComposeTransform(
        [T.ExpTransform(), T.AffineTransform(1.0, 2.0), T.StickBreakingTransform()]), X34),
    ("identity", lambda T, L: T.identity_transform, X34),
    ("independent", lambda T, L: T.IndependentTransform(T.SigmoidTransform(), 2), X34),
    ("reshape", lambda T, L: T.ReshapeTransform((4,), (2, 2)), X34),
    ("cat", lambda T, L: T.CatTransform(
        [T.ExpTransform(), T.SigmoidTransform()], dim=1, lengths=[1, 3]), X34),
    ("cat_event", lambda T, L: T.CatTransform(
        [T.ExpTransform(), T.IndependentTransform(T.TanhTransform(), 1)], dim=0,
        lengths=[1, 2]), X34),
    ("stack", lambda T, L: T.StackTransform(
        [T.ExpTransform(), T.SigmoidTransform(), T.TanhTransform()], dim=0), X34),
    ("inverse", lambda T, L: T.ExpTransform().inv, POS34),
    ("cdf", lambda T, L: T.CumulativeDistributionTransform(
        (TD if L is torch else D).Normal(L.tensor(0.3), L.tensor(1.5))), X34),
]
NO_LOGDET = {"abs", "softmax", "lower_chol", "pos_def"}


@pytest.mark.parametrize("name,make,x", CASES, ids=[c[0] for c in CASES])
def test_transform_matches_torch(name: str, make: Callable, x: np.ndarray) -> None:
    tt, mm = make(TT, torch), make(MT, mt)
    xt, xm = torch.tensor(x), mt.tensor(x)
    yt, ym = tt(xt), mm(xm)
    _close(ym, yt)
    _close(mm.inv(mt.tensor(_np(yt))), tt.inv(yt), rtol=1e-9, atol=1e-10)
    assert tuple(mm.forward_shape(xm.shape)) == tuple(tt.forward_shape(xt.shape))
    assert tuple(mm.inverse_shape(ym.shape)) == tuple(tt.inverse_shape(yt.shape))
    assert mm.bijective == tt.bijective
    assert (mm.domain.event_dim, mm.codomain.event_dim) == (tt.domain.event_dim,
                                                            tt.codomain.event_dim)
    if name in NO_LOGDET:
        with pytest.raises(NotImplementedError):
            mm.log_abs_det_jacobian(xm, ym)
        return
    _close(mm.log_abs_det_jacobian(xm, ym), tt.log_abs_det_jacobian(xt, yt), rtol=1e-9,
           atol=1e-10)


def test_log_det_gradient_and_jacobian_identity() -> None:
    # the log-det is log|dy/dx| elementwise: check it against the gradient of y
    for t in (MT.ExpTransform(), MT.SigmoidTransform(), MT.TanhTransform(),
              MT.SoftplusTransform(), MT.PowerTransform(2.5), MT.AffineTransform(1.0, -3.0)):
        x = mt.tensor(POS34, requires_grad=True)
        y = t(x)
        (g,) = mt.autograd.grad(y.sum(), [x])
        _close(t.log_abs_det_jacobian(x, y), g.abs().log(), rtol=1e-9)


@pytest.mark.parametrize("name,shape", [("CorrCholeskyTransform", (2, 6)),
                                        ("StickBreakingTransform", (2, 4)),
                                        ("LowerCholeskyTransform", (2, 3, 3)),
                                        ("PositiveDefiniteTransform", (2, 3, 3))])
def test_structured_transform_gradients_match_torch(name: str, shape: tuple) -> None:
    x = RNG.normal(size=shape)
    xt, xm = torch.tensor(x, requires_grad=True), mt.tensor(x, requires_grad=True)
    tt, mm = getattr(TT, name)(), getattr(MT, name)()
    yt, ym = tt(xt), mm(xm)
    if name in NO_LOGDET_CLASSES:
        out_t, out_m = yt, ym
    else:
        out_t, out_m = tt.log_abs_det_jacobian(xt, yt), mm.log_abs_det_jacobian(xm, ym)
    w = RNG.normal(size=tuple(out_t.shape))
    (out_t * torch.tensor(w)).sum().backward()
    (out_m * mt.tensor(w)).sum().backward()
    _close(xm.grad, xt.grad, rtol=1e-9, atol=1e-12)


NO_LOGDET_CLASSES = {"LowerCholeskyTransform", "PositiveDefiniteTransform"}


def test_tanh_log_det_stable_for_large_inputs() -> None:
    x = mt.tensor([-40.0, 40.0, 400.0])
    lad = MT.TanhTransform().log_abs_det_jacobian(x, x.tanh())
    # log(1 - tanh(x)^2) = log 4 - 2|x| - 2 log(1 + e^{-2|x|}): finite where 1 - y^2 rounds to 0
    _close(lad, math.log(4.0) - 2 * np.abs(_np(x)))


def test_cache_returns_the_pair_by_identity() -> None:
    t = MT.TanhTransform(cache_size=1)
    x = mt.tensor([30.0, 0.5])  # tanh(30) rounds to 1: atanh would give inf
    y = t(x)
    assert t(x) is y
    assert t.inv(y) is x
    assert bool(mt.isinf(MT.TanhTransform().inv(y)).any())
    t0 = MT.TanhTransform()
    assert t0(x) is not t0(x)
    with pytest.raises(ValueError):
        MT.ExpTransform(cache_size=2)


def test_with_cache_inv_and_equality() -> None:
    e = MT.ExpTransform()
    assert e.with_cache(0) is e and e.with_cache(1)._cache_size == 1
    assert e.inv.inv is e and e.inv is e.inv
    assert e == MT.ExpTransform() and e.inv == MT.ExpTransform().inv and e != e.inv
    assert MT.AffineTransform(1.0, 2.0) == MT.AffineTransform(1.0, 2.0)
    assert MT.AffineTransform(1.0, 2.0) != MT.AffineTransform(1.0, 3.0)
    assert MT.PowerTransform(2.0) == MT.PowerTransform(2.0)
    c = MT.ComposeTransform([MT.ExpTransform(), MT.AffineTransform(0.0, 2.0)], cache_size=1)
    assert all(p._cache_size == 1 for p in c.parts)
    assert c.inv.inv is c
    a = MT.AffineTransform(1.0, 2.0).with_cache(1)
    assert a._cache_size == 1 and a.loc == 1.0
    assert MT.ComposeTransform([MT.ExpTransform()]) == MT.ComposeTransform([MT.ExpTransform()])
    assert MT.AffineTransform(0.0, -1.0).sign == -1 and MT.ExpTransform().inv.sign == 1
    assert MT.ComposeTransform([MT.ExpTransform(), MT.AffineTransform(0, -2.0)]).sign == -1
    with pytest.raises(NotImplementedError):
        _ = MT.AbsTransform().sign
    assert repr(MT.IndependentTransform(MT.ExpTransform(), 1)) == repr(
        TT.IndependentTransform(TT.ExpTransform(), 1))


def test_event_dim_bookkeeping_of_compose() -> None:
    for parts in ([], ["exp", "stick"], ["stick", "exp"], ["reshape", "exp"]):
        def build(T: Any, parts: list = parts) -> Any:
            table = {"exp": T.ExpTransform(), "stick": T.StickBreakingTransform(),
                     "reshape": T.ReshapeTransform((4,), (2, 2))}
            return T.ComposeTransform([table[p] for p in parts])
        m, t = build(MT), build(TT)
        assert (m.domain.event_dim, m.codomain.event_dim) == (t.domain.event_dim,
                                                              t.codomain.event_dim)


def test_shape_errors() -> None:
    with pytest.raises(ValueError):
        MT.ReshapeTransform((3,), (2, 2))
    with pytest.raises(ValueError):
        MT.CorrCholeskyTransform().forward_shape((4,))
    with pytest.raises(ValueError):
        MT.CatTransform([MT.ExpTransform()], dim=0, lengths=[2])(mt.ones(3))


# -- registries ---------------------------------------------------------------------------

CONSTRAINTS = [
    ("real", lambda C: C.real, X34),
    ("real_vector", lambda C: C.real_vector, X34),
    ("positive", lambda C: C.positive, X34),
    ("nonnegative", lambda C: C.nonnegative, X34),
    ("greater_than", lambda C: C.greater_than(-1.5), X34),
    ("greater_than_eq", lambda C: C.greater_than_eq(2.0), X34),
    ("less_than", lambda C: C.less_than(3.0), X34),
    ("unit_interval", lambda C: C.unit_interval, X34),
    ("interval", lambda C: C.interval(-2.0, 5.0), X34),
    ("half_open_interval", lambda C: C.half_open_interval(-1.0, 1.0), X34),
    ("simplex", lambda C: C.simplex, X34),
    ("corr_cholesky", lambda C: C.corr_cholesky, RNG.normal(size=(2, 3))),
    ("lower_cholesky", lambda C: C.lower_cholesky, SQ),
    ("positive_definite", lambda C: C.positive_definite, SQ),
    ("positive_semidefinite", lambda C: C.positive_semidefinite, SQ),
    ("independent", lambda C: C.independent(C.positive, 1), X34),
    ("cat", lambda C: C.cat([C.positive, C.unit_interval], 1, [2, 2]), X34),
    ("stack", lambda C: C.stack([C.real, C.positive, C.interval(0.0, 2.0)], 0), X34),
]


@pytest.mark.parametrize("name,make,x", CONSTRAINTS, ids=[c[0] for c in CONSTRAINTS])
@pytest.mark.parametrize("registry", ["biject_to", "transform_to"])
def test_registry_matches_torch(name: str, make: Callable, x: np.ndarray,
                                registry: str) -> None:
    treg, mreg = getattr(TD, registry), getattr(D, registry)
    try:
        tt = treg(make(TC))
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            mreg(make(MC))
        return
    mm = mreg(make(MC))
    assert repr(mm) == repr(tt)
    ym = mm(mt.tensor(x))
    _close(ym, tt(torch.tensor(x)), rtol=1e-9, atol=1e-10)
    assert bool(make(MC).check(ym).all())
    if mm.bijective:
        _close(mm.inv(ym), x, rtol=1e-7, atol=1e-8)
        _close(mm.log_abs_det_jacobian(mt.tensor(x), ym),
               tt.log_abs_det_jacobian(torch.tensor(x), tt(torch.tensor(x))), rtol=1e-9,
               atol=1e-10)


def test_variational_parameters_through_biject_to() -> None:
    # an unconstrained u mapped onto (lo, hi) with tensor bounds: values and gradients as torch
    u = RNG.normal(size=(3,))
    lo, hi = np.array([0.0, -1.0, 2.0]), np.array([1.0, 3.0, 2.5])
    got = []
    for L, M in ((mt, D), (torch, TD)):
        uu = L.tensor(u, requires_grad=True)
        t = M.biject_to(M.constraints.interval(L.tensor(lo), L.tensor(hi)))
        y = t(uu)
        (y.sum() + t.log_abs_det_jacobian(uu, y).sum()).backward()
        got.append((_np(y), _np(uu.grad)))
    _close(got[0][0], got[1][0])
    _close(got[0][1], got[1][1])


def test_user_defined_transform_and_pickle() -> None:
    import copy
    import pickle

    class Cube(MT.Transform):
        domain = MC.real
        codomain = MC.real
        bijective = True
        sign = +1

        def _call(self, x: Any) -> Any:
            return x ** 3

        def _inverse(self, y: Any) -> Any:
            return y.sign() * y.abs() ** (1 / 3)

        def log_abs_det_jacobian(self, x: Any, y: Any) -> Any:
            return (3 * x ** 2).log()

    d = D.TransformedDistribution(D.Normal(0.0, 1.0), [Cube(cache_size=1)])
    v = mt.tensor([0.5, -2.0])
    expect = D.Normal(0.0, 1.0).log_prob(v.sign() * v.abs() ** (1 / 3)) \
        - (3 * (v.abs() ** (1 / 3)) ** 2).log()
    _close(d.log_prob(v), expect)
    assert Cube().with_cache(1)._cache_size == 1
    t = MT.ComposeTransform([MT.TanhTransform(cache_size=1), MT.AffineTransform(1.0, 2.0)])
    _ = t.inv
    for clone in (copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        _close(clone(mt.tensor([0.3])), t(mt.tensor([0.3])))


def test_registry_register_and_errors() -> None:
    reg = D.constraint_registry.ConstraintRegistry()
    with pytest.raises(NotImplementedError):
        reg(MC.positive)
    reg.register(MC.positive, lambda c: MT.ExpTransform())
    assert reg(MC.greater_than(5.0)) == MT.ExpTransform()  # registered by type
    with pytest.raises(TypeError):
        reg.register(int, lambda c: None)


# -- distributions ------------------------------------------------------------------------

PAR = {
    "loc": RNG.normal(size=(2, 3)),
    "scale": RNG.uniform(0.5, 2.0, size=(2, 3)),
    "c1": RNG.uniform(0.6, 3.0, size=(2, 3)),
    "c0": RNG.uniform(0.6, 3.0, size=(2, 3)),
    "vloc": RNG.normal(size=(2, 3)),
    "vscale": RNG.uniform(0.5, 1.5, size=(2, 3)),
    "temp": np.array(0.7),
    "p01": RNG.uniform(0.1, 0.9, size=(2, 3)),
    "simplex": RNG.dirichlet(np.ones(4), size=2),
}
POSV = RNG.uniform(0.2, 3.0, size=(4, 2, 3))
REALV = RNG.normal(size=(4, 2, 3))
UNITV = RNG.uniform(0.02, 0.98, size=(4, 2, 3))
SIMPV = RNG.dirichlet(np.ones(4), size=(4, 2))

# name: (torch class, mpitensor class, parameter names, keyword names, values)
FAMILIES = {
    "LogNormal": (TD.LogNormal, D.LogNormal, ["loc", "scale"], {}, POSV),
    "HalfNormal": (TD.HalfNormal, D.HalfNormal, ["scale"], {}, POSV),
    "HalfCauchy": (TD.HalfCauchy, D.HalfCauchy, ["scale"], {}, POSV),
    "Gumbel": (TD.Gumbel, D.Gumbel, ["loc", "scale"], {}, REALV),
    "Weibull": (TD.Weibull, D.Weibull, ["scale", "c1"], {}, POSV),
    "Pareto": (TD.Pareto, D.Pareto, ["scale", "c1"], {}, POSV + 2.0),
    "Kumaraswamy": (TD.Kumaraswamy, D.Kumaraswamy, ["c1", "c0"], {}, UNITV),
    "LogisticNormal": (TD.LogisticNormal, D.LogisticNormal, ["vloc", "vscale"], {}, SIMPV),
    "RelaxedBernoulli": (TD.RelaxedBernoulli, D.RelaxedBernoulli, ["temp"],
                         {"probs": "p01"}, UNITV),
    "RelaxedBernoulliLogits": (TD.RelaxedBernoulli, D.RelaxedBernoulli, ["temp"],
                               {"logits": "loc"}, UNITV),
    "RelaxedOneHotCategorical": (TD.RelaxedOneHotCategorical, D.RelaxedOneHotCategorical,
                                 ["temp"], {"probs": "simplex"}, SIMPV),
    "LogitRelaxedBernoulli": (TD.relaxed_bernoulli.LogitRelaxedBernoulli,
                              MTD.LogitRelaxedBernoulli, ["temp"], {"logits": "loc"}, REALV),
    "ExpRelaxedCategorical": (TD.relaxed_categorical.ExpRelaxedCategorical,
                              MTD.ExpRelaxedCategorical, ["temp"], {"probs": "simplex"},
                              np.log(SIMPV)),
}


def _pair(name: str, requires_grad: bool = False) -> tuple:
    tcls, mcls, pos, kw, _ = FAMILIES[name]
    targs = [torch.tensor(PAR[p], requires_grad=requires_grad) for p in pos]
    margs = [mt.tensor(PAR[p], requires_grad=requires_grad) for p in pos]
    tkw = {k: torch.tensor(PAR[v], requires_grad=requires_grad) for k, v in kw.items()}
    mkw = {k: mt.tensor(PAR[v], requires_grad=requires_grad) for k, v in kw.items()}
    return tcls(*targs, **tkw), mcls(*margs, **mkw), targs + list(tkw.values()), \
        margs + list(mkw.values())


def _attr(d: Any, name: str) -> Any:
    try:
        v = getattr(d, name)
        return v() if callable(v) else v
    except NotImplementedError:
        return None


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_torch(name: str) -> None:
    td, md, _, _ = _pair(name)
    assert tuple(md.batch_shape) == tuple(td.batch_shape)
    assert tuple(md.event_shape) == tuple(td.event_shape)
    assert md.has_rsample == td.has_rsample
    values = FAMILIES[name][4]
    _close(md.log_prob(mt.tensor(values)), td.log_prob(torch.tensor(values)))
    for attr in ("mean", "variance", "stddev", "mode", "entropy"):
        if name == "Kumaraswamy" and attr == "mode":
            continue  # torch 2.13 returns NaN for every Kumaraswamy mode: see the next test
        t, m = _attr(td, attr), _attr(md, attr)
        assert (t is None) == (m is None), attr
        if t is not None:
            _close(m, t, err_msg=attr)
    try:
        tc = td.cdf(torch.tensor(values))
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            md.cdf(mt.tensor(values))
        return
    _close(md.cdf(mt.tensor(values)), tc)
    q = np.broadcast_to(np.array([0.1, 0.5, 0.9])[:, None, None], (3, *td.batch_shape))
    _close(md.icdf(mt.tensor(q.copy())), td.icdf(torch.tensor(q.copy())), rtol=1e-9)


def test_kumaraswamy_mode_closed_form() -> None:
    a, b = mt.tensor([2.0, 1.5, 0.5]), mt.tensor([2.0, 3.0, 2.0])
    mode = D.Kumaraswamy(a, b).mode
    expect = [math.sqrt(1 / 3), (0.5 / 3.5) ** (1 / 1.5)]
    _close(mode[:2], expect)
    assert math.isnan(mode[2].item())
    # the mode maximises the density
    d = D.Kumaraswamy(a[:2], b[:2])
    for eps in (1e-4, -1e-4):
        assert bool((d.log_prob(mode[:2]) > d.log_prob(mode[:2] + eps)).all())


@pytest.mark.parametrize("name", list(FAMILIES))
def test_log_prob_gradient_matches_torch(name: str) -> None:
    td, md, targs, margs = _pair(name, requires_grad=True)
    values = FAMILIES[name][4]
    td.log_prob(torch.tensor(values)).sum().backward()
    md.log_prob(mt.tensor(values)).sum().backward()
    for t, m in zip(targs, margs):
        _close(m.grad, t.grad, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["LogNormal", "HalfNormal", "Gumbel", "Weibull", "Pareto",
                                  "Kumaraswamy", "HalfCauchy", "LogisticNormal",
                                  "RelaxedBernoulli", "RelaxedOneHotCategorical"])
def test_expand_matches_torch(name: str) -> None:
    td, md, _, _ = _pair(name)
    shape = (5,) + tuple(td.batch_shape)
    te, me = td.expand(shape), md.expand(shape)
    assert tuple(me.batch_shape) == tuple(te.batch_shape)
    assert tuple(me.event_shape) == tuple(te.event_shape)
    values = FAMILIES[name][4][:1]
    _close(me.log_prob(mt.tensor(values)), te.log_prob(torch.tensor(values)))
    assert tuple(me.sample((2,)).shape) == tuple(te.sample((2,)).shape)


def test_support_and_arg_constraints() -> None:
    for name in FAMILIES:
        td, md, _, _ = _pair(name)
        assert repr(md.support) == repr(td.support), name
        assert sorted(type(md).arg_constraints) == sorted(type(td).arg_constraints), name


def test_validation_errors_name_the_constraint() -> None:
    with pytest.raises(ValueError, match="GreaterThan"):
        D.LogNormal(mt.tensor(0.0), mt.tensor(-1.0))
    with pytest.raises(ValueError, match="scale"):
        D.Gumbel(mt.tensor(0.0), mt.tensor(0.0))
    with pytest.raises(ValueError, match="concentration"):
        D.Weibull(mt.tensor(1.0), mt.tensor(-2.0))
    with pytest.raises(ValueError, match="GreaterThan"):
        D.HalfNormal(mt.tensor(-1.0))
    with pytest.raises(ValueError, match="support"):
        D.LogNormal(0.0, 1.0).log_prob(mt.tensor(-1.0))
    with pytest.raises(ValueError, match="support"):
        D.Pareto(mt.tensor(2.0), mt.tensor(1.0)).log_prob(mt.tensor(1.0))
    with pytest.raises(ValueError):
        D.TransformedDistribution(D.Normal(0.0, 1.0), "exp")
    with pytest.raises(ValueError):
        D.TransformedDistribution(D.Normal(0.0, 1.0), [MT.StickBreakingTransform()])
    with np.errstate(invalid="ignore"):  # -inf - -inf at 0, as torch (which gives NaN)
        unchecked = D.LogNormal(0.0, 1.0, validate_args=False).log_prob(mt.tensor(-1.0))
    assert math.isnan(unchecked.item())
    assert math.isnan(TD.LogNormal(0.0, 1.0, validate_args=False)
                      .log_prob(torch.tensor(-1.0)).item())


def test_transformed_distribution_shapes_and_log_prob() -> None:
    loc = RNG.normal(size=(2, 3))
    cases = [
        (lambda M, L: (M.Normal(L.tensor(loc), 1.0), [])),
        (lambda M, L: (M.Normal(L.tensor(loc), 1.0), [MT.StickBreakingTransform()]
                       if L is mt else [TT.StickBreakingTransform()])),
        (lambda M, L: (M.Normal(L.tensor(loc), 1.0),
                       [(MT if L is mt else TT).ReshapeTransform((2, 3), (6,))])),
        (lambda M, L: (M.Independent(M.Normal(L.tensor(loc), 1.0), 1),
                       [(MT if L is mt else TT).ExpTransform()])),
        (lambda M, L: (M.Normal(L.tensor(loc), 1.0),
                       [(MT if L is mt else TT).AffineTransform(L.tensor(loc[0]), 2.0, 1)])),
    ]
    assert repr(D.TransformedDistribution(D.Normal(0.0, 1.0), MT.ExpTransform())) == repr(
        TD.TransformedDistribution(TD.Normal(0.0, 1.0), TT.ExpTransform()))
    for make in cases:
        tb, ttr = make(TD, torch)
        mb, mtr = make(D, mt)
        td, md = TD.TransformedDistribution(tb, ttr), D.TransformedDistribution(mb, mtr)
        assert (tuple(md.batch_shape), tuple(md.event_shape)) == (tuple(td.batch_shape),
                                                                  tuple(td.event_shape))
        y = td.sample((4,))
        _close(md.log_prob(mt.tensor(y.numpy())), td.log_prob(y))
        assert tuple(md.rsample((4,)).shape) == tuple(y.shape)
        assert repr(md.support) == repr(td.support)


def test_decreasing_chain_cdf_is_turned_round() -> None:
    def build(M: Any, T: Any, L: Any) -> Any:
        return M.TransformedDistribution(M.Normal(L.tensor([0.2, -0.4]), L.tensor([1.0, 2.0])),
                                         [T.AffineTransform(1.0, -2.0), T.ExpTransform()])
    td, md = build(TD, TT, torch), build(D, MT, mt)
    v = np.array([[0.5, 2.0], [3.0, 0.1]])
    _close(md.cdf(mt.tensor(v)), td.cdf(torch.tensor(v)))
    _close(md.icdf(mt.tensor([0.2, 0.7])), td.icdf(torch.tensor([0.2, 0.7])))


def test_kl_pairs_match_torch() -> None:
    def pairs(M: Any, L: Any) -> list:
        a, b = L.tensor(PAR["scale"]), L.tensor(PAR["c1"])
        la, lb = L.tensor(PAR["loc"]), L.tensor(PAR["vloc"])
        return [(M.Gumbel(la, a), M.Gumbel(lb, b)), (M.Pareto(a, b), M.Pareto(b, a)),
                (M.HalfNormal(a), M.HalfNormal(b)), (M.LogNormal(la, a), M.LogNormal(lb, b))]
    for (tp, tq), (mp, mq) in zip(pairs(TD, torch), pairs(D, mt)):
        _close(D.kl_divergence(mp, mq), TD.kl_divergence(tp, tq))
    with pytest.raises(NotImplementedError):
        D.kl_divergence(D.Weibull(1.0, 2.0), D.Weibull(1.0, 3.0))


CROSS = [("Exponential", "Gumbel"), ("Gamma", "Gumbel"), ("Normal", "Gumbel"),
         ("Uniform", "Gumbel"), ("Gumbel", "Normal"), ("Pareto", "Normal"),
         ("Pareto", "Exponential"), ("Pareto", "Gamma"), ("UniformPos", "Pareto"),
         ("Uniform", "Pareto"), ("Gumbel", "Beta"), ("Gumbel", "ContinuousBernoulli"),
         ("Gumbel", "Exponential"), ("Gumbel", "Gamma"), ("Gumbel", "Pareto"),
         ("Gumbel", "Uniform"), ("Beta", "Pareto"), ("ContinuousBernoulli", "Pareto"),
         ("Exponential", "Pareto"), ("Gamma", "Pareto"), ("Laplace", "Pareto"),
         ("Normal", "Pareto"), ("Pareto", "Beta"), ("Pareto", "ContinuousBernoulli"),
         ("Pareto", "Uniform")]


def _cross_families(M: Any, L: Any) -> dict:
    g = np.random.default_rng(0)
    a, b = g.uniform(0.5, 2.5, size=(2, 3)), g.uniform(0.5, 2.5, size=(2, 3))
    c, e = g.normal(size=(2, 3)), g.uniform(0.5, 3.5, size=(2, 3))  # alpha < 1, < 2 and > 2
    t = L.tensor
    return {"Gumbel": M.Gumbel(t(c), t(a)), "Exponential": M.Exponential(t(a)),
            "Gamma": M.Gamma(t(a), t(b)), "Normal": M.Normal(t(c), t(a)),
            "Uniform": M.Uniform(t(c), t(c + a)), "UniformPos": M.Uniform(t(a + 1), t(a + 2)),
            "Pareto": M.Pareto(t(a * 0.5), t(e)), "Beta": M.Beta(t(a), t(b)),
            "ContinuousBernoulli": M.ContinuousBernoulli(t(a / 3)),
            "Laplace": M.Laplace(t(c), t(a))}


@pytest.mark.parametrize("p,q", CROSS, ids=[f"{p}-{q}" for p, q in CROSS])
def test_cross_family_kl_matches_torch(p: str, q: str) -> None:
    dt, dm = _cross_families(TD, torch), _cross_families(D, mt)
    _close(D.kl_divergence(dm[p], dm[q]), TD.kl_divergence(dt[p], dt[q]))


# -- sampling -----------------------------------------------------------------------------

N = 200_000


def _mean_within(samples: Any, mean: Any, var: Any) -> None:
    """The sample mean lies within 6 standard errors of the true mean."""
    got = _np(samples).mean(0)
    se = np.sqrt(_np(var) / samples.shape[0])
    assert np.all(np.abs(got - _np(mean)) <= 6 * se + 1e-12), (got, _np(mean), se)


@pytest.mark.parametrize("name", ["LogNormal", "HalfNormal", "Gumbel", "Weibull", "Pareto",
                                  "Kumaraswamy"])
def test_sample_moments(name: str) -> None:
    mt.manual_seed(3)
    md = _pair(name)[1]
    if name == "Pareto":  # a finite variance needs alpha > 2
        md = D.Pareto(mt.tensor(PAR["scale"]), mt.tensor(PAR["c1"]) + 2.0)
    if name == "LogNormal":
        md = D.LogNormal(mt.tensor(PAR["loc"]), mt.tensor(PAR["scale"]) * 0.3)
    _mean_within(md.sample((N,)), md.mean, md.variance)


def test_relaxed_sample_statistics() -> None:
    mt.manual_seed(4)
    p = mt.tensor([0.2, 0.7])
    # the logistic noise is symmetric: P(y > 1/2) = probs whatever the temperature
    s = D.RelaxedBernoulli(mt.tensor(0.5), probs=p).sample((N,))
    frac = (s > 0.5).double().mean(0)
    se = np.sqrt(_np(p) * (1 - _np(p)) / N)
    assert np.all(np.abs(_np(frac) - _np(p)) <= 6 * se)
    # Gumbel-max: the argmax of a relaxed one-hot sample is Categorical(probs)
    probs = mt.tensor([0.1, 0.3, 0.6])
    s = D.RelaxedOneHotCategorical(mt.tensor(0.3), probs=probs).sample((N,))
    assert bool(MC.simplex.check(s).all())
    counts = np.bincount(_np(s.argmax(-1)), minlength=3) / N
    se = np.sqrt(_np(probs) * (1 - _np(probs)) / N)
    assert np.all(np.abs(counts - _np(probs)) <= 6 * se)
    ls = D.LogisticNormal(mt.zeros(2), mt.ones(2)).sample((5,))
    assert tuple(ls.shape) == (5, 3) and bool(MC.simplex.check(ls).all())


def test_rsample_gradient_reparameterisation_identity() -> None:
    # d/d(loc) E[exp(X)] with X ~ N(loc, s): d/dloc of the LogNormal mean, exp(loc + s^2/2)
    mt.manual_seed(5)
    loc = mt.tensor([0.3, -0.2], requires_grad=True)
    scale = mt.tensor([0.4, 0.2], requires_grad=True)
    x = D.LogNormal(loc, scale).rsample((N,))
    x.mean(0).sum().backward()
    mean = np.exp(_np(loc) + _np(scale) ** 2 / 2)
    var = (np.exp(_np(scale) ** 2) - 1) * mean ** 2
    se = np.sqrt(var / N)
    assert np.all(np.abs(_np(loc.grad) - mean) <= 6 * se)
    # d/d(scale) E[X] = scale * E[X]; its estimator is mean(X * eps)
    assert np.all(np.abs(_np(scale.grad) - _np(scale) * mean) <= 6 * se * 3)
    # Gumbel: x = loc - scale * log(-log u), so dx/dloc = 1 exactly
    gl = mt.tensor([0.5], requires_grad=True)
    D.Gumbel(gl, mt.tensor([2.0])).rsample((1000,)).sum().backward()
    assert gl.grad.item() == 1000.0


def test_same_seed_same_samples() -> None:
    def draw() -> np.ndarray:
        mt.manual_seed(9)
        return _np(D.Gumbel(mt.zeros(3), mt.ones(3)).sample((4,)))
    np.testing.assert_array_equal(draw(), draw())


# -- a user's program: a SAC-style squashed Gaussian policy --------------------------------


def _sac_losses(lib: Any) -> list:
    """Three steps of a tanh-squashed Gaussian policy on a fixed objective, the actions made
    from fixed base noise; the script reads as a torch user's would."""
    dist = lib.distributions
    g = np.random.default_rng(0)
    obs = lib.tensor(g.normal(size=(8, 3)))
    eps = lib.tensor(g.normal(size=(8, 2)))
    target = lib.tensor(g.uniform(-0.9, 0.9, size=(8, 2)))
    w_mu = lib.tensor(g.normal(size=(3, 2)) * 0.3, requires_grad=True)
    w_ls = lib.tensor(g.normal(size=(3, 2)) * 0.1, requires_grad=True)
    opt = lib.optim.SGD([w_mu, w_ls], lr=0.05)
    losses = []
    for _ in range(3):
        mu = obs @ w_mu
        std = (obs @ w_ls).clamp(-5, 2).exp()
        squash = dist.transforms.TanhTransform(cache_size=1)
        pi = dist.TransformedDistribution(dist.Normal(mu, std), [squash])
        action = squash(mu + std * eps)
        log_prob = pi.log_prob(action).sum(-1)
        loss = (0.2 * log_prob + ((action - target) ** 2).sum(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_sac_policy_program_matches_torch() -> None:
    ours, theirs = _sac_losses(mt), _sac_losses(torch)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-9)
    assert ours[2] < ours[0]


def test_sac_rsample_log_prob_is_finite_with_cache() -> None:
    mt.manual_seed(1)
    mu = mt.tensor([[20.0, -20.0]], requires_grad=True)
    pi = D.TransformedDistribution(D.Normal(mu, mt.tensor([[0.1, 0.1]])),
                                   [MT.TanhTransform(cache_size=1)])
    a = pi.rsample()
    lp = pi.log_prob(a)
    assert bool(mt.isfinite(lp).all())
    lp.sum().backward()
    assert bool(mt.isfinite(mu.grad).all())
