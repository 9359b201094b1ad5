"""FullyShardedDataParallel (FSDP1) in one process, and a tutorial-style program at 2 ranks.

Spec: torch's import paths work; the auto-wrap policies pick the submodules torch's rules
pick (size, transformer class, lambda, module classes, a custom policy overriding arguments)
and ``enable_wrap``/``wrap`` wrap only inside the block; the options map onto the units
(strategy, prefetch, mixed precision with its buffers and batch norms kept in full
precision); meta-device modules are materialized; ``apply`` initialises through the shards;
bad arguments raise before any traffic; a program written as the FSDP MNIST tutorial
(``mp.spawn``, gloo, an auto-wrap policy, a rank-0 checkpoint) runs to the end at 2 ranks.
The multi-rank values are in ``tests/mpi/test_fsdp1.py``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
)
from mpitensor.distributed.fsdp import FullyShardedDataParallel as FSDP
from mpitensor.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    always_wrap_policy,
    enable_wrap,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    wrap,
)

from .launch import run_job


@pytest.fixture(scope="module", autouse=True)
def _group():
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("mpi")
    yield
    if ours:
        dist.destroy_process_group()


def _net(seed=0):
    mt.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 30), nn.ReLU(),  # 150 parameters
                         nn.Sequential(nn.Linear(30, 2), nn.Linear(2, 3)),  # 62 + 9
                         nn.Linear(3, 2))  # 8


def _units(model):
    return [type(m.module).__bases__[-1].__name__ for m in FSDP.fsdp_modules(model)]


def test_torch_import_paths():
    from mpitensor.distributed.fsdp.fully_sharded_data_parallel import (
        BackwardPrefetch as B,
    )
    from mpitensor.distributed.fsdp.fully_sharded_data_parallel import CPUOffload as C
    from mpitensor.distributed.fsdp.fully_sharded_data_parallel import (
        FullyShardedDataParallel as F,
    )

    assert (B, C, F) == (BackwardPrefetch, CPUOffload, FSDP)


def test_size_policy_wraps_what_holds_enough_unwrapped_parameters():
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=60)
    model = FSDP(_net(), auto_wrap_policy=policy)
    # the first Linear (150) and the inner Sequential (71: its Linears are 62 and 9, the 62
    # alone is a unit, then 9 are left, fewer than 60) are units; the last Linear (8) is not
    assert _units(model) == ["Sequential", "Linear", "Linear"]
    assert isinstance(model.module[2][0], FSDP) and not isinstance(model.module[2], FSDP)
    assert not isinstance(model.module[3], FSDP)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in _net().named_parameters()]
    assert repr(model).startswith("FullyShardedDataParallel(\n  (_fsdp_wrapped_module): "
                                  "Sequential(\n    (0): FullyShardedDataParallel(\n      "
                                  "(_fsdp_wrapped_module): Linear(in_features=4")


def test_class_lambda_custom_and_always_policies():
    by_class = FSDP(_net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    assert _units(by_class) == ["Sequential"] + ["Linear"] * 4
    small = functools.partial(lambda_auto_wrap_policy,
                              lambda_fn=lambda m: isinstance(m, nn.Linear) and m.out_features < 3)
    assert _units(FSDP(_net(), auto_wrap_policy=small)) == ["Sequential", "Linear", "Linear"]
    custom = CustomPolicy(lambda m: {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP}
                          if isinstance(m, nn.Linear) and m.in_features == 4 else False)
    model = FSDP(_net(), auto_wrap_policy=custom)
    assert model.module[0]._fsdp1_options.strategy is ShardingStrategy.SHARD_GRAD_OP
    assert model._fsdp1_options.strategy is ShardingStrategy.FULL_SHARD
    assert model.module[0].module._fsdp_state.reshard_after_forward is False
    assert len(FSDP.fsdp_modules(FSDP(_net(), auto_wrap_policy=always_wrap_policy))) == 7


def test_enable_wrap_wraps_inside_the_block_only():
    layer = nn.Linear(2, 2)
    assert wrap(layer) is layer
    with enable_wrap(wrapper_cls=FSDP, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP):
        got = wrap(nn.Linear(2, 2))
        other = wrap(nn.Linear(2, 2), sharding_strategy=ShardingStrategy.NO_SHARD)
    assert isinstance(got, FSDP) and got._fsdp1_options.strategy.name == "SHARD_GRAD_OP"
    assert other._fsdp1_options.strategy is ShardingStrategy.NO_SHARD
    assert wrap(layer) is layer


def test_manual_nesting_with_wrap_trains_as_the_plain_model():
    """The T5 example's manual way: units made with wrap() inside enable_wrap, then the root;
    at one rank every collective is a copy, so the losses are the plain model's exactly."""
    def build():
        mt.manual_seed(0)
        return [nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)]

    with enable_wrap(wrapper_cls=FSDP, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP):
        first, act, last = build()
        model = wrap(nn.Sequential(wrap(first), act, wrap(last)))
    plain = nn.Sequential(*build())
    assert len(FSDP.fsdp_modules(model)) == 3
    losses = []
    for m in (model, plain):
        opt = mt.optim.SGD(m.parameters(), lr=0.1)
        got = []
        for s in range(3):
            opt.zero_grad()
            loss = m(mt.full((2, 4), 0.5 + s)).square().mean()
            loss.backward()
            opt.step()
            got.append(float(loss))
        losses.append(got)
    assert losses[0] == losses[1]


def test_prefetch_switches_reach_the_units():
    model = FSDP(_net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                 backward_prefetch=BackwardPrefetch.BACKWARD_POST, forward_prefetch=True)
    states = [m.module._fsdp_state for m in FSDP.fsdp_modules(model)]
    assert all(st.prefetch_after_grads and st.fwd_prefetch is None for st in states)
    quiet = FSDP(_net(), backward_prefetch=None)
    st = quiet.module._fsdp_state
    assert st.bwd_prefetch == [] and st.fwd_prefetch == []
    for m in (model, quiet):  # both still train
        m(mt.ones(2, 4)).sum().backward()
        assert all(p.grad is not None for p in m.parameters())


def _backward_events(backward_prefetch, monkeypatch):
    """(event, unit index, async) of every gather and reduction in one backward of a
    3-Linear model wrapped per Linear."""
    from mpitensor.distributed.fsdp._group import ShardedGroup

    mt.manual_seed(0)
    model = FSDP(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(),
                               nn.Linear(4, 2)),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                 backward_prefetch=backward_prefetch)
    groups = [m.module._fsdp_state.group for m in FSDP.fsdp_modules(model)[1:]]
    events = []
    gather, reduce = ShardedGroup.start_gather, ShardedGroup.start_reduce

    def start_gather(self, async_op):
        if self in groups and not self.is_unsharded and self._gather is None:
            events.append(("gather", groups.index(self), async_op))
        return gather(self, async_op)

    def start_reduce(self):
        events.append(("reduce", groups.index(self), None))
        return reduce(self)

    loss = model(mt.ones(2, 3)).sum()
    monkeypatch.setattr(ShardedGroup, "start_gather", start_gather)
    monkeypatch.setattr(ShardedGroup, "start_reduce", start_reduce)
    try:
        loss.backward()
    finally:
        monkeypatch.undo()
    return events


def test_backward_prefetch_pre_post_and_none(monkeypatch):
    """PRE: the unit before starts gathering (asynchronously) when a unit's backward starts,
    before its reduction; POST: right after its reduction; None: only when its own backward
    needs it (a blocking gather)."""
    pre = _backward_events(BackwardPrefetch.BACKWARD_PRE, monkeypatch)
    assert pre[:3] == [("gather", 2, False), ("gather", 1, True), ("reduce", 2, None)], pre
    post = _backward_events(BackwardPrefetch.BACKWARD_POST, monkeypatch)
    assert post[:3] == [("gather", 2, False), ("reduce", 2, None), ("gather", 1, True)], post
    none = _backward_events(None, monkeypatch)
    assert none[:3] == [("gather", 2, False), ("reduce", 2, None), ("gather", 1, False)], none


class _WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scale", mt.ones(4, dtype=mt.float64))

    def forward(self, x):
        return self.bn(self.fc(x)) * self.scale


def test_mixed_precision_buffers_and_batch_norm():
    mt.manual_seed(0)
    plain = _WithNorm().double()
    mp = MixedPrecision(param_dtype=mt.float32, reduce_dtype=mt.float32,
                        buffer_dtype=mt.float32)
    model = FSDP(_WithNorm().double(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                 mixed_precision=mp)
    assert model.module.scale.dtype == mt.float32  # kept in buffer_dtype
    assert model.module.bn.running_mean.dtype == mt.float64  # batch norms: full precision
    assert isinstance(model.module.bn, FSDP)  # its own unit, without mixed precision
    seen = []
    model.module.bn.module.register_forward_pre_hook(
        lambda m, a: seen.append((m.weight.dtype, a[0].dtype)))
    out = model(mt.ones(3, 4, dtype=mt.float64))
    assert seen == [(mt.float64, mt.float64)] and out.dtype == mt.float32
    sd = model.state_dict()  # in the module's own dtypes
    assert {k: v.dtype for k, v in sd.items()} == {k: v.dtype
                                                   for k, v in plain.state_dict().items()}


def test_meta_device_module_is_materialized():
    """As torch: ``param_init_fn`` on every module that holds meta tensors itself (here each
    Linear, not the Sequential); without one, ``to_empty`` and ``reset_parameters()``."""
    with mt.device("meta"):
        meta = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    calls = []

    def init(m):
        calls.append(type(m).__name__)
        m.to_empty(device="cpu", recurse=False)
        with mt.no_grad():
            for p in m.parameters(recurse=False):
                p.fill_(0.5)

    model = FSDP(meta, param_init_fn=init, device_id="cpu",
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    assert calls == ["Linear", "Linear"]
    for v in model.state_dict().values():
        np.testing.assert_array_equal(v.numpy(), np.full(v.shape, 0.5, np.float32))
    with mt.device("meta"):
        default = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    got = FSDP(default).state_dict()
    assert all(v.device.type == "cpu" and np.isfinite(v.numpy()).all() for v in got.values())
    assert len({float(v.numpy().std()) for k, v in got.items() if "weight" in k}) == 2


def test_apply_initialises_through_the_shards():
    model = FSDP(_net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))

    def init(m):
        if isinstance(m, nn.Linear):
            with mt.no_grad():
                m.weight.fill_(1.0)
                m.bias.zero_()

    model.apply(init)
    for k, v in model.state_dict().items():
        want = 1.0 if k.endswith("weight") else 0.0
        np.testing.assert_array_equal(v.numpy(), np.full(v.shape, want, np.float32), err_msg=k)


def test_state_dict_inside_summon_full_params_gives_the_whole_parameters():
    model = FSDP(_net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    with FSDP.summon_full_params(model):
        with mt.no_grad():
            model.module[0].weight.fill_(3.0)
        sd = model.state_dict()
        assert (sd["0.weight"].numpy() == 3.0).all()
        assert tuple(model.module[0].weight.shape) == (30, 4)  # still the whole one
    assert (model.state_dict()["0.weight"].numpy() == 3.0).all()  # written back


def test_sync_module_states_and_offload_train_as_plain():
    ref = _net()
    model = FSDP(_net(), sync_module_states=True, cpu_offload=CPUOffload(offload_params=True),
                 use_orig_params=True, limit_all_gathers=False)
    opt, ref_opt = (mt.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    for m, o in ((model, opt), (ref, ref_opt)):
        for s in range(3):
            o.zero_grad()
            m(mt.full((2, 4), float(s))).square().sum().backward()
            o.step()
    for k, v in model.state_dict().items():
        np.testing.assert_allclose(v.numpy(), ref.state_dict()[k].numpy(), rtol=1e-6, err_msg=k)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"auto_wrap_policy": "size"}, TypeError, "auto_wrap_policy must be callable"),
    ({"sharding_strategy": 3}, ValueError, "sharding_strategy must be one of"),
    ({"backward_prefetch": "pre"}, ValueError, "backward_prefetch must be one of"),
    ({"mixed_precision": mt.float16}, TypeError, "must be a MixedPrecision"),
    ({"mixed_precision": MixedPrecision(keep_low_precision_grads=True)}, NotImplementedError,
     "keep_low_precision_grads"),
    ({"cpu_offload": True}, TypeError, "must be a CPUOffload"),
    ({"forward_prefetch": 1}, TypeError, "forward_prefetch must be a bool"),
    ({"sharding_strategy": ShardingStrategy.HYBRID_SHARD}, ValueError, "needs a 2-D"),
    ({"ignored_modules": [], "ignored_states": []}, ValueError, "not both"),
    ({"param_init_fn": 3}, TypeError, "param_init_fn must be callable"),
])
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        FSDP(_net(), **kwargs)


def test_summon_arguments_and_no_module():
    with pytest.raises(TypeError, match="takes an nn.Module"):
        FSDP(lambda x: x)
    model = FSDP(_net())
    with pytest.raises(ValueError, match="writeback=False"):
        with FSDP.summon_full_params(model, rank0_only=True):
            pass
    with pytest.raises(NotImplementedError, match="with_grads"):
        with FSDP.summon_full_params(model, with_grads=True):
            pass


TUTORIAL = """\
import argparse
import functools
import os
import sys

import numpy as np

import mpitensor as torch                                  # was: import torch
import mpitensor.distributed as dist
import mpitensor.multiprocessing as mp
import mpitensor.nn as nn
import mpitensor.nn.functional as F
import mpitensor.optim as optim
from mpitensor.distributed.fsdp import FullyShardedDataParallel as FSDP
from mpitensor.distributed.fsdp.fully_sharded_data_parallel import (
    BackwardPrefetch, CPUOffload, FullStateDictConfig, StateDictType)
from mpitensor.distributed.fsdp.wrap import size_based_auto_wrap_policy
from mpitensor.optim.lr_scheduler import StepLR
from mpitensor.utils.data import DataLoader, TensorDataset
from mpitensor.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.fc1 = nn.Linear(16 * 12 * 12, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = torch.flatten(F.max_pool2d(x, 2), 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def fake_mnist(n, seed):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    return TensorDataset(torch.from_numpy(images), torch.from_numpy(rng.integers(0, 10, n)))


def train(model, rank, loader, optimizer, epoch, sampler):
    model.train()
    sampler.set_epoch(epoch)
    total = torch.zeros(2)
    for data, target in loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target, reduction="sum")
        loss.backward()
        optimizer.step()
        total[0] += loss.item()
        total[1] += len(data)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    if rank == 0:
        print(f"Train Epoch: {epoch} Loss: {float(total[0] / total[1]):.6f}")


def test(model, rank, loader):
    model.eval()
    total = torch.zeros(3)
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            total[0] += F.nll_loss(output, target, reduction="sum").item()
            total[1] += output.argmax(dim=1).eq(target).sum().item()
            total[2] += len(data)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    if rank == 0:
        print(f"Test set: Average loss: {float(total[0] / total[2]):.4f}")


def fsdp_main(rank, world_size, args):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = args.port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    train_set, test_set = fake_mnist(128, 0), fake_mnist(64, 1)
    sampler1 = DistributedSampler(train_set, rank=rank, num_replicas=world_size, shuffle=True)
    sampler2 = DistributedSampler(test_set, rank=rank, num_replicas=world_size)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler1)
    test_loader = DataLoader(test_set, batch_size=32, sampler=sampler2)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=1000)
    model = FSDP(Net(), auto_wrap_policy=policy, cpu_offload=CPUOffload(offload_params=True),
                 backward_prefetch=BackwardPrefetch.BACKWARD_PRE)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train(model, rank, train_loader, optimizer, epoch, sampler1)
        test(model, rank, test_loader)
        scheduler.step()
    if rank == 0:
        print(model)
    dist.barrier()
    cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
        states = model.state_dict()
    if rank == 0:
        torch.save(states, "mnist_cnn.pt")
        print("saved", sorted(states))
    else:
        print("rank", rank, "holds", len(states))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--port", default="12371")
    args = parser.parse_args()
    torch.manual_seed(1)
    mp.spawn(fsdp_main, args=(2, args), nprocs=2, join=True)
"""


def test_tutorial_style_mnist_program_runs_to_the_end(tmp_path: Path) -> None:
    script = tmp_path / "fsdp_mnist.py"
    script.write_text(TUTORIAL)
    code, out, err, _ = run_job([sys.executable, str(script)], 300, cwd=tmp_path)
    assert code == 0, out + err
    lines = out.splitlines()
    epochs = [line for line in lines if line.startswith("Train Epoch")]
    assert [e.split()[2] for e in epochs] == ["1", "2"], out
    losses = [float(e.split()[-1]) for e in epochs]
    assert all(np.isfinite(losses)) and losses[1] < losses[0], out
    assert sum(line.startswith("Test set") for line in lines) == 2, out
    assert "rank 1 holds 0" in lines, out
    saved = mt.load(tmp_path / "mnist_cnn.pt")
    assert sorted(saved) == ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight",
                             "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert tuple(saved["fc1.weight"].shape) == (32, 2304)
    assert "FullyShardedDataParallel(" in out
