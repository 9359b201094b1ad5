"""fully_shard over a tensor-parallel model (FSDP over "dp", TP over "tp") at 1-4 ranks.

Spec: on every (dp, tp) layout of the world (degenerate meshes included), a model that
``parallelize_module`` split over ``mesh["tp"]`` (a colwise Linear: weight and bias Shard(0); a
rowwise Linear: weight Shard(1), bias Replicate) beside a plain Linear, given to
``fully_shard(mesh=mesh["dp"])`` per block and at the root, computes what the plain model
computes on full tensors: outputs, every gradient (``grad.full_tensor()``: the gradient of the
loss over the whole global batch), the parameters after optimizer steps, in float64 to 1e-12;
each tensor-parallel parameter is a DTensor on the ("tp", "dp") mesh placed (tp placement,
Shard(0)) whose local piece is torch.chunk's rows of the tensor-parallel piece; the plain one is
Shard(0) over "dp"; the state dict holds those DTensors and round-trips (as DTensors, as the
tensor-parallel layout, as whole tensors) and through distributed checkpoints, which load
bit-exact into every other layout and the plain model; reshard_after_forward, prefetch, mixed
precision and gradient accumulation without sync keep working; the cross-rank check names
global ranks on a sub-mesh; bad meshes fail clearly.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_fsdp_tp.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from mpitensor.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh
from mpitensor.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from mpitensor.optim import SGD, Adam

pytestmark = pytest.mark.mpi(min_size=1)

TOL = 1e-12  # float64: a few roundings of sums of tens of terms
# the hidden width divides every tp (the row-parallel layer takes its input pieces as even);
# the rows of down (5) and head (3) are uneven over dp, with empty pieces at dp=4
IN, HIDDEN, OUT = 6, 12, 5


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(IN, HIDDEN)
        self.down = nn.Linear(HIDDEN, OUT)
        self.head = nn.Linear(OUT, 3)  # not tensor parallel: a plain parameter

    def forward(self, x):
        return self.head(mt.tanh(self.down(mt.tanh(self.up(x)))))


def _layouts():
    n = dist.get_world_size()
    return [(n // tp, tp) for tp in (1, 2, 3, 4) if n % tp == 0]


def _plain(seed: int = 0) -> Net:
    mt.manual_seed(seed)
    return Net().double()


def _two_d(dp: int, tp: int, seed: int = 0, **kw):
    """The plain model, tensor parallel over "tp", fully sharded over "dp"."""
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = _plain(seed)
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    for block in (model.up, model.down, model.head):
        fully_shard(block, mesh=mesh["dp"], **kw)
    fully_shard(model, mesh=mesh["dp"], **kw)
    return model, mesh


def _batch(step: int, dp_rank: int):
    rng = np.random.default_rng(100 * step + dp_rank)
    return (mt.from_numpy(rng.standard_normal((4, IN))),
            mt.from_numpy(rng.standard_normal((4, 3))))


def _global_batch(step: int, dp: int):
    parts = [_batch(step, r) for r in range(dp)]
    return mt.cat([x for x, _ in parts]), mt.cat([y for _, y in parts])


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


def _close(a, b, what):
    a = a.detach().numpy() if hasattr(a, "detach") else a
    b = b.detach().numpy() if hasattr(b, "detach") else b
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL, err_msg=what)


def _check_params(model, plain, what):
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        _close(p.full_tensor(), q, f"{what}: {name}")


@pytest.mark.parametrize("reshard", [True, False])
def test_values_gradients_and_steps_equal_the_plain_model(reshard):
    for dp, tp in _layouts():
        model, mesh = _two_d(dp, tp, reshard_after_forward=reshard)
        plain = _plain()
        opt = Adam(model.parameters(), lr=0.05)
        ref_opt = Adam(plain.parameters(), lr=0.05)
        r = mesh.get_local_rank("dp")
        for s in range(3):
            x, y = _batch(s, r)
            gx, gy = _global_batch(s, dp)
            opt.zero_grad()
            ref_opt.zero_grad()
            out = model(x)
            _close(out, plain(x), f"{dp}x{tp} output at step {s}")
            ((out - y) ** 2).mean().backward()
            _loss(plain, gx, gy).backward()
            for (name, p), q in zip(model.named_parameters(), plain.parameters()):
                assert isinstance(p.grad, DTensor) and p.grad.placements == p.placements, name
                _close(p.grad.full_tensor(), q.grad, f"{dp}x{tp} grad of {name} at step {s}")
            opt.step()
            ref_opt.step()
        _check_params(model, plain, f"{dp}x{tp} after 3 steps")


def test_placements_and_pieces():
    for dp, tp in _layouts():
        model, mesh = _two_d(dp, tp)
        plain = _plain()
        d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
        want = {"up.weight": Shard(0), "up.bias": Shard(0), "down.weight": Shard(1),
                "down.bias": Replicate()}
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            assert isinstance(p, DTensor) and isinstance(p, nn.Parameter), name
            assert tuple(p.shape) == tuple(q.shape), name
            full = q.detach().numpy()
            if name in want:
                assert p.placements == (want[name], Shard(0)), (name, p.placements)
                assert p.device_mesh.mesh.tolist() == mesh.mesh.numpy().T.tolist()
                assert p.device_mesh.mesh_dim_names == ("tp", "dp")
                if want[name] != Replicate():  # the tensor-parallel piece: torch.chunk's
                    full = _chunk(full, want[name].dim, tp, t)
            else:
                assert p.placements == (Shard(0),) and p.device_mesh == mesh["dp"], name
            np.testing.assert_array_equal(p.to_local().detach().numpy(), _chunk(full, 0, dp, d),
                                          err_msg=name)


def _chunk(a, dim, n, i):
    c = -(-a.shape[dim] // n)
    index = [slice(None)] * a.ndim
    index[dim] = slice(min(i * c, a.shape[dim]), min((i + 1) * c, a.shape[dim]))
    return a[tuple(index)]


def test_the_module_sees_the_tensor_parallel_dtensors_in_forward():
    for dp, tp in _layouts():
        model, mesh = _two_d(dp, tp)
        seen = []
        model.up.register_forward_pre_hook(
            lambda m, a, seen=seen: seen.append((m.weight.device_mesh, m.weight.placements,
                                      tuple(m.weight.to_local().shape))))
        model(_batch(0, 0)[0])
        rows = -(-HIDDEN // tp)
        t = mesh.get_local_rank("tp")
        assert seen == [(mesh["tp"], (Shard(0),),
                         (max(0, min(rows, HIDDEN - t * rows)), IN))]
        # after forward the unit is resharded again
        assert model.up.weight.placements == (Shard(0), Shard(0))


def test_state_dict_round_trips():
    for dp, tp in _layouts():
        model, mesh = _two_d(dp, tp)
        opt = SGD(model.parameters(), lr=0.1)
        x, y = _batch(0, mesh.get_local_rank("dp"))
        _loss(model, x, y).backward()
        opt.step()
        sd = model.state_dict()
        assert list(sd) == list(_plain().state_dict())
        fulls = {k: v.full_tensor() for k, v in sd.items()}
        for k, v in sd.items():
            assert isinstance(v, DTensor), k
        with mt.no_grad():
            want = model(x).numpy()
        for how, values in (("2-D DTensors", sd), ("whole tensors", fulls)):
            other, _ = _two_d(dp, tp, seed=1)
            other.load_state_dict(values)
            with mt.no_grad():
                np.testing.assert_array_equal(other(x).numpy(), want, err_msg=how)
            for k, v in other.state_dict().items():
                np.testing.assert_array_equal(v.full_tensor().numpy(), fulls[k].numpy(),
                                              err_msg=f"{how}: {k}")
        # the tensor-parallel layout too (a tensor-parallel model's own state dict)
        tp_only = _plain(seed=2)
        tp_only.load_state_dict(fulls)
        parallelize_module(tp_only, mesh["tp"], {"up": ColwiseParallel(),
                                                 "down": RowwiseParallel()})
        other, _ = _two_d(dp, tp, seed=1)
        other.load_state_dict(tp_only.state_dict())
        with mt.no_grad():
            np.testing.assert_array_equal(other(x).numpy(), want)
        with pytest.raises(ValueError, match="'up.weight' is a tensor of shape"):
            other.load_state_dict({**sd, "up.weight": mt.zeros(3, 3)})


def test_prefetch_and_overlap_over_dp():
    for dp, tp in _layouts():
        model, mesh = _two_d(dp, tp)
        opt = SGD(model.parameters(), lr=0.1)
        x, y = _batch(0, mesh.get_local_rank("dp"))
        _loss(model, x, y).backward()  # the first forward records the order
        opt.step()
        units = [m._fsdp_state for m in (model.up, model.down, model.head)]
        in_flight = []
        model.up.register_forward_hook(
            lambda m, a, o, seen=in_flight, u=units[1]: seen.append(u.group._gather is not None))
        _loss(model, x, y).backward()
        assert in_flight == [True]
        assert all(u.group._reduce is None for u in units)


def test_mixed_precision_gathers_in_float32_and_reduces_in_float64():
    mp = MixedPrecisionPolicy(param_dtype=mt.float32, reduce_dtype=mt.float64,
                              output_dtype=mt.float64)
    for dp, tp in _layouts():
        model, mesh = _two_d(dp, tp, mp_policy=mp)
        plain = _plain()
        seen = []
        model.up.register_forward_pre_hook(lambda m, a, seen=seen: seen.append(m.weight.dtype))
        x, y = _batch(0, mesh.get_local_rank("dp"))
        gx, gy = _global_batch(0, dp)
        out = model(x)
        assert out.dtype == mt.float64 and seen == [mt.float32]
        np.testing.assert_allclose(out.detach().numpy(), plain(x).detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
        ((out - y) ** 2).mean().backward()
        _loss(plain, gx, gy).backward()
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            assert p.dtype == mt.float64 and p.grad.dtype == mt.float64, name
            np.testing.assert_allclose(p.grad.full_tensor().numpy(), q.grad.numpy(),
                                       rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.mpi(min_size=4)
def test_a_mismatch_on_a_sub_mesh_names_global_ranks():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mt.manual_seed(0)
    width = 5 if dist.get_rank() == 2 else 4
    line = [int(r) for r in mesh["dp"].mesh.numpy()]  # rank 0's line is [0, 2]
    if dist.get_rank() == 0:
        match = r"is \(\(3, 5\).*on rank 2 and \(\(3, 4\).*on rank 0"
    elif dist.get_rank() == 2:
        match = r"is \(\(3, 4\).*on rank 0 and \(\(3, 5\).*on rank 2"
    else:
        match = None
    if match is None:  # ranks 1 and 3: the same parameters on their line
        fully_shard(nn.Linear(width, 3), mesh=mesh["dp"])
    else:
        assert line == [0, 2]
        with pytest.raises(ValueError, match=match):
            fully_shard(nn.Linear(width, 3), mesh=mesh["dp"])


def test_bad_meshes_fail_clearly():
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (1, n), mesh_dim_names=("dp", "tp"))
    model = _plain()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel()})
    if n > 1:  # tensor parallel over the ranks fully_shard would shard over
        with pytest.raises(ValueError, match=r"shares ranks .* with the data-parallel mesh"):
            fully_shard(model.up, mesh=mesh["tp"])
    square = init_device_mesh("cpu", (1, n), mesh_dim_names=("a", "b"))
    from mpitensor.distributed.tensor import distribute_tensor

    two_d = _plain()
    two_d.up.weight = nn.Parameter(distribute_tensor(two_d.up.weight.detach(), square,
                                                     [Replicate(), Replicate()]))
    with pytest.raises(NotImplementedError, match="2-D mesh"):
        fully_shard(two_d.up, mesh=mesh["dp"])
    assert not isinstance(two_d.up, FSDPModule)


def test_gradient_accumulation_without_sync_equals_the_plain_model():
    for dp, tp in _layouts():
        model, mesh = _two_d(dp, tp)
        plain = _plain()
        for micro in range(2):
            model.set_requires_gradient_sync(micro == 1)
            x, y = _batch(10 + micro, mesh.get_local_rank("dp"))
            _loss(model, x, y).backward()
            _loss(plain, *_global_batch(10 + micro, dp)).backward()
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            _close(p.grad.full_tensor(), q.grad, f"{dp}x{tp} accumulated grad of {name}")


@pytest.fixture
def shared_dir():
    """A directory made by rank 0, known to every rank, removed after the test."""
    import shutil
    import tempfile

    box = [tempfile.mkdtemp(prefix="mt_fsdp_tp_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)
    yield box[0]
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(box[0], ignore_errors=True)


def test_distributed_checkpoint_reshards_between_layouts(shared_dir):
    """Saved from a tensor-parallel layout (2x2 at 4 ranks, 1xN at 2 and 3); loaded into every
    (dp, tp) layout and into the plain model: bit-exact."""
    import mpitensor.distributed.checkpoint as dcp
    from mpitensor.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    dp, tp = _layouts()[1] if len(_layouts()) > 1 else _layouts()[0]
    model, _ = _two_d(dp, tp)
    opt = SGD(model.parameters(), lr=0.1)
    _loss(model, *_batch(0, 0)).backward()
    opt.step()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    dcp.save(model.state_dict(), checkpoint_id=shared_dir)
    for dp2, tp2 in _layouts():
        other, _ = _two_d(dp2, tp2, seed=5)
        sd = other.state_dict()
        dcp.load(sd, checkpoint_id=shared_dir)
        other.load_state_dict(sd)
        for k, v in other.state_dict().items():
            np.testing.assert_array_equal(v.full_tensor().numpy(), full[k].numpy(),
                                          err_msg=f"{dp2}x{tp2}: {k}")
    plain = _plain(seed=5).state_dict()
    dcp.load(plain, checkpoint_id=shared_dir)
    for k, v in plain.items():
        np.testing.assert_array_equal(v.numpy(), full[k].numpy(), err_msg=f"plain: {k}")
