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
]
IDS = [f"{name}-{kw}" for name, kw in SCHEDULES]


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
