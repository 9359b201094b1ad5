"""mpitensor.optim.swa_utils (AveragedModel, SWALR, update_bn, the averaging functions) against
torch.optim.swa_utils.

The same small model (Linear, BatchNorm1d, Linear) is built in both libraries with the same
weights; both are trained with the same gradients (computed here with NumPy from each library's
own current weights, so a difference compounds) and averaged after each step. The averaged
weights, buffers and state dicts are compared in float64 at 1e-10 relative; the rates of SWALR
exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import optim
from mpitensor.nn import Parameter
from mpitensor.optim import swa_utils

torch = pytest.importorskip("torch", reason="torch is the oracle these tests compare with")

pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")

TOL = dict(rtol=1e-10, atol=1e-12)


def _models():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                             torch.nn.Linear(4, 2)).double()
    mm = mt.nn.Sequential(mt.nn.Linear(3, 4), mt.nn.BatchNorm1d(4), mt.nn.Linear(4, 2))
    mm = mm.to(mt.float64)
    with mt.no_grad():
        for (_, p), (_, tp) in zip(mm.named_parameters(), tm.named_parameters()):
            p._data[...] = tp.detach().numpy()
    return mm, tm


def _train_step(mm, tm, opt, topt, rng):
    for p, tp in zip(mm.parameters(), tm.parameters()):
        noise = rng.standard_normal(p.shape)
        p.grad = mt.tensor(np.sin(p._data) + noise)
        tp.grad = torch.from_numpy(np.sin(tp.detach().numpy()) + noise)
    opt.step()
    topt.step()
    x = rng.standard_normal((8, 3))
    mm(mt.tensor(x))  # a forward in train mode moves the batch-norm buffers
    tm(torch.from_numpy(x))


def _averagers(kind):
    if kind == "swa":
        return {}, {}
    if kind == "ema":
        return (dict(avg_fn=swa_utils.get_ema_avg_fn(0.9)),
                dict(avg_fn=torch.optim.swa_utils.get_ema_avg_fn(0.9)))
    if kind == "ema_multi":
        return (dict(multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.8)),
                dict(multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.8)))
    if kind == "swa_multi":
        return (dict(multi_avg_fn=swa_utils.get_swa_multi_avg_fn()),
                dict(multi_avg_fn=torch.optim.swa_utils.get_swa_multi_avg_fn()))
    return dict(use_buffers=True), dict(use_buffers=True)


def _same_state(avg, tavg):
    sd, tsd = avg.state_dict(), tavg.state_dict()
    assert list(sd) == list(tsd)
    for key, tv in tsd.items():
        v = sd[key]
        assert v.shape == tuple(tv.shape), key
        np.testing.assert_allclose(np.asarray(v._data), tv.numpy(), **TOL, err_msg=key)


@pytest.mark.parametrize("kind", ["swa", "ema", "ema_multi", "swa_multi", "buffers"])
def test_averaged_model_matches_torch(kind):
    rng = np.random.default_rng(1)
    mm, tm = _models()
    kw, tkw = _averagers(kind)
    avg = swa_utils.AveragedModel(mm, **kw)
    tavg = torch.optim.swa_utils.AveragedModel(tm, **tkw)
    opt = optim.SGD(mm.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    for step in range(8):
        _train_step(mm, tm, opt, topt, rng)
        if step >= 2:
            avg.update_parameters(mm)
            tavg.update_parameters(tm)
    assert int(avg.n_averaged) == int(tavg.n_averaged) == 6
    _same_state(avg, tavg)
    # the averaged model runs like torch's (eval mode: the running statistics)
    x = rng.standard_normal((5, 3))
    avg.eval()
    tavg.eval()
    np.testing.assert_allclose(avg(mt.tensor(x))._data,
                               tavg(torch.from_numpy(x)).detach().numpy(), **TOL)
    # its state dict loads into torch's AveragedModel and back
    fresh = torch.optim.swa_utils.AveragedModel(_models()[1])
    fresh.load_state_dict({k: torch.from_numpy(np.array(v._data))
                           for k, v in avg.state_dict().items()})
    _same_state(avg, fresh)


def test_update_bn_matches_torch():
    rng = np.random.default_rng(2)
    mm, tm = _models()
    avg, tavg = swa_utils.AveragedModel(mm), torch.optim.swa_utils.AveragedModel(tm)
    opt = optim.SGD(mm.parameters(), lr=0.1)
    topt = torch.optim.SGD(tm.parameters(), lr=0.1)
    for _ in range(4):
        _train_step(mm, tm, opt, topt, rng)
        avg.update_parameters(mm)
        tavg.update_parameters(tm)
    batches = [rng.standard_normal((6, 3)) for _ in range(5)]
    avg.eval()
    tavg.eval()
    # batches as Tensors and as (input, target) pairs, as a DataLoader gives them
    swa_utils.update_bn([mt.tensor(b) if i % 2 else (mt.tensor(b), 0)
                         for i, b in enumerate(batches)], avg)
    torch.optim.swa_utils.update_bn([torch.from_numpy(b) for b in batches], tavg)
    assert not avg.training and not tavg.training
    bn, tbn = avg.module[1], tavg.module[1]
    assert bn.momentum == tbn.momentum == 0.1
    np.testing.assert_allclose(bn.running_mean._data, tbn.running_mean.numpy(), **TOL)
    np.testing.assert_allclose(bn.running_var._data, tbn.running_var.numpy(), **TOL)
    assert int(bn.num_batches_tracked) == int(tbn.num_batches_tracked) == 5
    swa_utils.update_bn([mt.ones(2, 3)], mt.nn.Linear(3, 1))  # no batch norm: nothing to do


def test_averaging_functions_match_torch():
    rng = np.random.default_rng(3)
    a, c = rng.standard_normal(5), rng.standard_normal(5)
    for decay in (0.0, 0.3, 0.999, 1.0):
        ours = swa_utils.get_ema_avg_fn(decay)(mt.tensor(a), mt.tensor(c), 3)
        theirs = torch.optim.swa_utils.get_ema_avg_fn(decay)(
            torch.from_numpy(a), torch.from_numpy(c), 3)
        np.testing.assert_allclose(ours._data, theirs.numpy(), **TOL)
    n = torch.tensor(4)
    np.testing.assert_allclose(
        swa_utils.get_swa_avg_fn()(mt.tensor(a), mt.tensor(c), mt.tensor(4))._data,
        torch.optim.swa_utils.get_swa_avg_fn()(torch.from_numpy(a), torch.from_numpy(c),
                                               n).numpy(), **TOL)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            torch.optim.swa_utils.get_ema_multi_avg_fn(bad)
        with pytest.raises(ValueError):
            swa_utils.get_ema_multi_avg_fn(bad)
        with pytest.raises(ValueError):
            swa_utils.get_ema_avg_fn(bad)


LRS = (1.0, 0.3, 0.07)


def _sched_pair(kw):
    opt = optim.SGD([{"params": [Parameter(mt.zeros(1))], "lr": lr} for lr in LRS], lr=1.0)
    topt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr}
                            for lr in LRS], lr=1.0)
    return (opt, swa_utils.SWALR(opt, **kw), topt, torch.optim.swa_utils.SWALR(topt, **kw))


SWALRS = [dict(swa_lr=0.05), dict(swa_lr=[0.5, 0.01, 0.2], anneal_epochs=4),
          dict(swa_lr=0.02, anneal_epochs=7, anneal_strategy="linear"),
          dict(swa_lr=0.1, anneal_epochs=0), dict(swa_lr=0.1, anneal_epochs=1,
                                                  anneal_strategy="linear")]


@pytest.mark.parametrize("kw", SWALRS, ids=[str(k) for k in SWALRS])
def test_swalr_same_rates_and_state_as_torch(tmp_path, kw):
    opt, sched, topt, tsched = _sched_pair(kw)
    assert [g["swa_lr"] for g in opt.param_groups] == [g["swa_lr"] for g in topt.param_groups]
    for step in range(15):
        assert sched.get_last_lr() == tsched.get_last_lr(), step
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        if step == 5:
            ours, theirs = sched.state_dict(), tsched.state_dict()
            assert set(ours) <= set(theirs)
            assert all(ours[k] == theirs[k] for k in ours)
            path = tmp_path / "ckpt.mt"
            mt.save({"optimizer": opt.state_dict(), "scheduler": ours}, str(path))
    ckpt = mt.load(str(path))
    opt2, sched2, _, _ = _sched_pair(kw)
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    _, _, topt3, tsched3 = _sched_pair(kw)
    for _ in range(6):  # where the checkpoint was taken
        topt3.step()
        tsched3.step()
    for _ in range(8):
        sched2.step()
        tsched3.step()
        assert sched2.get_last_lr() == tsched3.get_last_lr()


@pytest.mark.parametrize("kw", [dict(swa_lr=0.1, anneal_strategy="exp"),
                                dict(swa_lr=0.1, anneal_epochs=-1),
                                dict(swa_lr=0.1, anneal_epochs=2.5),
                                dict(swa_lr=[0.1, 0.2])], ids=str)
def test_swalr_bad_arguments_like_torch(kw):
    with pytest.raises(Exception) as theirs:
        torch.optim.swa_utils.SWALR(torch.optim.SGD(
            [{"params": [torch.nn.Parameter(torch.zeros(1))]} for _ in LRS], lr=1.0), **kw)
    with pytest.raises(theirs.type):
        swa_utils.SWALR(optim.SGD([{"params": [Parameter(mt.zeros(1))]} for _ in LRS],
                                  lr=1.0), **kw)


def test_names_and_signatures_match_torch():
    import inspect

    assert set(swa_utils.__all__) == set(torch.optim.swa_utils.__all__)
    for name in swa_utils.__all__:
        ours, theirs = getattr(swa_utils, name), getattr(torch.optim.swa_utils, name)
        if inspect.isclass(ours):
            ours, theirs = ours.__init__, theirs.__init__
        assert [(p.name, p.kind, p.default) for p in
                inspect.signature(ours).parameters.values()] == \
            [(p.name, p.kind, p.default) for p in
             inspect.signature(theirs).parameters.values()], name
