"""Distributed checkpoints across ranks: parallel per-rank files, resharding, errors everywhere.

Run with ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_dcp.py`` (N = 1..4).
Saving at 4 ranks and loading at 1, 2 and 3 (separate jobs) is tests/test_dcp_reshard.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator, Tuple

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.distributed.checkpoint as dcp

try:
    from mpitensor.distributed.tensor import (
        DTensor,
        Replicate,
        Shard,
        distribute_tensor,
        init_device_mesh,
    )
except ImportError:  # pragma: no cover - the DTensor layer is built beside this one
    DTensor = None

from .torch_gloo import torch_gloo_fixture  # noqa: F401,E402 - the fixture torch_gloo

needs_dtensor = pytest.mark.skipif(DTensor is None, reason="mpitensor.distributed.tensor "
                                   "has no DTensor yet")


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A directory made by rank 0, known to every rank, removed after the test."""
    box = [tempfile.mkdtemp(prefix="mt_dcp_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)
    yield box[0]
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(box[0], ignore_errors=True)


def _chunk(n: int, k: int, i: int) -> Tuple[int, int]:
    """torch.chunk's split of n into k: (offset, length) of piece i (maybe empty)."""
    size = -(-n // k)
    start = min(i * size, n)
    return start, min(size, n - start)


def _full(shape: Tuple[int, ...], salt: float = 0.0) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * 0.25 + salt


def _rows(full: np.ndarray) -> dcp.LocalShard:
    start, n = _chunk(full.shape[0], dist.get_world_size(), dist.get_rank())
    local = mt.from_numpy(full[start:start + n].copy())
    return dcp.LocalShard(local, full.shape, (start, 0))


def _cols(shape: Tuple[int, ...], dtype=mt.float32) -> dcp.LocalShard:
    start, n = _chunk(shape[1], dist.get_world_size(), dist.get_rank())
    return dcp.LocalShard(mt.zeros(shape[0], n, dtype=dtype), shape, (0, start))


def test_each_rank_writes_its_rows_and_loads_columns(shared_dir: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    full = _full((10, 6))
    ck = os.path.join(shared_dir, "ck")
    meta = dcp.save({"w": _rows(full), "bias": mt.arange(6.0), "step": 11}, checkpoint_id=ck)
    chunks = meta.state_dict_metadata["w"].chunks
    expected = [(_chunk(10, size, r)[0], _chunk(10, size, r)[1]) for r in range(size)]
    assert [(c.offsets[0], c.sizes[0]) for c in chunks] == [e for e in expected if e[1]]
    # every chunk of w lies in the file of the rank that held it
    for c in chunks:
        info = meta.storage_data[dcp.MetadataIndex("w", c.offsets)]
        holder = next(r for r in range(size) if _chunk(10, size, r)[0] == c.offsets[0])
        assert info.relative_path == f"__{holder}_0.distcp"
    target = {"w": _cols((10, 6)), "bias": mt.zeros(6), "step": 0}
    dcp.load(target, checkpoint_id=ck)
    start, n = _chunk(6, size, rank)
    assert target["w"].tensor.numpy().tobytes() == full[:, start:start + n].tobytes()
    assert target["bias"].numpy().tobytes() == np.arange(6.0, dtype=np.float32).tobytes()
    assert target["step"] == 11


def test_replicated_tensors_are_written_once_spread_over_ranks(shared_dir: str) -> None:
    size = dist.get_world_size()
    sd = {f"t{i}": mt.full((64,), float(i)) for i in range(8)}
    meta = dcp.save(sd, checkpoint_id=os.path.join(shared_dir, "ck"))
    files = [meta.storage_data[dcp.MetadataIndex(f"t{i}", (0,))].relative_path for i in range(8)]
    per_rank = [files.count(f"__{r}_0.distcp") for r in range(size)]
    assert sum(per_rank) == 8 and max(per_rank) - min(per_rank) <= 1, per_rank
    assert all(len(meta.state_dict_metadata[f"t{i}"].chunks) == 1 for i in range(8))
    back = {f"t{i}": mt.zeros(64) for i in range(8)}
    dcp.load(back, checkpoint_id=os.path.join(shared_dir, "ck"))
    assert all(np.all(back[f"t{i}"].numpy() == i) for i in range(8))


def test_a_mismatch_on_one_rank_fails_on_every_rank_before_writing(shared_dir: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    ck = os.path.join(shared_dir, "ck")
    dcp.save({"a": mt.ones(4, 2), "b": mt.ones(3)}, checkpoint_id=ck)
    a = mt.zeros(4, 2)
    b = mt.zeros(2) if rank == size - 1 else mt.zeros(3)
    with pytest.raises(ValueError, match=r"'b' has shape \(2,\) here but \(3,\)") as info:
        dcp.load({"a": a, "b": b}, checkpoint_id=ck)
    if size > 1:
        assert f"rank {size - 1}:" in str(info.value)
    assert not a.numpy().any() and not b.numpy().any()


@pytest.mark.mpi(min_size=2)
def test_ranks_that_disagree_on_a_shape_fail_together(shared_dir: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    ck = os.path.join(shared_dir, "ck")
    shape = (3, 2) if rank == size - 1 else (2, 3)
    with pytest.raises(ValueError, match=r"'w' is a float32 tensor of shape \(2, 3\) on rank 0 "
                                         rf"but a float32 tensor of shape \(3, 2\) on rank "
                                         rf"{size - 1}"):
        dcp.save({"w": mt.zeros(*shape)}, checkpoint_id=ck)
    assert not os.path.exists(ck) and os.listdir(shared_dir) == []


def test_only_overlapping_files_are_read(shared_dir: str) -> None:
    """A rank whose box lies in one rank's chunk loads with every other data file gone."""
    rank, size = dist.get_rank(), dist.get_world_size()
    full = _full((8, 3), 1.0)
    ck = os.path.join(shared_dir, "ck")
    dcp.save({"w": _rows(full)}, checkpoint_id=ck)
    dist.barrier()
    if rank == 0:
        for r in range(1, size):
            os.remove(os.path.join(ck, f"__{r}_0.distcp"))
        dest = mt.zeros(2, 3)
        dcp.load({"w": dcp.LocalShard(dest, (8, 3), (0, 0))}, checkpoint_id=ck, no_dist=True)
        assert dest.numpy().tobytes() == full[:2].tobytes()
    dist.barrier()


@needs_dtensor
def test_dtensor_shard_rows_load_as_columns_and_replicated(shared_dir: str) -> None:
    size = dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,))
    full = _full((7, 5), 2.0)
    dt = distribute_tensor(mt.from_numpy(full.copy()), mesh, [Shard(0)])
    ck = os.path.join(shared_dir, "ck")
    meta = dcp.save({"dt": dt}, checkpoint_id=ck)
    assert len(meta.state_dict_metadata["dt"].chunks) == min(size, 7)
    cols = distribute_tensor(mt.zeros(7, 5), mesh, [Shard(1)])
    rep = distribute_tensor(mt.zeros(7, 5), mesh, [Replicate()])
    dcp.load({"dt": cols}, checkpoint_id=ck)
    dcp.load({"dt": rep}, checkpoint_id=ck)
    assert cols.full_tensor().detach().numpy().tobytes() == full.tobytes()
    assert rep.to_local().numpy().tobytes() == full.tobytes()


@needs_dtensor
@pytest.mark.mpi(min_size=4)
def test_dtensor_on_a_2x2_mesh_reshards_to_the_other_layout(shared_dir: str) -> None:
    if dist.get_world_size() != 4:
        pytest.skip("the 2x2 mesh needs exactly 4 ranks")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    full = _full((6, 5), 3.0)
    dt = distribute_tensor(mt.from_numpy(full.copy()), mesh, [Shard(0), Shard(1)])
    rep = distribute_tensor(mt.from_numpy(full.copy()), mesh, [Replicate(), Shard(0)])
    ck = os.path.join(shared_dir, "ck")
    meta = dcp.save({"dt": dt, "rep": rep}, checkpoint_id=ck)
    assert len(meta.state_dict_metadata["rep"].chunks) == 2  # replicated over dp: written once
    other = distribute_tensor(mt.zeros(6, 5), mesh, [Shard(1), Replicate()])
    other_rep = distribute_tensor(mt.zeros(6, 5), mesh, [Shard(1), Shard(0)])
    dcp.load({"dt": other, "rep": other_rep}, checkpoint_id=ck)
    assert other.full_tensor().detach().numpy().tobytes() == full.tobytes()
    assert other_rep.full_tensor().detach().numpy().tobytes() == full.tobytes()


@pytest.mark.mpi(min_size=2)
def test_ranks_naming_different_directories_fail_together(shared_dir: str) -> None:
    mine = os.path.join(shared_dir, f"ck{dist.get_rank()}")
    with pytest.raises(ValueError, match="the ranks name different checkpoint directories"):
        dcp.save({"a": mt.ones(2)}, checkpoint_id=mine)
    assert os.listdir(shared_dir) == []
    with pytest.raises(ValueError, match="the ranks name different checkpoint directories"):
        dcp.load({"a": mt.ones(2)}, checkpoint_id=mine)


def _whole(x: object) -> bytes:
    return x.full_tensor().detach().numpy().tobytes()


def _sharded_linear(placement: object, seed: int) -> Tuple[object, object]:
    from mpitensor import nn, optim

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mt.manual_seed(seed)
    model = nn.Linear(5, 6)
    for name, p in list(model.named_parameters()):
        setattr(model, name, nn.Parameter(distribute_tensor(p.detach(), mesh, [placement])))
    return model, optim.Adam(model.parameters(), lr=0.1)


def _step(model: object, opt: object, k: float) -> None:
    for p in model.parameters():
        p.grad = p.detach() * k + 1.0
    opt.step()


@needs_dtensor
def test_sharded_model_and_optimizer_resume_under_another_placement(shared_dir: str) -> None:
    from mpitensor.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    model, opt = _sharded_linear(Shard(0), 0)
    _step(model, opt, 0.5)
    _step(model, opt, -0.25)
    msd, osd = get_state_dict(model, opt)
    assert isinstance(msd["weight"], DTensor) and isinstance(osd["state"]["weight"]["exp_avg"],
                                                              DTensor)
    ck = os.path.join(shared_dir, "ck")
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ck)

    other, other_opt = _sharded_linear(Replicate(), 7)
    msd2, osd2 = get_state_dict(other, other_opt)
    sd = {"model": msd2, "optim": osd2}
    dcp.load(sd, checkpoint_id=ck)
    set_state_dict(other, other_opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    after = get_state_dict(other, other_opt)[1]["state"]
    for name in ("weight", "bias"):
        want = getattr(model, name).full_tensor().detach().numpy()
        assert getattr(other, name).full_tensor().detach().numpy().tobytes() == want.tobytes()
        for key in ("exp_avg", "exp_avg_sq"):
            assert _whole(after[name][key]) == _whole(osd["state"][name][key])
        assert float(after[name]["step"]) == 2.0
    full = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))[0]
    assert not isinstance(full["weight"], DTensor)
    assert full["weight"].detach().numpy().tobytes() == _whole(model.weight)
    # a full state dict loads into the sharded model: each rank keeps its rows
    fresh, fresh_opt = _sharded_linear(Shard(0), 3)
    set_state_dict(fresh, fresh_opt, model_state_dict=full, optim_state_dict={})
    assert _whole(fresh.weight) == full["weight"].detach().numpy().tobytes()


@needs_dtensor
def test_torch_and_we_read_each_others_sharded_checkpoints(shared_dir: str,
                                                          torch_gloo: object) -> None:
    """torch's DTensors (gloo) saved by torch load into ours resharded, and the other way."""
    torch = torch_gloo
    import torch.distributed.checkpoint as tdcp
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import distribute_tensor as torch_distribute

    size = dist.get_world_size()
    full = _full((7, 5), 4.0)
    tmesh = torch_mesh("cpu", (size,))
    theirs = os.path.join(shared_dir, "theirs")
    tdcp.save({"x": torch_distribute(torch.from_numpy(full.copy()), tmesh, [TShard(0)]),
               "n": 5}, checkpoint_id=theirs)
    mesh = init_device_mesh("cpu", (size,))
    mine = distribute_tensor(mt.zeros(7, 5), mesh, [Shard(1)])
    sd = {"x": mine, "n": 0}
    dcp.load(sd, checkpoint_id=theirs)
    assert mine.full_tensor().numpy().tobytes() == full.tobytes() and sd["n"] == 5

    ours = os.path.join(shared_dir, "ours")
    dcp.save({"x": distribute_tensor(mt.from_numpy(full.copy()), mesh, [Shard(0)]), "n": 6},
             checkpoint_id=ours)
    target = {"x": torch_distribute(torch.zeros(7, 5), tmesh, [TShard(1)]), "n": 0}
    tdcp.load(target, checkpoint_id=ours)
    assert target["x"].full_tensor().numpy().tobytes() == full.tobytes() and target["n"] == 6


class _FailOnLastRank(dcp.FileSystemWriter):
    def write_item(self, fh: object, fqn: str, obj: object) -> object:
        if dist.get_rank() == dist.get_world_size() - 1:
            raise OSError(28, "No space left on device")
        return super().write_item(fh, fqn, obj)


def test_a_rank_that_fails_to_write_fails_the_save_everywhere(shared_dir: str) -> None:
    ck = os.path.join(shared_dir, "ck")
    full = _full((8, 2))
    dcp.save({"w": _rows(full)}, checkpoint_id=ck)
    before = sorted(os.listdir(ck))
    last = dist.get_world_size() - 1
    with pytest.raises(dcp.CheckpointError, match=rf"rank {last} could not write its file: "
                                                  r".*No space left on device"):
        dcp.save({"w": _rows(full + 1)}, storage_writer=_FailOnLastRank(ck))
    dist.barrier()
    assert sorted(os.listdir(ck)) == before and os.listdir(shared_dir) == ["ck"]
    back = _cols((8, 2))
    dcp.load({"w": back}, checkpoint_id=ck)
    start, n = _chunk(2, dist.get_world_size(), dist.get_rank())
    assert back.tensor.numpy().tobytes() == full[:, start:start + n].tobytes()


def test_empty_trailing_shards_write_nothing(shared_dir: str) -> None:
    """Two rows over 3 or 4 ranks: the trailing ranks hold empty shards, saved and loaded."""
    size = dist.get_world_size()
    full = _full((2, 3), 5.0)
    ck = os.path.join(shared_dir, "ck")
    meta = dcp.save({"w": _rows(full), "e": mt.zeros(0, 4)}, checkpoint_id=ck)
    assert [c.sizes for c in meta.state_dict_metadata["w"].chunks] == \
        [(_chunk(2, size, r)[1], 3) for r in range(size) if _chunk(2, size, r)[1]]
    assert meta.state_dict_metadata["e"].chunks == [dcp.ChunkStorageMetadata((0, 0), (0, 4))]
    back = _rows(np.zeros((2, 3), np.float32))
    empty = mt.ones(0, 4)
    dcp.load({"w": back, "e": empty}, checkpoint_id=ck)
    start, n = _chunk(2, size, dist.get_rank())
    assert back.tensor.numpy().tobytes() == full[start:start + n].tobytes()


def test_a_rank_with_nothing_to_write_leaves_no_file(shared_dir: str) -> None:
    size = dist.get_world_size()
    meta = dcp.save({"one": mt.ones(3)}, checkpoint_id=os.path.join(shared_dir, "ck"))
    writer = meta.storage_data[dcp.MetadataIndex("one", (0,))].relative_path
    assert sorted(os.listdir(os.path.join(shared_dir, "ck"))) == [".metadata", writer]
    assert writer in {f"__{r}_0.distcp" for r in range(size)}
