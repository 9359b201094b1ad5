"""FullyShardedDataParallel (FSDP1) at 1-4 ranks.

Spec: a small CNN and a small transformer wrapped in FSDP1 (every sharding strategy, with
and without an auto-wrap policy) train 20 steps to the losses of the same model under our DDP
(rtol 1e-5 in float32, 1e-10 in float64), also with mixed precision (float32 compute of a
float64 model, against float64 DDP: float32's rounding); torch's FSDP1 over gloo gives the same
losses (1e-5); FULL (rank0_only too), SHARDED (through dcp) and LOCAL state dicts round-trip,
as do optimizer state dicts (FULL and SHARDED) and get_state_dict/set_state_dict; the
parameters keep their names, shapes and count; summon_full_params writes back;
clip_grad_norm_ returns the global norm; no_sync accumulates as DDP; bad input fails on every
rank.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_fsdp1.py``.
"""

from __future__ import annotations

import functools
import shutil
import tempfile

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.distributed.checkpoint as dcp
import mpitensor.nn as nn
import mpitensor.nn.functional as F
from mpitensor.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from mpitensor.distributed.device_mesh import init_device_mesh
from mpitensor.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    MixedPrecision,
    ShardingStrategy,
    StateDictType,
    fully_shard,
)
from mpitensor.distributed.fsdp import FullyShardedDataParallel as FSDP
from mpitensor.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from mpitensor.distributed.tensor import DTensor
from mpitensor.nn.parallel import DistributedDataParallel as DDP

from .sharded_models import batch, mlp, torch_twin
from .torch_gloo import torch_gloo_fixture  # noqa: F401 - the fixture torch_gloo

pytestmark = pytest.mark.mpi(min_size=1)

STEPS = 20
RTOL = {"float32": 1e-5, "float64": 1e-10}


class CNN(nn.Module):
    """Two convolutions, a pooling and two linear layers, on 8x8 one-channel images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 6, 3)
        self.fc1 = nn.Linear(24, 10)
        self.fc2 = nn.Linear(10, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(mt.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


class Tiny(nn.Module):
    """An input projection, two encoder layers and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(
            8, 2, 16, dropout=0.0, batch_first=True) for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(1))


def _data(name, step, dtype):
    rng = np.random.default_rng(1000 * step + dist.get_rank())
    if name == "cnn":
        x = rng.standard_normal((4, 1, 8, 8))
        return mt.from_numpy(x.astype(dtype)), mt.from_numpy(rng.integers(0, 5, 4))
    x, y = rng.standard_normal((4, 5, 6)), rng.standard_normal((4, 3))
    return mt.from_numpy(x.astype(dtype)), mt.from_numpy(y.astype(dtype))


def _loss(name, out, y):
    # a mixed-precision model's output is in its compute dtype, as torch's FSDP gives it
    return F.nll_loss(out, y) if name == "cnn" else F.mse_loss(out.to(y.dtype), y)


def _model(name, dtype="float32", seed=0):
    mt.manual_seed(seed)
    m = CNN() if name == "cnn" else Tiny()
    return m.double() if dtype == "float64" else m


POLICIES = {
    "cnn": functools.partial(size_based_auto_wrap_policy, min_num_params=50),
    "tiny": functools.partial(transformer_auto_wrap_policy,
                              transformer_layer_cls={nn.TransformerEncoderLayer}),
}


def _train(name, model, dtype, steps=STEPS, start=0, opt=None):
    opt = opt or mt.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for s in range(start, start + steps):
        x, y = _data(name, s, dtype)
        opt.zero_grad()
        loss = _loss(name, model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, opt


_DDP: dict = {}


def _ddp_losses(name, dtype):
    if (name, dtype) not in _DDP:
        _DDP[name, dtype] = _train(name, DDP(_model(name, dtype)), dtype)[0]
    return _DDP[name, dtype]


def _hybrid_mesh():
    n = dist.get_world_size()
    rep = 2 if n % 2 == 0 else 1
    return init_device_mesh("cpu", (rep, n // rep), mesh_dim_names=("replicate", "shard"))


def _fsdp(model, strategy, policy=None, **kw):
    mesh = _hybrid_mesh() if "HYBRID" in strategy.name else None
    return FSDP(model, sharding_strategy=strategy, auto_wrap_policy=policy, device_mesh=mesh,
                **kw)


@pytest.mark.parametrize("name", ["cnn", "tiny"])
@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("strategy", list(ShardingStrategy))
def test_trains_like_ddp(name, wrapped, strategy):
    model = _fsdp(_model(name), strategy, POLICIES[name] if wrapped else None)
    units = FSDP.fsdp_modules(model)
    assert len(units) > 2 if wrapped else len(units) == 1
    got, _ = _train(name, model, "float32")
    np.testing.assert_allclose(got, _ddp_losses(name, "float32"), rtol=RTOL["float32"])


@pytest.mark.parametrize("name", ["cnn", "tiny"])
@pytest.mark.parametrize("strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD,
                                      ShardingStrategy.HYBRID_SHARD])
def test_float64_agrees_to_1e_10(name, strategy):
    model = _fsdp(_model(name, "float64"), strategy, POLICIES[name])
    got, _ = _train(name, model, "float64")
    np.testing.assert_allclose(got, _ddp_losses(name, "float64"), rtol=RTOL["float64"])


@pytest.mark.parametrize("name", ["cnn", "tiny"])
def test_mixed_precision_computes_in_float32(name):
    """A float64 model computed and reduced in float32: the losses are float64 DDP's to
    float32's rounding; the shards, gradients and optimizer stay float64."""
    mp = MixedPrecision(param_dtype=mt.float32, reduce_dtype=mt.float32)
    model = _fsdp(_model(name, "float64"), ShardingStrategy.FULL_SHARD, POLICIES[name],
                  mixed_precision=mp)
    seen = []
    inner = (model.module.fc1 if name == "cnn" else model.module.layers[0]).module
    inner = inner if name == "cnn" else inner.linear1
    inner.register_forward_pre_hook(lambda m, a: seen.append(m.weight.dtype))
    inner.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    got, _ = _train(name, model, "float64")
    assert set(seen) == {mt.float32}
    assert all(p.dtype == mt.float64 and p.grad.dtype == mt.float64
               for p in model.parameters())
    np.testing.assert_allclose(got, _ddp_losses(name, "float64"), rtol=RTOL["float32"])


def test_bfloat16_policy_is_fully_shards_mixed_precision():
    """The T5 example's bfSixteen-style policy (bfloat16 compute, float32 reduction) gives,
    bit for bit, the losses of fully_shard with the same MixedPrecisionPolicy on the same
    units, and outputs stay bfloat16 (FSDP1 casts no output)."""
    from mpitensor.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecision(param_dtype=mt.bfloat16, reduce_dtype=mt.float32)
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"], mixed_precision=mp)
    assert model(_data("cnn", 0, "float32")[0]).dtype == mt.bfloat16
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"], mixed_precision=mp)
    twin = _model("cnn")
    policy = MixedPrecisionPolicy(param_dtype=mt.bfloat16, reduce_dtype=mt.float32)
    for m in (twin.conv2, twin.fc1, twin.fc2, twin):
        fully_shard(m, mp_policy=policy)
    got, _ = _train("cnn", model, "float32", steps=5)
    want, _ = _train("cnn", twin, "float32", steps=5)
    assert got == want
    assert all(p.dtype == mt.float32 and p.grad.dtype == mt.float32
               for p in model.parameters())


def test_process_groups_instead_of_a_mesh():
    """HYBRID_SHARD over ``process_group=(shard_group, replicate_group)`` and FULL_SHARD over
    a group given as such train as DDP."""
    mesh = _hybrid_mesh()
    pair = (mesh.get_group("shard"), mesh.get_group("replicate"))
    hybrid = FSDP(_model("cnn"), process_group=pair, auto_wrap_policy=POLICIES["cnn"],
                  sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    p = next(iter(hybrid.parameters()))
    assert p.device_mesh.mesh.tolist() == mesh.mesh.tolist()
    group = dist.new_group(list(range(dist.get_world_size())))
    plain = FSDP(_model("cnn"), process_group=group, auto_wrap_policy=POLICIES["cnn"])
    for model in (hybrid, plain):
        got, _ = _train("cnn", model, "float32")
        np.testing.assert_allclose(got, _ddp_losses("cnn", "float32"), rtol=RTOL["float32"])


@pytest.mark.parametrize("strategy", [ShardingStrategy.FULL_SHARD,
                                      ShardingStrategy.SHARD_GRAD_OP])
def test_evaluation_between_steps_changes_nothing(strategy):
    """A forward under no_grad (the tutorials' test()) between training steps: the training
    losses are DDP's, and every unit is resharded after it."""
    model = _fsdp(_model("tiny"), strategy, POLICIES["tiny"])
    opt = mt.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for s in range(6):
        losses += _train("tiny", model, "float32", steps=1, start=s, opt=opt)[0]
        model.eval()
        with mt.no_grad():
            model(_data("tiny", 100 + s, "float32")[0])
        model.train()
        units = [m.module._fsdp_state for m in FSDP.fsdp_modules(model)]
        assert not any(st.group.is_unsharded for st in units if st.group is not None)
    np.testing.assert_allclose(losses, _ddp_losses("tiny", "float32")[:6],
                               rtol=RTOL["float32"])


@pytest.mark.parametrize("strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD,
                                      ShardingStrategy.HYBRID_SHARD])
def test_sync_module_states_starts_from_rank0(strategy):
    """Every rank builds the model with its own seed; sync_module_states gives every rank the
    first rank's values."""
    rank0 = {k: v.numpy() for k, v in _model("tiny", seed=0).state_dict().items()}
    model = _fsdp(_model("tiny", seed=dist.get_rank()), strategy, POLICIES["tiny"],
                  sync_module_states=True)
    _same(_full_sd(model), rank0)


def test_ignored_modules_stay_plain_and_unsharded():
    model = _model("cnn")
    head = model.fc2
    wrapped = FSDP(model, auto_wrap_policy=POLICIES["cnn"], ignored_modules=[head])
    assert not isinstance(wrapped.module.fc2, FSDP)
    assert not isinstance(head.weight, DTensor) and tuple(head.weight.shape) == (5, 10)
    assert isinstance(wrapped.module.fc1.weight, DTensor)
    x, y = _data("cnn", 0, "float32")
    _loss("cnn", wrapped(x), y).backward()
    assert head.weight.grad is not None and not isinstance(head.weight.grad, DTensor)
    assert "fc2.weight" in wrapped.state_dict()


def test_parameters_keep_names_shapes_and_count():
    plain = _model("tiny")
    model = FSDP(_model("tiny"), auto_wrap_policy=POLICIES["tiny"])
    want = [(n, tuple(p.shape)) for n, p in plain.named_parameters()]
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == want
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel()
                                                             for p in plain.parameters())
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert list(model.state_dict()) == list(plain.state_dict())


def _full_sd(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def _same(a, b):
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_full_state_dict_round_trip_and_rank0_only():
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"])
    _train("cnn", model, "float32", steps=3)
    ref = DDP(_model("cnn"))
    _train("cnn", ref, "float32", steps=3)
    sd = _full_sd(model)
    for k, v in ref.module.state_dict().items():
        np.testing.assert_allclose(sd[k], v.numpy(), rtol=0, atol=1e-5 * abs(v.numpy()).max())
    other = FSDP(_model("cnn", seed=7), auto_wrap_policy=POLICIES["cnn"])
    other.load_state_dict(model.state_dict())
    _same(_full_sd(other), sd)
    cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
        got = model.state_dict()
    if dist.get_rank() == 0:
        _same({k: v.numpy() for k, v in got.items()}, sd)
    else:
        assert got == {}
    assert FSDP.get_state_dict_type(model).state_dict_type is StateDictType.FULL_STATE_DICT


def _shared_dir():
    box = [tempfile.mkdtemp(prefix="fsdp1-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _drop_dir(path):
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(path)


@pytest.mark.parametrize("name", ["cnn", "tiny"])
@pytest.mark.parametrize("kind", [StateDictType.SHARDED_STATE_DICT,
                                  StateDictType.LOCAL_STATE_DICT])
def test_state_dict_through_dcp(name, kind):
    """Saved with dcp and loaded into another model: every rank's pieces come back (LOCAL is
    what pytorch/examples' FSDP checkpoint handler saves)."""
    model = FSDP(_model(name), auto_wrap_policy=POLICIES[name])
    _train(name, model, "float32", steps=2)
    want = _full_sd(model)
    other = FSDP(_model(name, seed=8), auto_wrap_policy=POLICIES[name])
    path = _shared_dir()
    try:
        with FSDP.state_dict_type(model, kind):
            sd = model.state_dict()
            assert {k for k, v in sd.items() if isinstance(v, DTensor)} == \
                {n for n, _ in model.named_parameters()}
            dcp.save(sd, checkpoint_id=path)
        with FSDP.state_dict_type(other, kind):
            target = other.state_dict()
            dcp.load(target, checkpoint_id=path)
            other.load_state_dict(target)
    finally:
        _drop_dir(path)
    _same(_full_sd(other), want)


def test_local_state_dict_takes_plain_pieces():
    model = FSDP(_model("tiny"), auto_wrap_policy=POLICIES["tiny"])
    _train("tiny", model, "float32", steps=2)
    want = _full_sd(model)
    other = FSDP(_model("tiny", seed=9), auto_wrap_policy=POLICIES["tiny"])
    for m in (model, other):
        FSDP.set_state_dict_type(m, StateDictType.LOCAL_STATE_DICT)
    other.load_state_dict({k: v.to_local() if isinstance(v, DTensor) else v
                           for k, v in model.state_dict().items()})
    FSDP.set_state_dict_type(other, StateDictType.FULL_STATE_DICT)
    _same(_full_sd(other), want)


@pytest.mark.parametrize("kind", [StateDictType.FULL_STATE_DICT,
                                  StateDictType.SHARDED_STATE_DICT])
def test_optimizer_state_dict_resumes_training(kind):
    """Save model and optimizer after 3 steps, load both into a fresh pair: the next 3 steps'
    losses are the uninterrupted run's, bit for bit."""
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"])
    _, opt = _train("cnn", model, "float32", steps=3)
    ocfg = FullOptimStateDictConfig(rank0_only=False) if kind.name.startswith("FULL") else None
    with FSDP.state_dict_type(model, kind, None, ocfg):
        msd, osd = model.state_dict(), FSDP.optim_state_dict(model, opt)
    assert set(osd["state"]) == {n for n, _ in model.named_parameters()}
    fresh = FSDP(_model("cnn", seed=3), auto_wrap_policy=POLICIES["cnn"])
    fresh_opt = mt.optim.Adam(fresh.parameters(), lr=0.01)
    with FSDP.state_dict_type(fresh, kind, None, ocfg):
        fresh.load_state_dict(msd)
        fresh_opt.load_state_dict(FSDP.optim_state_dict_to_load(fresh, fresh_opt, osd))
    want, _ = _train("cnn", model, "float32", steps=3, start=3, opt=opt)
    got, _ = _train("cnn", fresh, "float32", steps=3, start=3, opt=fresh_opt)
    assert got == want


def test_full_optim_state_dict_scattered_from_rank0():
    """The older API of pytorch/examples' checkpoint handler: rank 0 holds the whole optimizer
    state, ``scatter_full_optim_state_dict`` gives every rank its part."""
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"])
    _, opt = _train("cnn", model, "float32", steps=3)
    full = FSDP.full_optim_state_dict(model, opt)
    msd = model.state_dict()
    assert (full == {}) == (dist.get_rank() != 0)
    if dist.get_rank() == 0:
        assert tuple(full["state"]["fc1.weight"]["exp_avg"].shape) == (10, 24)
    fresh = FSDP(_model("cnn", seed=3), auto_wrap_policy=POLICIES["cnn"])
    fresh.load_state_dict(msd)
    fresh_opt = mt.optim.Adam(fresh.parameters(), lr=0.01)
    fresh_opt.load_state_dict(FSDP.scatter_full_optim_state_dict(
        full if dist.get_rank() == 0 else None, fresh, optim=fresh_opt))
    want, _ = _train("cnn", model, "float32", steps=3, start=3, opt=opt)
    got, _ = _train("cnn", fresh, "float32", steps=3, start=3, opt=fresh_opt)
    assert got == want


@pytest.mark.parametrize("kind", [StateDictType.FULL_STATE_DICT,
                                  StateDictType.SHARDED_STATE_DICT])
def test_get_state_dict_on_an_fsdp1_model(kind):
    """checkpoint.state_dict's get/set_state_dict take an FSDP1 model as they are: whatever
    type the model was set to (FULL is the default, as in the distributed checkpoint recipe's
    ``FSDP(model)``), they work on DTensor shards, as torch's set SHARDED_STATE_DICT; with
    full_state_dict=True the entries are whole tensors. Either resumes bit for bit."""
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"])
    _, opt = _train("cnn", model, "float32", steps=3)
    fresh = FSDP(_model("cnn", seed=4), auto_wrap_policy=POLICIES["cnn"])
    fresh_opt = mt.optim.Adam(fresh.parameters(), lr=0.01)
    path = _shared_dir()
    try:
        for m in (model, fresh):
            FSDP.set_state_dict_type(m, kind)
        msd, osd = get_state_dict(model, opt)
        assert isinstance(osd["state"]["fc1.weight"]["exp_avg"], DTensor)
        assert isinstance(msd["fc1.weight"], DTensor)
        assert FSDP.get_state_dict_type(model).state_dict_type is kind  # restored after
        full = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))[0]
        assert not isinstance(full["fc1.weight"], DTensor)
        assert mt.equal(full["fc1.weight"], msd["fc1.weight"].full_tensor())
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        msd2, osd2 = get_state_dict(fresh, fresh_opt)
        dcp.load({"model": msd2, "optim": osd2}, checkpoint_id=path)
        set_state_dict(fresh, fresh_opt, model_state_dict=msd2, optim_state_dict=osd2)
    finally:
        _drop_dir(path)
    want, _ = _train("cnn", model, "float32", steps=3, start=3, opt=opt)
    got, _ = _train("cnn", fresh, "float32", steps=3, start=3, opt=fresh_opt)
    assert got == want


def test_summon_full_params_writes_back_and_clip_grad_norm_is_global():
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"])
    ref = _model("cnn")
    with FSDP.summon_full_params(model):
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert not isinstance(p, DTensor) and tuple(p.shape) == tuple(q.shape), n
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
            with mt.no_grad():
                p.mul_(2.0)
    for k, v in _full_sd(model).items():
        np.testing.assert_array_equal(v, 2 * ref.state_dict()[k].numpy(), err_msg=k)
    ddp = DDP(_model("cnn"))
    with mt.no_grad():  # the DDP twin of the doubled weights
        for p in ddp.module.parameters():
            p.mul_(2.0)
    for m in (model, ddp):
        x, y = _data("cnn", 0, "float32")
        _loss("cnn", m(x), y).backward()
    want = float(mt.nn.utils.clip_grad_norm_(ddp.parameters(), 0.1))
    got = model.clip_grad_norm_(0.1)
    assert isinstance(got, mt.Tensor) and not isinstance(got, DTensor)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    norms = [None] * dist.get_world_size()
    dist.all_gather_object(norms, float(got))
    assert len(set(norms)) == 1


def test_no_sync_accumulates_as_ddp():
    model = FSDP(_model("cnn"), auto_wrap_policy=POLICIES["cnn"])
    ref = DDP(_model("cnn"))
    for m in (model, ref):
        with m.no_sync():
            x, y = _data("cnn", 0, "float32")
            _loss("cnn", m(x), y).backward()
        x, y = _data("cnn", 1, "float32")
        _loss("cnn", m(x), y).backward()
    for (n, p), q in zip(model.named_parameters(), ref.module.parameters()):
        g = p.grad.full_tensor().numpy()
        np.testing.assert_allclose(g, q.grad.numpy(), rtol=0,
                                   atol=1e-5 * abs(q.grad.numpy()).max(), err_msg=n)


@pytest.mark.parametrize("strategy", [ShardingStrategy.FULL_SHARD,
                                      ShardingStrategy.SHARD_GRAD_OP,
                                      ShardingStrategy.NO_SHARD])
def test_torch_fsdp1_over_gloo_gives_the_same_losses(torch_gloo, strategy):
    torch = torch_gloo
    from torch.distributed.fsdp import FullyShardedDataParallel as TFSDP
    from torch.distributed.fsdp import ShardingStrategy as TStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy as TPolicy

    ours = mlp()
    theirs = TFSDP(torch_twin(ours, torch), auto_wrap_policy=TPolicy({torch.nn.Linear}),
                   sharding_strategy=TStrategy[strategy.name], device_id=torch.device("cpu"),
                   use_orig_params=True)
    ours = FSDP(ours, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), sharding_strategy=strategy)
    opt = mt.optim.Adam(ours.parameters(), lr=0.01)
    topt = torch.optim.Adam(theirs.parameters(), lr=0.01)
    for s in range(STEPS):
        x, y = batch(s, dist.get_rank())
        opt.zero_grad()
        loss = ((ours(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        topt.zero_grad()
        tloss = ((theirs(torch.from_numpy(x.numpy())) - torch.from_numpy(y.numpy())) ** 2).mean()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(float(loss.item()), float(tloss.item()), rtol=1e-5,
                                   err_msg=f"step {s}")
    with TFSDP.state_dict_type(theirs, torch.distributed.fsdp.StateDictType.FULL_STATE_DICT):
        tsd = {k: v.numpy() for k, v in theirs.state_dict().items()}
    for k, v in _full_sd(ours).items():
        np.testing.assert_allclose(v, tsd[k], rtol=0, atol=1e-5 * abs(tsd[k]).max(), err_msg=k)


def _raises_everywhere(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, True)  # every rank got here: none hangs
    assert all(flags)


def test_bad_input_raises_on_every_rank():
    _raises_everywhere(TypeError, "auto_wrap_policy must be callable",
                       lambda: FSDP(_model("cnn"), auto_wrap_policy=100))
    _raises_everywhere(ValueError, "sharding_strategy must be one of",
                       lambda: FSDP(_model("cnn"), sharding_strategy="FULL"))
    sharded = _model("cnn")
    fully_shard(sharded.fc1)
    _raises_everywhere(ValueError, "given to fully_shard already", lambda: FSDP(sharded))
    twice = FSDP(_model("cnn"))
    _raises_everywhere(ValueError, "already a FullyShardedDataParallel", lambda: FSDP(twice))
    _raises_everywhere(ValueError, "HYBRID_SHARD needs a 2-D device_mesh",
                       lambda: FSDP(_model("cnn"),
                                    sharding_strategy=ShardingStrategy.HYBRID_SHARD))
    if not mt.cuda.is_available():
        _raises_everywhere(RuntimeError, "CuPy or a GPU is missing",
                           lambda: FSDP(_model("cnn"), device_id=0))
