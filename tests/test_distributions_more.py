"""The rest of torch.distributions' families (continuous_more, discrete_more) against torch
2.13 on the same parameters: densities, moments, cdf/icdf, entropy, gradients of log_prob,
shapes, expand, enumerate_support, validation errors; sampling by statistics (mean within a
few standard errors); a mixture-density-network head trained like a torch program."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributions as md

torch = pytest.importorskip("torch")
td = torch.distributions

RNG = np.random.default_rng(7)


def _pair(a, grad=False):
    """The same float64 array as an mpitensor and a torch tensor."""
    a = np.asarray(a, dtype=np.float64)
    m = mt.tensor(a, dtype=mt.float64, requires_grad=grad)
    t = torch.tensor(a, dtype=torch.float64, requires_grad=grad)
    return m, t


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x.detach().tolist() if hasattr(x, "detach") else x, dtype=np.float64)


def _close(a, b, rtol=1e-10, atol=1e-12):
    np.testing.assert_allclose(_np(a), _np(b), rtol=rtol, atol=atol, equal_nan=True)


# name -> (parameter arrays, keyword names (None: positional), values for log_prob)
POS = np.array([0.7, 1.3, 2.5, 4.2, 6.0])
CASES = {
    "Cauchy": ([[0.3, -1.0, 2.0, 0.0, 1.5], POS], None, [0.1, -2.0, 3.0, 0.5, 1.5]),
    "StudentT": ([[0.8, 1.5, 2.5, 5.0, 30.0], [0.3, -1.0, 2.0, 0.0, 1.5], POS], None,
                 [0.1, -2.0, 3.0, 0.5, 1.5]),
    "Chi2": ([[0.8, 1.5, 2.5, 5.0, 30.0]], None, [0.1, 2.0, 3.0, 0.5, 25.0]),
    "FisherSnedecor": ([[0.8, 1.5, 2.5, 5.0, 30.0], [1.5, 3.0, 4.5, 7.0, 12.0]], None,
                       [0.1, 2.0, 3.0, 0.5, 1.2]),
    "InverseGamma": ([[0.8, 1.5, 2.5, 5.0, 30.0], POS], None, [0.1, 2.0, 3.0, 0.5, 0.2]),
    "GeneralizedPareto": ([[0.3, -1.0, 2.0, 0.0, 1.5], POS, [0.2, 0.0, -0.1, 0.6, 0.3]], None,
                          [0.5, -0.5, 2.5, 1.0, 4.0]),
    "ContinuousBernoulli": ([[0.1, 0.4995, 0.5, 0.7, 0.95]], ["probs"],
                            [0.1, 0.9, 0.3, 0.5, 0.99]),
    "Binomial": ([[3.0, 5.0, 10.0, 1.0, 7.0], [0.1, 0.5, 0.7, 0.3, 0.95]],
                 ["total_count", "probs"], [1.0, 5.0, 4.0, 0.0, 7.0]),
    "Geometric": ([[0.1, 0.5, 0.7, 0.3, 0.95]], ["probs"], [1.0, 5.0, 4.0, 0.0, 7.0]),
    "NegativeBinomial": ([[3.0, 5.0, 10.0, 1.5, 7.0], [0.1, 0.5, 0.7, 0.3, 0.9]],
                         ["total_count", "probs"], [1.0, 5.0, 4.0, 0.0, 7.0]),
}
# which summaries torch defines for each family
ATTRS = {
    "Cauchy": ("mean", "mode", "variance", "entropy", "cdf", "icdf"),
    "StudentT": ("mean", "mode", "variance", "stddev", "entropy"),
    "Chi2": ("mean", "mode", "variance", "entropy"),
    "FisherSnedecor": ("mean", "mode", "variance"),
    "InverseGamma": ("mean", "mode", "variance", "entropy"),
    "GeneralizedPareto": ("mean", "mode", "variance", "entropy", "icdf"),
    "ContinuousBernoulli": ("mean", "variance", "stddev", "entropy", "cdf", "icdf"),
    "Binomial": ("mean", "mode", "variance"),  # entropy: one total_count (below)
    "Geometric": ("mean", "mode", "variance", "entropy"),
    "NegativeBinomial": ("mean", "mode", "variance"),
}
UNIT = np.array([0.05, 0.3, 0.5, 0.77, 0.96])


def _build(name, grad=False):
    arrays, kw, _ = CASES[name]
    pairs = [_pair(a, grad) for a in arrays]
    if kw is None:
        m = getattr(md, name)(*[p[0] for p in pairs])
        t = getattr(td, name)(*[p[1] for p in pairs])
    else:
        m = getattr(md, name)(**{k: p[0] for k, p in zip(kw, pairs)})
        t = getattr(td, name)(**{k: p[1] for k, p in zip(kw, pairs)})
    return m, t, pairs


def _gp_log_prob_cdf(loc, scale, conc, x):
    """The generalized Pareto log density and cdf in closed form (NumPy)."""
    loc, scale, conc, x = (np.asarray(v, dtype=np.float64) for v in (loc, scale, conc, x))
    z = (x - loc) / scale
    zero = conc == 0
    c = np.where(zero, 1.0, conc)
    lp = np.where(zero, -z, -(1 / c + 1) * np.log1p(c * z)) - np.log(scale)
    cdf = np.where(zero, -np.expm1(-z), 1 - (1 + c * z) ** (-1 / c))
    return lp, cdf


WITH_TORCH_LOG_PROB = sorted(set(CASES) - {"GeneralizedPareto"})


def test_generalized_pareto_log_prob_cdf_and_gradient():
    # torch 2.13's GeneralizedPareto.log_prob/cdf raise for float64 parameters; the oracle is
    # the closed form, and the gradient is checked by central differences (error ~h^2)
    arrays, _, val = CASES["GeneralizedPareto"]
    m, _, pairs = _build("GeneralizedPareto", grad=True)
    vm = _pair(val)[0]
    lp, cdf = _gp_log_prob_cdf(*arrays, val)
    _close(m.log_prob(vm), lp, rtol=1e-12)
    _close(m.cdf(vm), cdf, rtol=1e-12)
    m.log_prob(vm).sum().backward()
    h = 1e-6
    for i, (pm, _) in enumerate(pairs):
        num = []
        for j in range(5):
            up = [np.array(a, dtype=np.float64) for a in arrays]
            dn = [np.array(a, dtype=np.float64) for a in arrays]
            up[i][j] += h
            dn[i][j] -= h
            num.append((_gp_log_prob_cdf(*up, val)[0].sum()
                        - _gp_log_prob_cdf(*dn, val)[0].sum()) / (2 * h))
        if i == 2:  # at concentration 0 the exponential branch is taken, as in torch:
            num[1] = 0.0  # no gradient flows into the concentration there
        _close(pm.grad, num, rtol=1e-6, atol=1e-8)
    tm = td.GeneralizedPareto(*(torch.tensor(a, dtype=torch.float32) for a in arrays))
    _close(m.log_prob(vm), tm.log_prob(torch.tensor(val, dtype=torch.float32)), rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_log_prob_and_summaries_match_torch(name):
    m, t, _ = _build(name)
    vm, vt = _pair(CASES[name][2])
    if name in WITH_TORCH_LOG_PROB:
        _close(m.log_prob(vm), t.log_prob(vt))
    for attr in ATTRS[name]:
        if attr in ("cdf", "icdf"):
            arg = CASES[name][2] if attr == "cdf" else UNIT
            am, at = _pair(arg)
            _close(getattr(m, attr)(am), getattr(t, attr)(at))
        elif attr == "entropy":
            _close(m.entropy(), t.entropy())
        else:
            _close(getattr(m, attr), getattr(t, attr))
    assert m.has_rsample == t.has_rsample
    assert tuple(m.batch_shape) == tuple(t.batch_shape)
    assert tuple(m.event_shape) == tuple(t.event_shape)
    assert repr(m.arg_constraints.keys()) == repr(t.arg_constraints.keys())


@pytest.mark.parametrize("name", WITH_TORCH_LOG_PROB)
def test_log_prob_gradients_match_torch(name):
    m, t, pairs = _build(name, grad=True)
    vm, vt = _pair(CASES[name][2])
    m.log_prob(vm).sum().backward()
    t.log_prob(vt).sum().backward()
    for pm, pt in pairs:
        _close(pm.grad, pt.grad, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", sorted(CASES))
def test_expand_keeps_values(name):
    m, t, _ = _build(name)
    em, et = m.expand((3, 5)), t.expand((3, 5))
    assert type(em) is type(m)
    assert tuple(em.batch_shape) == (3, 5)
    vm, vt = _pair(CASES[name][2])
    _close(em.log_prob(vm), et.log_prob(vt) if name in WITH_TORCH_LOG_PROB else
           np.broadcast_to(_np(m.log_prob(vm)), (3, 5)))


def test_continuous_bernoulli_with_logits():
    lm, lt = _pair([-2.0, 0.001, 0.0, 1.5])
    m, t = md.ContinuousBernoulli(logits=lm), td.ContinuousBernoulli(logits=lt)
    v = [0.2, 0.4, 0.6, 0.9]
    _close(m.log_prob(_pair(v)[0]), t.log_prob(_pair(v)[1]))
    _close(m.mean, t.mean)
    _close(m.entropy(), t.entropy())


def test_von_mises_log_prob_and_variance():
    # torch evaluates log I0 by a polynomial approximation of relative error < 2e-7 (the
    # Abramowitz-Stegun fits); mpitensor's i0e is exact to rounding
    loc, conc, val = [0.3, -1.0, 2.0, 0.0], [0.05, 1.0, 4.0, 30.0], [0.1, -2.5, 3.0, 0.2]
    (lm, lt), (cm, ct), (vm, vt) = _pair(loc), _pair(conc, True), _pair(val)
    m, t = md.VonMises(lm, cm), td.VonMises(lt, ct)
    _close(m.log_prob(vm), t.log_prob(vt), rtol=0, atol=1e-6)
    _close(m.variance, t.variance, rtol=0, atol=2e-7)
    i1 = sum((np.array(conc) / 2) ** (2 * j + 1) / (math.factorial(j) * math.factorial(j + 1))
             for j in range(80))
    # exact: log I0(k) by its series sum_j (k/2)^(2j) / (j!)^2
    ks = np.array(conc)
    i0 = sum((ks / 2) ** (2 * j) / math.factorial(j) ** 2 for j in range(80))
    want = ks * np.cos(np.array(val) - np.array(loc)) - math.log(2 * math.pi) - np.log(i0)
    _close(m.log_prob(vm), want, rtol=1e-12)
    _close(m.variance, 1 - i1 / i0, rtol=1e-12)
    m.log_prob(vm).sum().backward()
    t.log_prob(vt).sum().backward()
    _close(cm.grad, ct.grad, rtol=0, atol=1e-6)


def _matrix_family_matches(m, t, xm, xt):
    """log_prob, entropy and the matrix summaries agree; backpropagate both sums."""
    _close(m.log_prob(xm), t.log_prob(xt))
    _close(m.entropy(), t.entropy())
    for attr in ("mean", "mode", "variance", "covariance_matrix", "precision_matrix",
                 "scale_tril"):
        _close(getattr(m, attr), getattr(t, attr))
    (m.log_prob(xm).sum() + m.entropy().sum()).backward()
    (t.log_prob(xt).sum() + t.entropy().sum()).backward()


def test_low_rank_mvn_matches_torch():
    n, r = 4, 2
    loc, w, d = RNG.normal(size=(3, n)), RNG.normal(size=(n, r)), RNG.uniform(0.5, 2, n)
    (lm, lt), (wm, wt), (dm, dt) = _pair(loc, True), _pair(w, True), _pair(d, True)
    m = md.LowRankMultivariateNormal(lm, wm, dm)
    t = td.LowRankMultivariateNormal(lt, wt, dt)
    x = RNG.normal(size=(2, 3, n))
    (xm, xt) = _pair(x)
    _matrix_family_matches(m, t, xm, xt)
    for a, b in ((lm, lt), (wm, wt), (dm, dt)):
        _close(a.grad, b.grad, rtol=1e-9)
    assert tuple(m.expand((2, 3)).batch_shape) == (2, 3)


def _multinomial_entropy(n, p):
    h = 0.0
    for a in range(n + 1):
        for b in range(n + 1 - a):
            x = (a, b, n - a - b)
            lp = (math.lgamma(n + 1) - sum(math.lgamma(v + 1) for v in x)
                  + sum(v * math.log(q) for v, q in zip(x, p)))
            h -= math.exp(lp) * lp
    return h


def test_multinomial_matches_torch():
    pm, pt = _pair([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]], True)
    m, t = md.Multinomial(5, pm), td.Multinomial(5, pt)
    vm, vt = _pair([[1.0, 1.0, 3.0], [5.0, 0.0, 0.0]])
    _close(m.log_prob(vm), t.log_prob(vt))
    # torch's entropy is off by ~6e-8 here (its Binomial weights); the exact one enumerates
    # every count vector
    _close(m.entropy(), t.entropy(), rtol=0, atol=1e-7)
    _close(m.entropy(), [_multinomial_entropy(5, row) for row in pm.tolist()], rtol=1e-12)
    _close(m.mean, t.mean)
    _close(m.variance, t.variance)
    m.log_prob(vm).sum().backward()
    t.log_prob(vt).sum().backward()
    _close(pm.grad, pt.grad)
    s = m.sample((4,))
    assert tuple(s.shape) == (4, 2, 3)
    assert s.sum(-1).tolist() == [[5.0, 5.0]] * 4


def test_binomial_enumerate_support_and_shapes():
    m = md.Binomial(3, mt.tensor([0.2, 0.6], dtype=mt.float64))
    t = td.Binomial(3, torch.tensor([0.2, 0.6], dtype=torch.float64))
    _close(m.enumerate_support(), t.enumerate_support())
    _close(m.enumerate_support(False), t.enumerate_support(False))
    assert tuple(m.enumerate_support(False).shape) == (4, 1)
    assert m.has_enumerate_support
    _close(m.entropy(), t.entropy())
    inhom = md.Binomial(mt.tensor([2.0, 3.0]), mt.tensor([0.5, 0.5]))
    with pytest.raises(NotImplementedError):
        inhom.enumerate_support()


@pytest.mark.parametrize("make,match", [
    (lambda: md.Cauchy(0.0, -1.0), "GreaterThan"),
    (lambda: md.StudentT(-1.0), "GreaterThan"),
    (lambda: md.Chi2(mt.tensor([1.0, 0.0])), "GreaterThan"),
    (lambda: md.Binomial(mt.tensor(2.5), mt.tensor(0.3)), "IntegerGreaterThan"),
    (lambda: md.Binomial(3, mt.tensor(1.3)), "Interval"),
    (lambda: md.NegativeBinomial(2.0, mt.tensor(1.0)), "HalfOpenInterval"),
    (lambda: md.ContinuousBernoulli(mt.tensor(1.5)), "Interval"),
    (lambda: md.Geometric(mt.tensor(0.0)), "> 0"),
    (lambda: md.LowRankMultivariateNormal(mt.zeros(2), mt.ones(2, 1), mt.zeros(2)),
     "GreaterThan"),
])
def test_invalid_parameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_values_outside_support_raise():
    with pytest.raises(ValueError, match="support"):
        md.Binomial(3, mt.tensor(0.5)).log_prob(mt.tensor(4.0))
    with pytest.raises(ValueError, match="support"):
        md.InverseGamma(2.0, 1.0).log_prob(mt.tensor(-1.0))
    with pytest.raises(ValueError, match="support"):
        md.GeneralizedPareto(0.0, 1.0, -0.5).log_prob(mt.tensor(3.0))  # above loc + 2
    with pytest.raises(ValueError, match="support"):
        md.Multinomial(2, mt.tensor([0.5, 0.5])).log_prob(mt.tensor([2.0, 1.0]))
    with pytest.raises(ValueError, match="probs or logits"):
        md.Geometric()


def _check_mean(draws, mean, var, k=5.0):
    """The sample mean is within k standard errors of ``mean``."""
    x = np.asarray(draws.tolist(), dtype=np.float64)
    n = x.shape[0]
    se = np.sqrt(np.asarray(var) / n)
    assert np.all(np.abs(x.mean(0) - mean) <= k * se + 1e-12), (x.mean(0), mean, se)


N = 40000


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampling_statistics(name):
    mt.manual_seed(3)
    m, t, _ = _build(name)
    s = m.sample((N,))
    assert tuple(s.shape) == (N, 5)
    assert s.dtype == mt.float64
    mean, var = _np(t.mean), _np(t.variance)
    ok = np.isfinite(mean) & np.isfinite(var)
    if name in ("Cauchy", "StudentT", "FisherSnedecor", "InverseGamma", "GeneralizedPareto"):
        # heavy tails: test the median through the cdf instead, P(X <= median) = 1/2
        q = _np(t.icdf(torch.full((5,), 0.5, dtype=torch.float64))) if hasattr(
            t, "icdf") and name in ("Cauchy", "GeneralizedPareto") else None
        if q is not None:
            frac = (np.asarray(s.tolist()) <= q).mean(0)
            assert np.all(np.abs(frac - 0.5) <= 5 * math.sqrt(0.25 / N))
        # the finite-variance entries by their mean (fourth moments finite where var is)
        ok = ok & (_np(t.variance) < 50)
    if ok.any():
        _check_mean(s[:, mt.tensor(np.flatnonzero(ok))], mean[ok], var[ok])
    assert bool(m.support.check(s).all())
    mt.manual_seed(3)
    assert mt.equal(_build(name)[0].sample((N,)), s)


@pytest.mark.parametrize("name", ["Cauchy", "StudentT", "Chi2", "FisherSnedecor",
                                  "InverseGamma", "GeneralizedPareto", "ContinuousBernoulli"])
def test_rsample_is_differentiable(name):
    m, _, pairs = _build(name, grad=True)
    m.rsample((50,)).sum().backward()
    for p, _ in pairs:
        assert p.grad is not None and bool(mt.isfinite(p.grad).all())


def test_von_mises_sampling_circular_mean():
    mt.manual_seed(0)
    loc, conc = mt.tensor([0.5, -2.0, 3.0], dtype=mt.float64), mt.tensor(
        [0.5, 2.0, 20.0], dtype=mt.float64)
    s = md.VonMises(loc, conc).sample((N,))
    x = np.asarray(s.tolist())
    assert np.all((x >= -math.pi) & (x < math.pi))
    # E[cos(X - loc)] = I1(k) / I0(k); Var[cos] <= 1
    c = np.cos(x - np.asarray(loc.tolist())).mean(0)
    want = 1 - np.asarray(md.VonMises(loc, conc).variance.tolist())
    assert np.all(np.abs(c - want) <= 5 * math.sqrt(1.0 / N))
    sn = np.sin(x - np.asarray(loc.tolist())).mean(0)
    assert np.all(np.abs(sn) <= 5 * math.sqrt(1.0 / N))


def test_low_rank_mvn_sampling_covariance():
    mt.manual_seed(1)
    w = mt.tensor([[1.0], [0.5], [-1.0]], dtype=mt.float64)
    d = mt.tensor([0.5, 1.0, 2.0], dtype=mt.float64)
    m = md.LowRankMultivariateNormal(mt.tensor([1.0, 0.0, -1.0], dtype=mt.float64), w, d)
    x = np.asarray(m.rsample((N,)).tolist())
    cov = np.asarray(m.covariance_matrix.tolist())
    emp = np.cov(x.T)
    # the standard error of a sample covariance entry: sqrt((S_ii S_jj + S_ij^2) / N)
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov ** 2) / N)
    assert np.all(np.abs(emp - cov) <= 5 * se)
    _check_mean(m.rsample((N,)), np.array([1.0, 0.0, -1.0]), np.diag(cov))


def test_straight_through_gradient():
    logits = mt.tensor([0.2, -1.0, 1.5], dtype=mt.float64, requires_grad=True)
    d = md.OneHotCategoricalStraightThrough(logits=logits)
    assert d.has_rsample
    mt.manual_seed(0)
    s = d.rsample()
    assert sorted(s.tolist()) == [0.0, 0.0, 1.0]
    (s * mt.tensor([1.0, 2.0, 3.0], dtype=mt.float64)).sum().backward()
    lt = torch.tensor([0.2, -1.0, 1.5], dtype=torch.float64, requires_grad=True)
    (torch.softmax(lt, -1) * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    _close(logits.grad, lt.grad)


def _mixture(lib, dist, logits, mu, sigma):
    return dist.MixtureSameFamily(dist.Categorical(logits=logits),
                                  dist.Independent(dist.Normal(mu, sigma), 1))


def test_mixture_same_family_matches_torch():
    lg, mu, sg = RNG.normal(size=(4, 3)), RNG.normal(size=(4, 3, 2)), RNG.uniform(.5, 2, (4, 3, 2))
    (lm, lt), (mm, mtt), (sm, st) = _pair(lg, True), _pair(mu, True), _pair(sg, True)
    m, t = _mixture(mt, md, lm, mm, sm), _mixture(torch, td, lt, mtt, st)
    assert tuple(m.batch_shape) == (4,) and tuple(m.event_shape) == (2,)
    x = RNG.normal(size=(5, 4, 2))
    xm, xt = _pair(x)
    _close(m.log_prob(xm), t.log_prob(xt))
    _close(m.mean, t.mean)
    _close(m.variance, t.variance)
    m.log_prob(xm).sum().backward()
    t.log_prob(xt).sum().backward()
    for a, b in ((lm, lt), (mm, mtt), (sm, st)):
        _close(a.grad, b.grad, rtol=1e-9)
    # cdf of a univariate mixture
    m1 = md.MixtureSameFamily(md.Categorical(logits=lm.detach()),
                              md.Normal(mm[..., 0].detach(), 1.0))
    t1 = td.MixtureSameFamily(td.Categorical(logits=lt.detach()),
                              td.Normal(mtt[..., 0].detach(), 1.0))
    vm, vt = _pair([0.3, -0.2, 1.0, 0.0])
    _close(m1.cdf(vm), t1.cdf(vt))
    e = m.expand((2, 4))
    assert tuple(e.batch_shape) == (2, 4)
    _close(e.log_prob(xm[0]), t.expand((2, 4)).log_prob(xt[0]))
    mt.manual_seed(5)
    s = m1.sample((N,))
    assert tuple(s.shape) == (N, 4)
    _check_mean(s, _np(t1.mean), _np(t1.variance))


def test_mixture_errors():
    with pytest.raises(ValueError, match="Categorical"):
        md.MixtureSameFamily(md.Normal(0.0, 1.0), md.Normal(mt.zeros(2), 1.0))
    with pytest.raises(ValueError, match="components"):
        md.MixtureSameFamily(md.Categorical(logits=mt.zeros(3)), md.Normal(mt.zeros(2), 1.0))


def _mdn_losses(lib, dist, w0, b0, x, y, steps=3):
    """A mixture-density-network head (3 components, 2-D outputs) trained by NLL with SGD."""
    w = lib.tensor(w0, dtype=lib.float64, requires_grad=True)
    b = lib.tensor(b0, dtype=lib.float64, requires_grad=True)
    xs, ys = lib.tensor(x, dtype=lib.float64), lib.tensor(y, dtype=lib.float64)
    opt = lib.optim.SGD([w, b], lr=0.05)
    losses = []
    for _ in range(steps):
        h = xs @ w + b  # (batch, 3 + 3*2 + 3*2)
        logits = h[:, :3]
        mu = h[:, 3:9].reshape(-1, 3, 2)
        sigma = lib.nn.functional.softplus(h[:, 9:15]).reshape(-1, 3, 2) + 1e-3
        mix = dist.MixtureSameFamily(dist.Categorical(logits=logits),
                                     dist.Independent(dist.Normal(mu, sigma), 1))
        loss = -mix.log_prob(ys).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_mdn_head_trains_like_torch():
    rng = np.random.default_rng(11)
    w0, b0 = rng.normal(scale=0.3, size=(4, 15)), rng.normal(scale=0.1, size=15)
    x, y = rng.normal(size=(32, 4)), rng.normal(size=(32, 2))
    ours = _mdn_losses(mt, md, w0, b0, x, y)
    theirs = _mdn_losses(torch, td, w0, b0, x, y)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-8)
    assert ours[-1] < ours[0]


def test_kl_pairs_match_torch():
    pairs = [
        (lambda D, T: D.Binomial(5, T([0.3, 0.6])), lambda D, T: D.Binomial(5, T([0.5, 0.2]))),
        (lambda D, T: D.Geometric(T([0.3, 0.6])), lambda D, T: D.Geometric(T([0.5, 0.2]))),
        (lambda D, T: D.Cauchy(T([0.0, 1.0]), T([1.0, 2.0])),
         lambda D, T: D.Cauchy(T([0.5, -1.0]), T([2.0, 0.7]))),
        (lambda D, T: D.ContinuousBernoulli(T([0.3, 0.8])),
         lambda D, T: D.ContinuousBernoulli(T([0.5, 0.1]))),
        (lambda D, T: D.Beta(T([2.0, 0.5]), T([3.0, 1.5])),
         lambda D, T: D.ContinuousBernoulli(T([0.3, 0.8]))),
        (lambda D, T: D.Uniform(T([0.1, 0.2]), T([0.9, 0.5])),
         lambda D, T: D.ContinuousBernoulli(T([0.3, 0.8]))),
        (lambda D, T: D.ContinuousBernoulli(T([0.3, 0.8])), lambda D, T: D.Exponential(
            T([2.0, 0.5]))),
        (lambda D, T: D.ContinuousBernoulli(T([0.3, 0.8])),
         lambda D, T: D.Normal(T([0.2, -1.0]), T([2.0, 0.5]))),
        (lambda D, T: D.ContinuousBernoulli(T([0.3, 0.8])),
         lambda D, T: D.Uniform(T([-0.1, 0.2]), T([1.9, 1.5]))),  # the second: inf
        (lambda D, T: D.Normal(T([0.3, 0.8]), T([1.0, 1.0])),
         lambda D, T: D.ContinuousBernoulli(T([0.3, 0.8]))),
        (lambda D, T: D.Poisson(T([0.3, 0.8])), lambda D, T: D.Binomial(3, T([0.3, 0.8]))),
    ]
    for mp, mq in pairs:
        ours = md.kl_divergence(mp(md, lambda v: mt.tensor(v, dtype=mt.float64)),
                                mq(md, lambda v: mt.tensor(v, dtype=mt.float64)))
        theirs = td.kl_divergence(mp(td, lambda v: torch.tensor(v, dtype=torch.float64)),
                                  mq(td, lambda v: torch.tensor(v, dtype=torch.float64)))
        _close(ours, theirs)


def test_kl_uniform_unit_interval_against_continuous_bernoulli():
    # Uniform(0, 1) and a ContinuousBernoulli share their support: the divergence is finite,
    # -H(U) - E_U[log q] = -(logit / 2 + log(1 - p) + log C(p)) (torch 2.13 gives inf here)
    p = 0.3
    q = md.ContinuousBernoulli(mt.tensor([p], dtype=mt.float64))
    logit = math.log(p / (1 - p))
    log_c = math.log(2 * math.atanh(1 - 2 * p) / (1 - 2 * p))
    want = -(logit / 2 + math.log(1 - p) + log_c)
    kl = md.kl_divergence(md.Uniform(mt.zeros(1, dtype=mt.float64),
                                     mt.ones(1, dtype=mt.float64)), q)
    _close(kl, [want], rtol=1e-12)


def test_kl_low_rank_pairs_match_torch():
    n = 3
    loc, w, d = RNG.normal(size=n), RNG.normal(size=(n, 2)), RNG.uniform(.5, 2, n)
    loc2, w2, d2 = RNG.normal(size=n), RNG.normal(size=(n, 1)), RNG.uniform(.5, 2, n)
    a = np.eye(n) + 0.3 * np.ones((n, n))
    m1 = md.LowRankMultivariateNormal(*(_pair(v)[0] for v in (loc, w, d)))
    t1 = td.LowRankMultivariateNormal(*(_pair(v)[1] for v in (loc, w, d)))
    m2 = md.LowRankMultivariateNormal(*(_pair(v)[0] for v in (loc2, w2, d2)))
    t2 = td.LowRankMultivariateNormal(*(_pair(v)[1] for v in (loc2, w2, d2)))
    m3 = md.MultivariateNormal(_pair(loc2)[0], covariance_matrix=_pair(a)[0])
    t3 = td.MultivariateNormal(_pair(loc2)[1], covariance_matrix=_pair(a)[1])
    _close(md.kl_divergence(m1, m2), td.kl_divergence(t1, t2))
    _close(md.kl_divergence(m1, m3), td.kl_divergence(t1, t3))
    _close(md.kl_divergence(m3, m1), td.kl_divergence(t3, t1))


def test_exponential_family_entropy_by_log_normalizer():
    p = mt.tensor([0.2, 0.7, 0.9], dtype=mt.float64)
    d = md.ContinuousBernoulli(p)
    with mt.no_grad():
        generic = md.ExponentialFamily.entropy(d)
    _close(generic, d.entropy(), rtol=1e-9)
    pg = p.clone().requires_grad_()
    with pytest.raises(NotImplementedError, match="higher-order"):
        md.ExponentialFamily.entropy(md.ContinuousBernoulli(pg))


@pytest.mark.parametrize("name,kw", [("Binomial", {"total_count": 5}), ("Geometric", {}),
                                     ("NegativeBinomial", {"total_count": 3.0})])
def test_counting_families_with_logits(name, kw):
    logits, value = [-1.5, 0.0, 0.7, 2.0], [1.0, 0.0, 3.0, 2.0]
    (lm, lt), (vm, vt) = _pair(logits, True), _pair(value)
    m, t = getattr(md, name)(logits=lm, **kw), getattr(td, name)(logits=lt, **kw)
    _close(m.log_prob(vm), t.log_prob(vt))
    _close(m.probs, t.probs)
    for attr in ("mean", "mode", "variance"):
        _close(getattr(m, attr), getattr(t, attr))
    if name != "NegativeBinomial":
        _close(m.entropy(), t.entropy())
    m.log_prob(vm).sum().backward()
    t.log_prob(vt).sum().backward()
    _close(lm.grad, lt.grad)


def test_event_shapes_of_samples():
    mix = md.MixtureSameFamily(md.Categorical(logits=mt.zeros(4, 3)),
                               md.Independent(md.Normal(mt.randn(4, 3, 2), 1.0), 1))
    assert tuple(mix.sample((7,)).shape) == (7, 4, 2)
    st = md.OneHotCategoricalStraightThrough(logits=mt.zeros(2, 3)).expand((5, 2))
    assert tuple(st.rsample((4,)).shape) == (4, 5, 2, 3)
    assert tuple(md.Multinomial(3, mt.ones(3)).expand((2,)).sample().shape) == (2, 3)
    chi = md.Chi2(mt.tensor([2.0, 3.0])).expand((4, 2))
    assert type(chi) is md.Chi2 and tuple(chi.df.shape) == (4, 2)
    assert mt.equal(chi.concentration, chi.df / 2)


def _spd(rng, batch, p, shift):
    a = rng.normal(size=(*batch, p, p))
    return a @ np.swapaxes(a, -1, -2) + shift * np.eye(p)


@pytest.mark.parametrize("kw", ["covariance_matrix", "precision_matrix", "scale_tril"])
def test_wishart_matches_torch(kw):
    rng = np.random.default_rng(2)
    s, x, df = _spd(rng, (2,), 3, 3.0), _spd(rng, (2,), 3, 1.0), [4.5, 6.0]
    mat = np.linalg.cholesky(s) if kw == "scale_tril" else s
    (sm, st), (dm, dt), (xm, xt) = _pair(mat, True), _pair(df, True), _pair(x)
    m, t = md.Wishart(dm, **{kw: sm}), td.Wishart(dt, **{kw: st})
    _matrix_family_matches(m, t, xm, xt)
    # the gradient in df goes through trigamma, which torch computes to ~5e-10
    _close(dm.grad, dt.grad, rtol=1e-8)
    gm, gt = _np(sm.grad), _np(st.grad)
    if kw == "scale_tril":  # only the lower triangle enters; torch's solve also fills the upper
        gm, gt = np.tril(gm), np.tril(gt)
    _close(gm, gt, rtol=1e-9)
    assert tuple(m.expand((4, 2)).batch_shape) == (4, 2)


def test_wishart_sampling_and_errors():
    rng = np.random.default_rng(3)
    s = _spd(rng, (), 3, 1.0)
    m = md.Wishart(mt.tensor(5.0, dtype=mt.float64), covariance_matrix=_pair(s)[0])
    mt.manual_seed(4)
    x = m.rsample((N,))
    assert tuple(x.shape) == (N, 3, 3)
    assert bool(md.constraints.positive_definite.check(x).all())
    _check_mean(x.reshape(N, 9), _np(m.mean).reshape(9), _np(m.variance).reshape(9))
    df = mt.tensor(5.0, dtype=mt.float64, requires_grad=True)
    sm = _pair(s, True)[0]
    md.Wishart(df, covariance_matrix=sm).rsample((10,)).sum().backward()
    assert bool(mt.isfinite(df.grad)) and bool(mt.isfinite(sm.grad).all())
    with pytest.raises(ValueError, match="greater than"):
        md.Wishart(mt.tensor(1.5), covariance_matrix=mt.eye(3))
    with pytest.raises(ValueError, match="exactly one"):
        md.Wishart(mt.tensor(4.0))
    with pytest.raises(ValueError, match="PositiveDefinite"):
        md.Wishart(mt.tensor(4.0), covariance_matrix=-mt.eye(3))


@pytest.mark.parametrize("conc", [0.5, 1.0, 3.0])
def test_lkj_cholesky(conc):
    d = 4
    cm, ct = _pair([conc, conc + 1], True)
    m, t = md.LKJCholesky(d, cm), td.LKJCholesky(d, ct)
    mt.manual_seed(6)
    x = m.sample((N,))
    assert tuple(x.shape) == (N, 2, d, d)
    assert bool(md.constraints.corr_cholesky.check(x).all())
    xs = x[:5]
    xt = torch.tensor(np.asarray(xs.tolist()))
    _close(m.log_prob(xs), t.log_prob(xt))
    m.log_prob(xs).sum().backward()
    t.log_prob(xt).sum().backward()
    _close(cm.grad, ct.grad)
    # each correlation r: (r + 1) / 2 ~ Beta(a, a), a = conc - 1 + d / 2: E[r^2] = 1 / (2a + 1)
    # (every pair, the first row's and the last rows' alike)
    corr = x @ x.mT
    a = np.array([conc, conc + 1]) - 1 + d / 2
    for i, j in ((0, 1), (0, 3), (1, 2), (2, 3)):
        c = np.asarray(corr[..., i, j].tolist()) ** 2
        assert np.all(np.abs(c.mean(0) - 1 / (2 * a + 1)) <= 5 * c.std(0) / math.sqrt(N))
    assert tuple(m.expand((3, 2)).sample().shape) == (3, 2, d, d)


def test_exponential_family_kl_by_bregman_divergence():
    # the generic Bregman form against the closed-form ContinuousBernoulli pair
    from mpitensor.distributions.kl import _kl_expfamily_expfamily

    p = md.ContinuousBernoulli(mt.tensor([0.2, 0.7, 0.45], dtype=mt.float64))
    q = md.ContinuousBernoulli(mt.tensor([0.6, 0.1, 0.9], dtype=mt.float64))
    with mt.no_grad():
        _close(_kl_expfamily_expfamily(p, q), md.kl_divergence(p, q), rtol=1e-9)
    with pytest.raises(NotImplementedError, match="different exponential families"):
        _kl_expfamily_expfamily(p, _OtherFamily(mt.tensor([0.5], dtype=mt.float64)))
    pg = md.ContinuousBernoulli(mt.tensor([0.2], dtype=mt.float64, requires_grad=True))
    with pytest.raises(NotImplementedError, match="higher-order"):
        _kl_expfamily_expfamily(p, pg)


class _OtherFamily(md.ContinuousBernoulli):
    pass
