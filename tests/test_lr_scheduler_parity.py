"""mpitensor.optim.lr_scheduler against torch.optim.lr_scheduler: the same rates, bit for bit.

Each test drives an mpitensor scheduler and a torch one with the same settings side by side
and compares the learning rates the optimisers' groups hold after every step, exactly (the
schedules multiply floats, so a different order of operations would show in the last bit).
"""

from __future__ import annotations

import warnings

import pytest

import mpitensor as mt
from mpitensor.nn import Parameter
from mpitensor.optim import SGD, lr_scheduler

torch = pytest.importorskip("torch", reason="torch is the oracle these tests compare with")

# torch warns when its scheduler steps without an optimiser step; the order is not under test
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")

LRS = (1.0, 0.3, 0.07)  # one rate per parameter group; 0.3 and 0.07 are not exact in binary

SCHEDULES = [
    ("StepLR", dict(step_size=1, gamma=0.6)),
    ("StepLR", dict(step_size=3, gamma=0.5)),
    ("StepLR", dict(step_size=4, gamma=0.1)),
    ("StepLR", dict(step_size=7)),
    ("MultiStepLR", dict(milestones=[2, 5, 5, 9], gamma=0.1)),
    ("MultiStepLR", dict(milestones=[12, 3, 30], gamma=0.33)),
    ("MultiStepLR", dict(milestones=[])),
    ("ExponentialLR", dict(gamma=0.9)),
    ("ExponentialLR", dict(gamma=0.37)),
    ("CosineAnnealingLR", dict(T_max=10)),
    ("CosineAnnealingLR", dict(T_max=7, eta_min=0.01)),
    ("CosineAnnealingLR", dict(T_max=45, eta_min=1e-3)),
    ("LambdaLR", dict(lr_lambda=lambda epoch: 0.93 ** epoch)),
    ("LambdaLR", dict(lr_lambda=[lambda e: 1.0 / (e + 1), lambda e: min(1.0, (e + 1) / 5),
                                 lambda e: 0.5 ** (e // 4)])),
    ("OneCycleLR", dict(max_lr=0.9, total_steps=45)),
    ("OneCycleLR", dict(max_lr=[0.9, 0.4, 0.13], epochs=9, steps_per_epoch=5,
                        anneal_strategy="linear", pct_start=0.25)),
    ("OneCycleLR", dict(max_lr=0.6, total_steps=41, three_phase=True, div_factor=10.0,
                        final_div_factor=100.0, base_momentum=0.8, max_momentum=0.99)),
    ("OneCycleLR", dict(max_lr=0.6, total_steps=50, three_phase=True, pct_start=0.2,
                        anneal_strategy="linear", cycle_momentum=False)),
    ("MultiplicativeLR", dict(lr_lambda=lambda epoch: 0.95)),
    ("MultiplicativeLR", dict(lr_lambda=[lambda e: 0.9, lambda e: 1.0 - 0.01 * e,
                                         lambda e: 0.5 if e % 4 == 0 else 1.0])),
    ("LinearLR", dict()),
    ("LinearLR", dict(start_factor=0.1, end_factor=0.7, total_iters=9)),
    ("LinearLR", dict(start_factor=1.0, end_factor=0.05, total_iters=30)),
    ("ConstantLR", dict()),
    ("ConstantLR", dict(factor=0.3, total_iters=11)),
    ("PolynomialLR", dict()),
    ("PolynomialLR", dict(total_iters=17, power=2.5)),
    ("PolynomialLR", dict(total_iters=50, power=0.7)),
    ("CosineAnnealingWarmRestarts", dict(T_0=7)),
    ("CosineAnnealingWarmRestarts", dict(T_0=3, T_mult=2, eta_min=0.01)),
    ("CosineAnnealingWarmRestarts", dict(T_0=5, T_mult=3, eta_min=1e-3)),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.9, step_size_up=4)),
    ("CyclicLR", dict(base_lr=[0.01, 0.02, 0.005], max_lr=[0.9, 0.4, 0.13], step_size_up=3,
                      step_size_down=7, mode="triangular2")),
    ("CyclicLR", dict(base_lr=0.05, max_lr=0.6, step_size_up=5, mode="exp_range",
                      gamma=0.97, base_momentum=0.7, max_momentum=0.95)),
    ("CyclicLR", dict(base_lr=0.05, max_lr=0.6, step_size_up=6, scale_fn=lambda x: 0.8 ** x,
                      scale_mode="iterations", cycle_momentum=False)),
    ("CyclicLR", dict(base_lr=0.05, max_lr=0.6, step_size_up=2, step_size_down=3,
                      scale_fn=lambda c: 1.0 / c)),
]


def _kw_id(kw):
    def show(v):
        if callable(v):
            return "fn"
        if isinstance(v, list):
            return "[" + ",".join(show(x) for x in v) + "]"
        return repr(v)
    return ",".join(f"{k}={show(v)}" for k, v in kw.items())


IDS = [f"{name}-{_kw_id(kw)}" for name, kw in SCHEDULES]


def _ours(name, kwargs, **extra):
    opt = SGD([{"params": [Parameter(mt.zeros(1))], "lr": lr} for lr in LRS], lr=LRS[0])
    return opt, getattr(lr_scheduler, name)(opt, **kwargs, **extra)


def _theirs(name, kwargs, **extra):
    opt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr}
                           for lr in LRS], lr=LRS[0])
    return opt, getattr(torch.optim.lr_scheduler, name)(opt, **kwargs, **extra)


def _torch_rates(name, kwargs, steps):
    """The rates of every group before each of ``steps`` scheduler steps, and after the last."""
    opt, sched = _theirs(name, kwargs)
    seen = [sched.get_last_lr()]
    for _ in range(steps):
        opt.step()
        sched.step()
        seen.append(sched.get_last_lr())
    return seen


@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=IDS)
def test_same_rates_every_step(name, kwargs):
    expected = _torch_rates(name, kwargs, 40)
    opt, sched = _ours(name, kwargs)
    seen = [sched.get_last_lr()]
    for _ in range(40):
        opt.step()
        sched.step()
        seen.append(sched.get_last_lr())
        assert [g["lr"] for g in opt.param_groups] == seen[-1]
    assert seen == expected
    assert sched.last_epoch == 40
    _, tsched = _theirs(name, kwargs)
    assert sched.base_lrs == tsched.base_lrs
    if name not in ("OneCycleLR", "CyclicLR"):  # these two set the rates they start from
        assert sched.base_lrs == list(LRS)


@pytest.mark.parametrize("stop", [0, 1, 5, 13])
@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=IDS)
def test_resume_from_checkpoint_continues_identically(tmp_path, name, kwargs, stop):
    expected = _torch_rates(name, kwargs, 30)
    opt, sched = _ours(name, kwargs)
    for _ in range(stop):
        opt.step()
        sched.step()
    path = tmp_path / "ckpt.mt"
    mt.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, str(path))
    ckpt = mt.load(str(path))

    # the way examples/train.py resumes: fresh objects, then the optimiser's state, then ours
    opt, sched = _ours(name, kwargs)
    opt.load_state_dict(ckpt["optimizer"])
    sched.load_state_dict(ckpt["scheduler"])
    seen = [sched.get_last_lr()]
    for _ in range(30 - stop):
        opt.step()
        sched.step()
        seen.append(sched.get_last_lr())
    assert seen == expected[stop:]
    assert [g["lr"] for g in opt.param_groups] == expected[-1]


@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=IDS)
def test_state_dict_holds_what_torch_holds(name, kwargs):
    opt, sched = _ours(name, kwargs)
    topt, tsched = _theirs(name, kwargs)
    for _ in range(6):
        sched.step()
        tsched.step()
    ours, theirs = sched.state_dict(), tsched.state_dict()
    assert "optimizer" not in ours
    assert set(ours) <= set(theirs)
    for key, value in ours.items():
        assert value == theirs[key], key


@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=IDS)
def test_loads_a_torch_state_dict(name, kwargs):
    topt, tsched = _theirs(name, kwargs)
    for _ in range(8):
        tsched.step()
    opt, sched = _ours(name, kwargs)
    for group, tgroup in zip(opt.param_groups, topt.param_groups):
        group["lr"] = tgroup["lr"]
    sched.load_state_dict(tsched.state_dict())
    for _ in range(15):
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == tsched.get_last_lr()


@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=IDS)
def test_resume_with_last_epoch(name, kwargs):
    opt, _ = _ours(name, kwargs)
    topt, _ = _theirs(name, kwargs)
    sched = getattr(lr_scheduler, name)(opt, **kwargs, last_epoch=4)
    tsched = getattr(torch.optim.lr_scheduler, name)(topt, **kwargs, last_epoch=4)
    for _ in range(12):
        assert sched.get_last_lr() == tsched.get_last_lr()
        assert sched.last_epoch == tsched.last_epoch
        sched.step()
        tsched.step()


@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=IDS)
def test_step_to_an_epoch_uses_the_closed_form(name, kwargs):
    _, sched = _ours(name, kwargs)
    _, tsched = _theirs(name, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates step(epoch) but still honours it
        for epoch in (3, 9, 2, 15, 0, 31):
            sched.step(epoch)
            tsched.step(epoch)
            assert sched.get_last_lr() == tsched.get_last_lr(), epoch
            assert sched.last_epoch == tsched.last_epoch == epoch


def test_groups_added_rates_and_initial_lr_match_torch():
    opt, sched = _ours("StepLR", dict(step_size=2, gamma=0.5))
    topt, tsched = _theirs("StepLR", dict(step_size=2, gamma=0.5))
    assert [g["initial_lr"] for g in opt.param_groups] == \
        [g["initial_lr"] for g in topt.param_groups] == list(LRS)
    # a rate changed by hand between steps is what the next decay starts from, in both
    opt.param_groups[1]["lr"] = topt.param_groups[1]["lr"] = 0.9
    for _ in range(5):
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == tsched.get_last_lr()


def test_subclass_with_own_get_lr_like_torch():
    class Halving(lr_scheduler.LRScheduler):
        def get_lr(self):
            return [base * 0.5 ** self.last_epoch for base in self.base_lrs]

    class THalving(torch.optim.lr_scheduler.LRScheduler):
        def get_lr(self):
            return [base * 0.5 ** self.last_epoch for base in self.base_lrs]

    opt, _ = _ours("StepLR", dict(step_size=1))
    topt, _ = _theirs("StepLR", dict(step_size=1))
    sched, tsched = Halving(opt), THalving(topt)
    for _ in range(6):
        assert sched.get_last_lr() == tsched.get_last_lr()
        sched.step()
        tsched.step()
    assert lr_scheduler._LRScheduler is lr_scheduler.LRScheduler


# ---- OneCycleLR: momentum / betas, the end of the cycle, arguments ---------------------------

@pytest.mark.parametrize("three_phase", [False, True])
@pytest.mark.parametrize("anneal", ["cos", "linear"])
def test_one_cycle_cycles_sgd_momentum_like_torch(anneal, three_phase):
    kw = dict(max_lr=[0.9, 0.5, 0.2], total_steps=30, anneal_strategy=anneal,
              three_phase=three_phase, base_momentum=[0.8, 0.85, 0.7], max_momentum=0.97)
    opt, sched = _ours("OneCycleLR", kw)
    topt, tsched = _theirs("OneCycleLR", kw)
    for step in range(31):
        assert sched.get_last_lr() == tsched.get_last_lr(), step
        assert [g["momentum"] for g in opt.param_groups] == \
            [g["momentum"] for g in topt.param_groups], step
        for key in ("initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"):
            assert [g[key] for g in opt.param_groups] == [g[key] for g in topt.param_groups]
        if step < 30:
            opt.step()
            topt.step()
            sched.step()
            tsched.step()


def test_one_cycle_drives_adam_beta1_and_training_matches_torch():
    import numpy as np

    from mpitensor.optim import Adam

    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((4, 3))
    p = Parameter(mt.tensor(x0.copy()))
    r = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    opt = Adam([p], lr=0.01, betas=(0.9, 0.99), weight_decay=0.01)
    topt = torch.optim.Adam([r], lr=0.01, betas=(0.9, 0.99), weight_decay=0.01)
    kw = dict(max_lr=0.1, epochs=5, steps_per_epoch=5, pct_start=0.4)
    sched = lr_scheduler.OneCycleLR(opt, **kw)
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, **kw)
    assert sched.use_beta1 and opt.param_groups[0]["betas"] == (0.95, 0.99)
    for _ in range(25):
        g = rng.standard_normal((4, 3))
        p.grad, r.grad = mt.tensor(g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert opt.param_groups[0]["betas"] == topt.param_groups[0]["betas"]
        assert sched.get_last_lr() == tsched.get_last_lr()
    np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_one_cycle_refuses_to_step_past_the_end():
    kw = dict(max_lr=0.5, total_steps=6)
    opt, sched = _ours("OneCycleLR", kw)
    topt, tsched = _theirs("OneCycleLR", kw)
    for _ in range(6):
        sched.step()
        tsched.step()
    assert sched.get_last_lr() == tsched.get_last_lr()
    with pytest.raises(ValueError, match="total_steps=6"):
        sched.step()
    with pytest.raises(ValueError):
        tsched.step()
    # nothing moved: the rates and the epoch are those of the last valid step
    assert sched.last_epoch == 6 and sched.get_last_lr() == tsched.get_last_lr()
    assert [g["lr"] for g in opt.param_groups] == sched.get_last_lr()
    with pytest.raises(ValueError, match="past the end"):
        sched.step(7)


def _sgd(momentum=0.9, groups=1):
    return SGD([{"params": [Parameter(mt.zeros(1))]} for _ in range(groups)], lr=0.1,
               momentum=momentum)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_lr=1.0), "total_steps, or both epochs and steps_per_epoch"),
    (dict(max_lr=1.0, epochs=3), "total_steps, or both"),
    (dict(max_lr=1.0, total_steps=0), "total_steps must be a positive int"),
    (dict(max_lr=1.0, total_steps=10.0), "total_steps must be a positive int"),
    (dict(max_lr=1.0, epochs=-1, steps_per_epoch=3), "epochs must be a positive int"),
    (dict(max_lr=1.0, epochs=2, steps_per_epoch=0), "steps_per_epoch must be"),
    (dict(max_lr=1.0, total_steps=10, pct_start=1.5), "pct_start"),
    (dict(max_lr=1.0, total_steps=10, pct_start=-0.1), "pct_start"),
    (dict(max_lr=1.0, total_steps=10, anneal_strategy="exp"), "anneal_strategy"),
    (dict(max_lr=1.0, total_steps=10, div_factor=0), "div_factor"),
    (dict(max_lr=1.0, total_steps=10, final_div_factor=-2.0), "final_div_factor"),
    (dict(max_lr=-1.0, total_steps=10), "max_lr must be >= 0"),
    (dict(max_lr=[1.0, 2.0], total_steps=10), "2 values but the optimizer has 1"),
    (dict(max_lr=1.0, total_steps=10, base_momentum=[0.8, 0.9]), "base_momentum has 2"),
    (dict(max_lr=1.0, total_steps=10, max_momentum=-0.5), "momenta must be >= 0"),
    # torch divides by zero in these two: the warm-up, or the last phase, has no length
    (dict(max_lr=1.0, total_steps=10, pct_start=0.1), "no length"),
    (dict(max_lr=1.0, total_steps=10, pct_start=1.0), "no length"),
])
def test_one_cycle_bad_arguments(kwargs, match):
    opt = _sgd()
    before = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match=match):
        lr_scheduler.OneCycleLR(opt, **kwargs)
    assert opt.param_groups == before  # checked before any group was touched


def test_one_cycle_needs_momentum_or_betas_to_cycle():
    from mpitensor.optim import Adagrad

    opt = Adagrad([Parameter(mt.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10, cycle_momentum=False)
    assert sched.get_last_lr() == [pytest.approx(0.04, rel=1e-14)]


# ---- LambdaLR with stateful callables ---------------------------------------------------------

class _Warmup:
    """A callable object with state, which LambdaLR's state dict carries (functions are not)."""

    def __init__(self, steps):
        self.steps = steps
        self.calls = 0

    def __call__(self, epoch):
        self.calls += 1
        return min(1.0, (epoch + 1) / self.steps)


def test_lambda_lr_saves_callable_objects_not_functions():
    fns = [_Warmup(4), lambda e: 0.9 ** e, _Warmup(7)]
    tfns = [_Warmup(4), lambda e: 0.9 ** e, _Warmup(7)]
    opt, sched = _ours("LambdaLR", dict(lr_lambda=fns))
    _, tsched = _theirs("LambdaLR", dict(lr_lambda=tfns))
    for _ in range(5):
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == tsched.get_last_lr()
    sd, tsd = sched.state_dict(), tsched.state_dict()
    assert sd["lr_lambdas"] == tsd["lr_lambdas"] == [{"steps": 4, "calls": 6}, None,
                                                   {"steps": 7, "calls": 6}]
    # a fresh scheduler with fresh objects gets the objects' state back; the dict is unchanged
    fresh = [_Warmup(1), lambda e: 0.9 ** e, _Warmup(1)]
    opt2, sched2 = _ours("LambdaLR", dict(lr_lambda=fresh))
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sd)
    assert "lr_lambdas" in sd and fresh[0].steps == 4 and fresh[2].steps == 7
    assert sched2.lr_lambdas[1] is fresh[1] and sched2.last_epoch == 5
    for _ in range(5):
        sched.step()
        sched2.step()
        assert sched2.get_last_lr() == sched.get_last_lr()


def test_lambda_lr_bad_arguments():
    opt = _sgd(groups=2)
    with pytest.raises(ValueError, match="3 lr_lambdas for 2 parameter groups"):
        lr_scheduler.LambdaLR(opt, [lambda e: 1.0] * 3)
    with pytest.raises(TypeError, match="not callable"):
        lr_scheduler.LambdaLR(opt, [lambda e: 1.0, 0.5])
    with pytest.raises(TypeError, match="not an Optimizer"):
        lr_scheduler.LambdaLR(object(), lambda e: 1.0)


def test_exponential_and_cosine_bad_arguments():
    opt = _sgd()
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        lr_scheduler.ExponentialLR(opt, gamma=-0.5)
    with pytest.raises(ValueError, match="NaN"):
        lr_scheduler.ExponentialLR(opt, gamma=float("nan"))
    with pytest.raises(TypeError, match="gamma must be a number"):
        lr_scheduler.ExponentialLR(opt, gamma="0.5")
    with pytest.raises(ValueError, match="T_max"):
        lr_scheduler.CosineAnnealingLR(opt, T_max=0)
    with pytest.raises(TypeError, match="eta_min must be a number"):
        lr_scheduler.CosineAnnealingLR(opt, T_max=5, eta_min=None)


# ---- ReduceLROnPlateau --------------------------------------------------------------------------

# a loss that improves, stalls, wobbles within the threshold, improves again and then stalls
METRICS = [5.0, 4.0, 4.0, 3.9999, 4.2, 4.1, 3.0, 3.0, 3.0, 3.0, 2.99, 2.995, 3.5, 3.2, 3.1, 3.1,
           3.1, 1.0, 1.0, 1.2, 1.1, 1.3, 1.0005, 0.99999, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]

PLATEAUS = [
    dict(),
    dict(patience=0),
    dict(patience=2, factor=0.5),
    dict(patience=1, factor=0.5, cooldown=2),
    dict(patience=1, threshold=0.1, threshold_mode="abs"),
    dict(patience=1, factor=0.3, min_lr=[0.05, 0.01, 0.02]),
    dict(patience=0, factor=0.5, min_lr=0.2, eps=0.05),
    dict(mode="max", patience=1, factor=0.5),
    dict(mode="max", patience=2, threshold=0.05, threshold_mode="abs", cooldown=1),
]


def _plateau_pair(kw):
    opt = SGD([{"params": [Parameter(mt.zeros(1))], "lr": lr} for lr in LRS], lr=LRS[0])
    topt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr}
                            for lr in LRS], lr=LRS[0])
    return (opt, lr_scheduler.ReduceLROnPlateau(opt, **kw),
            topt, torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kw))


@pytest.mark.parametrize("kw", PLATEAUS, ids=_kw_id)
def test_plateau_same_rates_every_step(kw):
    opt, sched, topt, tsched = _plateau_pair(kw)
    assert sched.get_last_lr() == tsched.get_last_lr() == list(LRS)
    metrics = METRICS if kw.get("mode") != "max" else [-m for m in METRICS]
    for i, m in enumerate(metrics):
        if i % 2:  # a 0-d tensor metric works as well as a number
            sched.step(mt.tensor(m, dtype=mt.float64))
            tsched.step(torch.tensor(m, dtype=torch.float64))
        else:
            sched.step(m)
            tsched.step(m)
        assert sched.get_last_lr() == tsched.get_last_lr(), i
        assert [g["lr"] for g in opt.param_groups] == sched.get_last_lr()
        assert (sched.best, sched.num_bad_epochs, sched.cooldown_counter, sched.last_epoch) == \
            (tsched.best, tsched.num_bad_epochs, tsched.cooldown_counter, tsched.last_epoch), i
    assert sched.get_last_lr() != list(LRS)  # the sequence did cut the rates


@pytest.mark.parametrize("kw", PLATEAUS[2:6], ids=_kw_id)
def test_plateau_state_dict_round_trip_and_torch_dicts(tmp_path, kw):
    opt, sched, topt, tsched = _plateau_pair(kw)
    for m in METRICS[:12]:
        sched.step(m)
        tsched.step(m)
    ours, theirs = sched.state_dict(), tsched.state_dict()
    assert "optimizer" not in ours and set(ours) <= set(theirs)
    for key, value in ours.items():
        assert value == theirs[key], key
    path = tmp_path / "ckpt.mt"
    mt.save({"optimizer": opt.state_dict(), "scheduler": ours}, str(path))
    ckpt = mt.load(str(path))
    opt2, sched2, _, _ = _plateau_pair(kw)
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    opt3, sched3, _, _ = _plateau_pair(kw)  # and one resumed from torch's own state dict
    opt3.load_state_dict(ckpt["optimizer"])
    sched3.load_state_dict(tsched.state_dict())
    for m in METRICS[12:]:
        for s in (sched2, sched3, tsched):
            s.step(m)
        assert sched2.get_last_lr() == sched3.get_last_lr() == tsched.get_last_lr()


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="lowest"), "mode must be 'min'"),
    (dict(threshold_mode="relative"), "threshold_mode"),
    (dict(factor=1.0), "factor"),
    (dict(factor=-0.1), "factor"),
    (dict(patience=-1), "patience"),
    (dict(patience=2.5), "patience"),
    (dict(cooldown=-3), "cooldown"),
    (dict(min_lr=-0.1), "min_lr must be >= 0"),
    (dict(min_lr=[0.1, 0.2]), "min_lr has 2 values but the optimizer has 3"),
    (dict(eps=-1e-8), "eps"),
])
def test_plateau_bad_arguments(kwargs, match):
    opt = SGD([{"params": [Parameter(mt.zeros(1))], "lr": lr} for lr in LRS], lr=LRS[0])
    with pytest.raises(ValueError, match=match):
        lr_scheduler.ReduceLROnPlateau(opt, **kwargs)
    sched = lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(TypeError, match="metric as a number"):
        sched.step("low")
    with pytest.raises(TypeError, match="not an Optimizer"):
        lr_scheduler.ReduceLROnPlateau(object())


def test_signatures_match_torch():
    import inspect

    for name in ("ExponentialLR", "CosineAnnealingLR", "LambdaLR", "OneCycleLR",
                 "ReduceLROnPlateau"):
        assert name in lr_scheduler.__all__
        ours = inspect.signature(getattr(lr_scheduler, name).__init__).parameters.values()
        theirs = inspect.signature(
            getattr(torch.optim.lr_scheduler, name).__init__).parameters.values()
        assert [(p.name, p.kind, p.default) for p in ours] == \
            [(p.name, p.kind, p.default) for p in theirs], name


# ---- CosineAnnealingWarmRestarts with fractional epochs ----------------------------------------

@pytest.mark.parametrize("kw", [dict(T_0=3), dict(T_0=2, T_mult=2, eta_min=0.01),
                                dict(T_0=4, T_mult=3)], ids=_kw_id)
def test_warm_restarts_fractional_epochs_like_torch(kw):
    opt, sched = _ours("CosineAnnealingWarmRestarts", kw)
    topt, tsched = _theirs("CosineAnnealingWarmRestarts", kw)
    batches = 7
    for epoch in range(20):
        for b in range(batches):
            sched.step(epoch + b / batches)
            tsched.step(epoch + b / batches)
            assert sched.get_last_lr() == tsched.get_last_lr(), (epoch, b)
            assert (sched.T_cur, sched.T_i, sched.last_epoch) == \
                (tsched.T_cur, tsched.T_i, tsched.last_epoch)
    ours, theirs = sched.state_dict(), tsched.state_dict()
    assert set(ours) <= set(theirs)
    assert all(ours[k] == theirs[k] for k in ours)
    # and back to whole epochs: the period bookkeeping continues as torch's does
    for _ in range(15):
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == tsched.get_last_lr()


def test_warm_restarts_bad_arguments_like_torch():
    for kw in (dict(T_0=0), dict(T_0=2.5), dict(T_0=3, T_mult=0), dict(T_0=3, T_mult=1.5),
               dict(T_0=3, eta_min="0")):
        with pytest.raises(Exception) as theirs:
            _theirs("CosineAnnealingWarmRestarts", kw)
        with pytest.raises(theirs.type):
            _ours("CosineAnnealingWarmRestarts", kw)
    _, sched = _ours("CosineAnnealingWarmRestarts", dict(T_0=3))
    _, tsched = _theirs("CosineAnnealingWarmRestarts", dict(T_0=3))
    with pytest.raises(ValueError):
        tsched.step(-1)
    with pytest.raises(ValueError, match="epochs are >= 0"):
        sched.step(-1)


# ---- CyclicLR: momentum, betas, custom scale functions ------------------------------------------

class _Decay:
    """A callable scale_fn object with state, which CyclicLR's state dict carries."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, x):
        return self.rate ** x


@pytest.mark.parametrize("mode", ["triangular", "triangular2", "exp_range"])
def test_cyclic_cycles_sgd_momentum_like_torch(mode):
    kw = dict(base_lr=[0.01, 0.02, 0.03], max_lr=0.5, step_size_up=3, step_size_down=5,
              mode=mode, gamma=0.95, base_momentum=[0.8, 0.7, 0.85], max_momentum=0.95)
    opt, sched = _ours("CyclicLR", kw)
    topt, tsched = _theirs("CyclicLR", kw)
    for step in range(30):
        assert sched.get_last_lr() == tsched.get_last_lr(), step
        for key in ("momentum", "max_momentum", "base_momentum", "initial_lr"):
            assert [g[key] for g in opt.param_groups] == [g[key] for g in topt.param_groups]
        sched.step()
        tsched.step()


def test_cyclic_drives_adam_beta1_like_torch():
    import numpy as np

    from mpitensor.optim import Adam

    rng = np.random.default_rng(5)
    x0 = rng.standard_normal(5)
    p = Parameter(mt.tensor(x0.copy()))
    r = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    opt, topt = Adam([p], lr=0.01), torch.optim.Adam([r], lr=0.01)
    kw = dict(base_lr=0.001, max_lr=0.05, step_size_up=4, base_momentum=0.85,
              max_momentum=0.95)
    sched = lr_scheduler.CyclicLR(opt, **kw)
    tsched = torch.optim.lr_scheduler.CyclicLR(topt, **kw)
    assert sched.use_beta1 and opt.param_groups[0]["betas"] == topt.param_groups[0]["betas"]
    for _ in range(20):
        g = rng.standard_normal(5)
        p.grad, r.grad = mt.tensor(g), torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert opt.param_groups[0]["betas"] == topt.param_groups[0]["betas"]
        assert sched.get_last_lr() == tsched.get_last_lr()
    np.testing.assert_allclose(p._data, r.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_cyclic_state_dict_keeps_a_callable_scale_fn_like_torch():
    kw = dict(base_lr=0.01, max_lr=0.3, step_size_up=3, scale_mode="iterations")
    opt, sched = _ours("CyclicLR", dict(kw, scale_fn=_Decay(0.9)))
    _, tsched = _theirs("CyclicLR", dict(kw, scale_fn=_Decay(0.9)))
    for _ in range(5):
        sched.step()
        tsched.step()
    ours, theirs = sched.state_dict(), tsched.state_dict()
    assert ours["_scale_fn_custom"] == theirs["_scale_fn_custom"] == {"rate": 0.9}
    assert "_scale_fn_ref" not in ours
    assert set(ours) <= set(theirs) and all(ours[k] == theirs[k] for k in ours)
    fresh = _Decay(0.1)
    opt2, sched2 = _ours("CyclicLR", dict(kw, scale_fn=fresh))
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(theirs)
    assert fresh.rate == 0.9
    for _ in range(8):
        sched2.step()
        tsched.step()
        assert sched2.get_last_lr() == tsched.get_last_lr()
    # a plain function is not stored (it does not pickle reliably), in either library
    _, fsched = _ours("CyclicLR", dict(kw, scale_fn=lambda x: 0.5))
    assert fsched.state_dict()["_scale_fn_custom"] is None


@pytest.mark.parametrize("kwargs", [
    dict(base_lr=0.1, max_lr=1.0, mode="sawtooth"),
    dict(base_lr=[0.1, 0.2], max_lr=1.0),
    dict(base_lr=0.1, max_lr=[1.0, 2.0]),
], ids=_kw_id)
def test_cyclic_bad_arguments_like_torch(kwargs):
    with pytest.raises(Exception) as theirs:
        _theirs("CyclicLR", kwargs)
    with pytest.raises(theirs.type):
        _ours("CyclicLR", kwargs)


def test_cyclic_momentum_needs_momentum_or_betas_like_torch():
    from mpitensor.optim import Adagrad

    with pytest.raises(ValueError):
        torch.optim.lr_scheduler.CyclicLR(
            torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))]), 0.1, 1.0)
    opt = Adagrad([Parameter(mt.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        lr_scheduler.CyclicLR(opt, 0.1, 1.0)
    lr_scheduler.CyclicLR(opt, 0.1, 1.0, cycle_momentum=False)


@pytest.mark.parametrize("name, kwargs", [
    ("LinearLR", dict(start_factor=0.0)), ("LinearLR", dict(start_factor=1.5)),
    ("LinearLR", dict(end_factor=-0.1)), ("LinearLR", dict(end_factor=1.1)),
    ("ConstantLR", dict(factor=1.5)), ("ConstantLR", dict(factor=-0.5)),
], ids=lambda v: v if isinstance(v, str) else _kw_id(v))
def test_warmup_bad_arguments_like_torch(name, kwargs):
    with pytest.raises(Exception) as theirs:
        _theirs(name, kwargs)
    with pytest.raises(theirs.type):
        _ours(name, kwargs)


# ---- SequentialLR and ChainedScheduler -------------------------------------------------------

def _parts(lib, opt, which):
    ls = lib.optim.lr_scheduler if lib is torch else lr_scheduler
    if which == "warmup-cosine":
        return [ls.LinearLR(opt, start_factor=0.1, total_iters=4),
                ls.CosineAnnealingLR(opt, T_max=20, eta_min=0.001)], [4]
    if which == "constant-exp-step":
        return [ls.ConstantLR(opt, factor=0.5, total_iters=3), ls.ExponentialLR(opt, 0.9),
                ls.StepLR(opt, step_size=3, gamma=0.5)], [3, 9]
    if which == "poly-restarts":
        return [ls.PolynomialLR(opt, total_iters=6, power=2.0),
                ls.CosineAnnealingWarmRestarts(opt, T_0=4, T_mult=2)], [5]
    if which == "nested-sequential":
        inner = ls.SequentialLR(opt, [ls.ConstantLR(opt, factor=0.5, total_iters=2),
                                      ls.ExponentialLR(opt, 0.9)], milestones=[2])
        return [inner, ls.StepLR(opt, step_size=2, gamma=0.5)], [5]
    if which == "chained-in-sequential":
        inner = ls.ChainedScheduler([ls.ConstantLR(opt, factor=0.5, total_iters=2),
                                     ls.ExponentialLR(opt, 0.9)])
        return [inner, ls.CosineAnnealingLR(opt, T_max=6)], [7]
    return [ls.ExponentialLR(opt, 0.95), ls.StepLR(opt, step_size=4, gamma=0.3),
            ls.LinearLR(opt, start_factor=0.5, total_iters=6)], None


def _combo(lib, kind, which):
    if lib is torch:
        opt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr}
                               for lr in LRS], lr=LRS[0])
        ls = torch.optim.lr_scheduler
    else:
        opt = SGD([{"params": [Parameter(mt.zeros(1))], "lr": lr} for lr in LRS], lr=LRS[0])
        ls = lr_scheduler
    parts, milestones = _parts(lib, opt, which)
    if kind == "SequentialLR":
        return opt, ls.SequentialLR(opt, parts, milestones=milestones)
    return opt, ls.ChainedScheduler(parts)


COMBOS = [("SequentialLR", "warmup-cosine"), ("SequentialLR", "constant-exp-step"),
          ("SequentialLR", "poly-restarts"), ("ChainedScheduler", "chain"),
          ("SequentialLR", "nested-sequential"), ("SequentialLR", "chained-in-sequential")]


def _same_state(ours, theirs):
    assert set(ours) <= set(theirs)
    for key, value in ours.items():
        if key == "_schedulers":
            assert len(value) == len(theirs[key])
            for a, b in zip(value, theirs[key]):
                _same_state(a, b)
        else:
            assert value == theirs[key], key


@pytest.mark.parametrize("kind, which", COMBOS)
def test_combined_schedules_match_torch(tmp_path, kind, which):
    opt, sched = _combo(mt, kind, which)
    topt, tsched = _combo(torch, kind, which)
    assert sched.get_last_lr() == tsched.get_last_lr()
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
    for step in range(30):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == tsched.get_last_lr(), step
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
        if step == 12:
            _same_state(sched.state_dict(), tsched.state_dict())
            path = tmp_path / "ckpt.mt"
            mt.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, str(path))
    # resume from our checkpoint (written at step 12) and from torch's dict: both continue as
    # torch does
    for source in ("ours", "torch"):
        _, tref = _combo(torch, kind, which)
        topt2 = tref.optimizer
        for _ in range(13):
            topt2.step()
            tref.step()
        opt2, sched2 = _combo(mt, kind, which)
        ckpt = mt.load(str(path))
        opt2.load_state_dict(ckpt["optimizer"])
        sched2.load_state_dict(ckpt["scheduler"] if source == "ours" else tref.state_dict())
        for step in range(15):
            sched2.step()
            tref.step()
            assert sched2.get_last_lr() == tref.get_last_lr(), (source, step)


def test_combined_schedules_bad_arguments_like_torch():
    def both(build):
        with pytest.raises(Exception) as theirs:
            build(torch, torch.optim.lr_scheduler)
        with pytest.raises(theirs.type):
            build(mt, lr_scheduler)

    def opt_of(lib):
        if lib is torch:
            return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        return SGD([Parameter(mt.zeros(1))], lr=0.1)

    both(lambda lib, ls: ls.SequentialLR(opt_of(lib), [], milestones=[]))
    both(lambda lib, ls: ls.ChainedScheduler([]))

    def wrong_milestones(lib, ls):
        o = opt_of(lib)
        return ls.SequentialLR(o, [ls.ConstantLR(o), ls.ExponentialLR(o, 0.9)], milestones=[])

    def other_optimizer(lib, ls):
        o = opt_of(lib)
        return ls.SequentialLR(o, [ls.ConstantLR(o), ls.ExponentialLR(opt_of(lib), 0.9)], [2])

    def with_plateau(lib, ls):
        o = opt_of(lib)
        return ls.ChainedScheduler([ls.ConstantLR(o), ls.ReduceLROnPlateau(o)])

    def not_a_scheduler(lib, ls):
        o = opt_of(lib)
        return ls.SequentialLR(o, [ls.ConstantLR(o), object()], [2])

    for build in (wrong_milestones, other_optimizer, with_plateau, not_a_scheduler):
        both(build)


def test_new_signatures_match_torch():
    import inspect

    for name in ("LinearLR", "ConstantLR", "PolynomialLR", "CosineAnnealingWarmRestarts",
                 "CyclicLR", "SequentialLR", "ChainedScheduler", "MultiplicativeLR"):
        assert name in lr_scheduler.__all__
        ours = inspect.signature(getattr(lr_scheduler, name).__init__).parameters.values()
        theirs = inspect.signature(
            getattr(torch.optim.lr_scheduler, name).__init__).parameters.values()
        assert [(p.name, p.kind, p.default) for p in ours] == \
            [(p.name, p.kind, p.default) for p in theirs], name
