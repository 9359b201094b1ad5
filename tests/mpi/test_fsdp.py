"""fully_shard (FSDP2) at 1-4 ranks.

Spec: a model whose blocks and root are given to ``fully_shard`` trains for 20 steps to the
losses and weights of the same model under DDP (rtol 1e-5, float32), on every rank, with
uneven shards (dims smaller than the world included); each rank's parameters, gradients and
Adam state take 1/N of DDP's bytes (plus torch.chunk's padding); shards are torch.chunk's rows;
the next unit's gather is in flight during a forward and reduce-scatters are in flight before
backward ends; resharding returns the gathered memory; mixed precision gathers in bfloat16 and
reduces in float32; gradient accumulation without sync equals DDP's; the sharded state dict
round-trips; torch's FSDP2 over gloo gives the same losses; bad input fails on every rank.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_fsdp.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.distributed.fsdp as fsdp
import mpitensor.nn as nn
from mpitensor._base import config as _config
from mpitensor.distributed.device_mesh import init_device_mesh
from mpitensor.distributed.fsdp import FSDPModule, fully_shard
from mpitensor.distributed.tensor import DTensor, Shard
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.optim import SGD, Adam

from .sharded_models import DIMS, OPTIMIZERS, RTOL, STEPS, batch, mlp, torch_twin
from .torch_gloo import (
    to_torch,
    torch_gloo_fixture,  # noqa: F401 - the fixture torch_gloo
)

pytestmark = pytest.mark.mpi(min_size=1)


def _shard(model, **kw):
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    return model


def _step(model, opt, s, dims=DIMS):
    x, y = batch(s, dist.get_rank(), dims)
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return float(loss.item())


def _local(p):
    return p.to_local() if isinstance(p, DTensor) else p


def _full(p, d0):
    """The global tensor of a sharded parameter (gathered here with plain collectives)."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, _local(p).detach().numpy())
    out = np.concatenate(parts)
    assert out.shape[0] == d0
    return out


def _close(a, b, what, rtol=RTOL):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=0, err_msg=what)


def _close_tensor(a, b, what):
    """Weights: the ranks' float32 sums meet in another order under DDP's all_reduce than in
    a reduce_scatter, so elements near zero are compared relative to the tensor's largest."""
    np.testing.assert_allclose(a, b, rtol=0, atol=RTOL * float(np.abs(b).max()), err_msg=what)


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("opt_cls, kw", OPTIMIZERS)
def test_fully_shard_trains_like_ddp(reshard, opt_cls, kw):
    ref = DDP(mlp())
    ref_opt = opt_cls(ref.parameters(), **kw)
    model = _shard(mlp(), reshard_after_forward=reshard)
    opt = opt_cls(model.parameters(), **kw)
    for s in range(STEPS):
        _close(_step(model, opt, s), _step(ref, ref_opt, s), f"loss at step {s}")
    for (name, p), q in zip(model.named_parameters(), ref.module.parameters()):
        _close_tensor(_full(p, q.shape[0]), q.detach().numpy(), name)


def test_shards_are_torch_chunk_rows_and_registered_between_steps():
    n, r = dist.get_world_size(), dist.get_rank()
    plain = mlp()
    model = _shard(mlp())
    assert isinstance(model, FSDPModule) and isinstance(model[0], FSDPModule)
    assert isinstance(model, nn.Sequential)
    for p in model.parameters():  # Shard(0) DTensors with the global shape
        assert isinstance(p, DTensor) and isinstance(p, nn.Parameter)
        assert p.placements == (Shard(0),) and p.device_mesh.size() == dist.get_world_size()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        rows = -(-q.shape[0] // n)
        want = q.detach().numpy()[r * rows:(r + 1) * rows]
        np.testing.assert_array_equal(_local(p).detach().numpy(), want, err_msg=name)
    opt = Adam(model.parameters(), lr=0.01)
    _step(model, opt, 0)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        rows = -(-q.shape[0] // n)
        assert tuple(_local(p).shape)[0] == max(0, min(rows, q.shape[0] - r * rows)), name
        assert isinstance(p.grad, DTensor) and p.grad.placements == (Shard(0),), name
        assert tuple(p.grad.shape) == tuple(q.shape), name


def _bytes(t):
    t = _local(t)
    return t.numel() * t.element_size()


def test_memory_per_rank_is_one_nth_of_ddp():
    n = dist.get_world_size()
    dims = (64, 96, 96, 48)  # padding of torch.chunk's rows stays below 5 % at 1-4 ranks
    ref = DDP(mlp(1, dims))
    ref_opt = Adam(ref.parameters(), lr=0.01)
    model = _shard(mlp(1, dims))
    opt = Adam(model.parameters(), lr=0.01)
    _step(ref, ref_opt, 0, dims)
    _step(model, opt, 0, dims)

    def held(m, o):
        ps = list(m.parameters())
        state = sum(_bytes(v) for s in o.state.values() for k, v in s.items()
                    if k in ("exp_avg", "exp_avg_sq"))
        return sum(_bytes(p) for p in ps) + sum(_bytes(p.grad) for p in ps) + state

    mine, ddp = held(model, opt), held(ref, ref_opt)
    assert mine <= ddp / n * 1.05, (mine, ddp, n)
    everyone = [None] * n
    dist.all_gather_object(everyone, mine)
    assert sum(everyone) == ddp  # the shards add up to the whole, nothing held twice
    # between steps the gathered copies are returned: every unit is sharded
    for m in model.modules():
        if isinstance(m, FSDPModule) and m._fsdp_state.group is not None:
            assert not m._fsdp_state.group.is_unsharded


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def test_reshard_returns_the_gathered_memory_and_backward_regathers():
    layer = fully_shard(nn.Linear(1024, 4096))  # 16 MiB gathered
    layer.unshard()
    full_w = layer.weight.detach().numpy().copy()
    assert tuple(layer.weight.shape) == (4096, 1024)
    before = _rss_bytes()
    layer.reshard()
    after = _rss_bytes()
    assert before - after > 12 * 2 ** 20, (before, after)
    rows = -(-4096 // dist.get_world_size())
    assert tuple(_local(layer.weight).shape) == (min(rows, 4096 - dist.get_rank() * rows), 1024)
    # a unit whose forward freed it gathers again in backward: gradients are right
    ref = nn.Linear(1024, 4096)
    with mt.no_grad():
        ref.weight.copy_(mt.from_numpy(full_w))
        ref.bias.copy_(mt.from_numpy(_full(layer.bias, 4096)))
    outer = fully_shard(nn.Sequential(nn.Tanh(), layer))
    x = mt.from_numpy(np.random.default_rng(0).standard_normal((2, 1024)).astype(np.float32))
    outer(x).sum().backward()
    ref(mt.tanh(x)).sum().backward()
    _close(_full(layer.weight.grad, 4096), ref.weight.grad.detach().numpy(), "weight grad",
           rtol=1e-4)
    assert outer._fsdp_state is not None


def test_prefetch_and_overlap():
    model = _shard(mlp(2))
    opt = Adam(model.parameters(), lr=0.01)
    _step(model, opt, 0)  # the first forward records the order
    units = [m._fsdp_state for m in model if isinstance(m, FSDPModule)]
    in_flight = []
    model[0].register_forward_hook(
        lambda m, a, o: in_flight.append(units[1].group._gather is not None))
    x, y = batch(1, dist.get_rank())
    x.requires_grad_()
    pending = []
    x.register_hook(lambda g: pending.append(
        [u.group._reduce is not None for u in units]))
    ((model(x) - y) ** 2).mean().backward()
    assert in_flight == [True]  # the second unit's gather travelled during the first's forward
    # when the gradient reached the input, the later units' reductions were already started
    # (and not waited for): they overlap the rest of backward
    assert pending[0][1:] == [True, True]
    assert all(u.group._reduce is None for u in units)  # all waited for at the end


def test_gradient_accumulation_without_sync_equals_ddp():
    ref = DDP(mlp(3))
    model = _shard(mlp(3))
    accumulate_beside_ddp(model, ref)
    for (name, p), q in zip(model.named_parameters(), ref.module.parameters()):
        _close_tensor(_full(p, q.shape[0]), q.detach().numpy(), name)


def accumulate_beside_ddp(model, ref):
    """Three SGD steps of two micro-batches each: ``model`` (fully sharded) reduces only in
    the last backward (``set_requires_gradient_sync``), ``ref`` (DDP) under ``no_sync``
    before it (also used by test_hsdp)."""
    ref_opt = SGD(ref.parameters(), lr=0.05)
    opt = SGD(model.parameters(), lr=0.05)
    for s in range(3):
        for m, o, is_ref in ((ref, ref_opt, True), (model, opt, False)):
            o.zero_grad()
            for micro in range(2):
                last = micro == 1
                x, y = batch(10 * s + micro, dist.get_rank())
                if is_ref:
                    if last:
                        ((m(x) - y) ** 2).mean().backward()
                    else:
                        with m.no_sync():
                            ((m(x) - y) ** 2).mean().backward()
                else:
                    m.set_requires_gradient_sync(last)
                    ((m(x) - y) ** 2).mean().backward()
            o.step()


def test_mixed_precision_gathers_in_bf16_and_reduces_in_fp32():
    mp = fsdp.MixedPrecisionPolicy(param_dtype=mt.bfloat16, reduce_dtype=mt.float32,
                              output_dtype=mt.float32)
    model = _shard(mlp(4), mp_policy=mp)
    seen = []
    model[0].register_forward_pre_hook(lambda m, a: seen.append((m.weight.dtype, a[0].dtype)))
    opt = Adam(model.parameters(), lr=0.01)
    ref = DDP(mlp(4))
    ref_opt = Adam(ref.parameters(), lr=0.01)
    for s in range(3):
        # bfloat16 keeps 8 bits: the losses agree to a few of its units in the last place
        _close(_step(model, opt, s), _step(ref, ref_opt, s), f"loss at step {s}", rtol=3e-2)
    assert seen[0] == (mt.bfloat16, mt.bfloat16)
    assert model(batch(0, 0)[0]).dtype == mt.float32
    for p in model.parameters():
        assert p.dtype == mt.float32 and p.grad.dtype == mt.float32
        assert model[0]._fsdp_state.group.reduce_dtype == mt.float32


def test_cpu_offload_on_numpy_is_accepted_and_trains_the_same():
    ref = DDP(mlp(5))
    ref_opt = Adam(ref.parameters(), lr=0.01)
    model = _shard(mlp(5), offload_policy=fsdp.CPUOffloadPolicy())
    opt = Adam(model.parameters(), lr=0.01)
    for s in range(3):
        _close(_step(model, opt, s), _step(ref, ref_opt, s), f"loss at step {s}")
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_sharded_state_dict_round_trips():
    model = _shard(mlp(6))
    opt = Adam(model.parameters(), lr=0.01)
    _step(model, opt, 0)
    sd = model.state_dict()
    assert list(sd) == list(mlp(6).state_dict())
    for k, v in sd.items():
        np.testing.assert_array_equal(_local(v).detach().numpy(),
                                      _local(dict(model.named_parameters())[k]).detach().numpy())
    other = _shard(mlp(7))
    other.load_state_dict(sd)
    x, _ = batch(0, dist.get_rank())
    with mt.no_grad():
        np.testing.assert_array_equal(other(x).numpy(), model(x).numpy())
    # whole tensors load too: each rank keeps its rows
    third = _shard(mlp(8))
    third.load_state_dict({k: v.full_tensor() for k, v in sd.items()})
    with mt.no_grad():
        np.testing.assert_array_equal(third(x).numpy(), model(x).numpy())
    with pytest.raises(ValueError, match="'0.weight' has shape"):
        third.load_state_dict({**sd, "0.weight": mt.zeros(3, 3)})


def test_unshard_and_reshard_api():
    model = _shard(mlp(8))
    handle = model[0].unshard(async_op=True)
    handle.wait()
    assert tuple(model[0].weight.shape) == (16, 6)
    model[0].reshard()
    n = dist.get_world_size()
    rows = -(-16 // n)
    assert tuple(_local(model[0].weight).shape)[0] == min(rows,
                                                          max(0, 16 - dist.get_rank() * rows))


def test_bad_input_fails_before_any_gather():
    with pytest.raises(TypeError, match="nn.Module"):
        fully_shard(42)
    with pytest.raises(TypeError, match="MixedPrecisionPolicy"):
        fully_shard(nn.Linear(2, 2), mp_policy="bf16")
    with pytest.raises(NotImplementedError, match="shard_placement_fn"):
        fully_shard(nn.Linear(2, 2), shard_placement_fn=lambda p: None)
    m = fully_shard(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="already fully sharded"):
        fully_shard(m)
    with pytest.raises(ValueError, match="device type 'cuda'"):
        fully_shard(nn.Linear(2, 2), mesh=init_device_mesh("cuda", (dist.get_world_size(),)))
    with pytest.raises(ValueError, match="has 3 dimensions"):  # 2-D is HSDP: test_hsdp.py
        fully_shard(nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1, 1, dist.get_world_size())))
    scalar = nn.Module()
    scalar.s = nn.Parameter(mt.tensor(1.0))
    with pytest.raises(ValueError, match="0-dimensional"):
        fully_shard(scalar)


@pytest.mark.mpi(min_size=2)
def test_values_that_differ_across_ranks_keep_each_ranks_rows_as_torch(torch_gloo):
    """torch keeps each rank's rows of its own tensor (fsdp_tp_example builds its model
    without a seed); so do we, unless MPITENSOR_DEBUG=1 (next test)."""
    torch = torch_gloo
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    mt.manual_seed(dist.get_rank())  # each rank its own initial weights
    ours = mlp(9)
    own = [p.detach().numpy().copy() for p in ours.parameters()]
    theirs = torch_twin(ours, torch)
    torch_fully_shard(theirs)
    fully_shard(ours)
    for (name, p), q, mine in zip(ours.named_parameters(), theirs.parameters(), own):
        rows = -(-mine.shape[0] // dist.get_world_size())
        start = min(dist.get_rank() * rows, mine.shape[0])
        np.testing.assert_array_equal(_local(p).detach().numpy(), mine[start:start + rows],
                                      err_msg=name)
        np.testing.assert_array_equal(_local(p).detach().numpy(),
                                      q.to_local().detach().numpy(), err_msg=name)
    train_beside_torch(ours, theirs, torch, steps=2)


@pytest.mark.mpi(min_size=2)
def test_parameters_that_differ_across_ranks_fail_on_every_rank(monkeypatch):
    mt.manual_seed(0)
    width = 5 if dist.get_rank() == 1 else 4  # shapes must agree in either mode
    with pytest.raises(ValueError, match=r"\(shape, dtype\)s differ across ranks.*rank \d"):
        fully_shard(nn.Linear(width, 3))
    monkeypatch.setattr(_config, "DEBUG", True)  # as MPITENSOR_DEBUG=1 sets it at import
    mt.manual_seed(dist.get_rank())  # each rank its own initial weights
    with pytest.raises(ValueError, match=r"differ across ranks.*rank \d.*MPITENSOR_DEBUG=1"):
        fully_shard(nn.Linear(4, 3))
    mt.manual_seed(0)
    with pytest.raises(ValueError, match="checksum.*differ across ranks"):
        fully_shard(nn.Linear(width, 3))
    mt.manual_seed(0)
    fully_shard(nn.Linear(4, 3))  # alike everywhere: accepted


def test_losses_match_torch_fsdp2(torch_gloo):
    torch = torch_gloo
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    ours = mlp(9)
    theirs = torch_twin(ours, torch)
    for m in theirs:
        if isinstance(m, torch.nn.Linear):
            torch_fully_shard(m)
    torch_fully_shard(theirs)
    _shard(ours)
    train_beside_torch(ours, theirs, torch)


def train_beside_torch(ours, theirs, torch, steps=5, what=""):
    """Check that both sharded models hold the same pieces and placements, then train both
    with Adam for ``steps`` steps, comparing the losses (also used by test_hsdp)."""
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert [str(x) for x in p.placements] == [str(x) for x in q.placements], name
        np.testing.assert_array_equal(_local(p).detach().numpy(), q.to_local().detach().numpy(),
                                      err_msg=what + name)
    opt = Adam(ours.parameters(), lr=0.01)
    topt = torch.optim.Adam(theirs.parameters(), lr=0.01)
    for s in range(steps):
        x, y = batch(s, dist.get_rank())
        topt.zero_grad()
        tloss = ((theirs(to_torch(x, torch)) - to_torch(y, torch)) ** 2).mean()
        tloss.backward()
        topt.step()
        _close(_step(ours, opt, s), tloss.item(), f"{what}loss at step {s}")


def test_full_state_dict_through_dcp_helpers():
    from mpitensor.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    plain = mlp(10)
    model = _shard(mlp(10))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    for k, v in plain.state_dict().items():
        assert not isinstance(full[k], DTensor)
        np.testing.assert_array_equal(full[k].numpy(), v.detach().numpy(), err_msg=k)
    other = _shard(mlp(11))
    set_model_state_dict(other, full, options=StateDictOptions(full_state_dict=True))
    x, _ = batch(0, dist.get_rank())
    with mt.no_grad():
        np.testing.assert_array_equal(other(x).numpy(), plain(x).numpy())
