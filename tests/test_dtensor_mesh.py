"""DeviceMesh, the placements and compute_local_shape_and_global_offset at world size 1
(the multi-rank behaviour is in tests/mpi/test_dtensor_mesh.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import mpitensor.distributed as dist
from mpitensor.distributed.device_mesh import DeviceMesh, _check_grid, init_device_mesh
from mpitensor.distributed.tensor import Partial, Placement, Replicate, Shard
from mpitensor.distributed.tensor._utils import compute_local_shape_and_global_offset
from mpitensor.distributed.tensor.placement_types import shard_size_and_offset


@pytest.fixture(scope="module")
def world():
    """The default group (of one rank) these tests build their meshes on, for the module."""
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("mpi")
    yield dist.group.WORLD
    if ours:
        dist.destroy_process_group()


def test_placements_compare_print_and_pickle():
    assert Shard(1) == Shard(1) and Shard(1) != Shard(0) and Shard(0) != Replicate()
    assert hash(Shard(2)) == hash(Shard(2)) and Partial() == Partial("sum")
    assert (repr(Shard(1)), str(Shard(1))) == ("Shard(dim=1)", "S(1)")
    assert (repr(Replicate()), str(Replicate())) == ("Replicate()", "R")
    assert (repr(Partial("max")), str(Partial("max"))) == ("Partial(max)", "P(max)")
    assert Shard(0).is_shard() and Shard(0).is_shard(0) and not Shard(0).is_shard(1)
    assert Replicate().is_replicate() and not Replicate().is_shard()
    assert Partial("avg").is_partial() and Partial("avg").is_partial("avg")
    assert not Partial("avg").is_partial("sum")
    assert all(isinstance(p, Placement) for p in (Shard(0), Replicate(), Partial()))
    for p in (Shard(3), Replicate(), Partial("min")):
        assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(AttributeError):
        Shard(0).dim = 1


def test_placement_bad_arguments():
    with pytest.raises(ValueError, match="'mean'"):
        Partial("mean")
    with pytest.raises(TypeError, match="1.5"):
        Shard(1.5)


def test_chunk_split_matches_torch():
    torch = pytest.importorskip("torch", reason="torch is the oracle for the chunk split")
    from torch.distributed.tensor import Shard as TShard

    for n in range(0, 13):
        for k in range(1, 6):
            ours = [shard_size_and_offset(n, k, i) for i in range(k)]
            assert ours == [tuple(TShard.local_shard_size_and_offset(n, k, i))
                            for i in range(k)], (n, k)
            assert ours == [Shard.local_shard_size_and_offset(n, k, i) for i in range(k)]
            # and the sizes are torch.chunk's (padded with empty pieces)
            sizes = [c.shape[0] for c in torch.arange(n).chunk(k)] if n else []
            assert [s for s, _ in ours] == sizes + [0] * (k - len(sizes))


def test_mesh_of_one(world):
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    assert mesh.shape == (1, 1) and mesh.ndim == 2 and mesh.size() == 1
    assert mesh.size(0) == 1 and mesh.size("tp") == 1
    assert mesh.mesh.tolist() == [[0]] and mesh.device_type == "cpu"
    assert mesh.mesh_dim_names == ("dp", "tp") and mesh.get_coordinate() == [0, 0]
    assert mesh.get_local_rank("tp") == 0 and mesh.get_rank() == 0
    assert dist.get_process_group_ranks(mesh.get_group("dp")) == [0]
    tp = mesh["tp"]
    assert tp.ndim == 1 and tp.mesh_dim_names == ("tp",)
    assert tp.get_group() is mesh.get_group("tp") and tp.get_local_rank() == 0
    assert mesh["dp", "tp"] is mesh and mesh["tp", "dp"].mesh_dim_names == ("tp", "dp")
    assert mesh == DeviceMesh("cpu", [[0]], mesh_dim_names=("dp", "tp"))
    assert "dp=1" in repr(mesh) and "tp=1" in repr(mesh)
    t = mesh.mesh
    t.fill_(5)
    assert mesh.mesh.tolist() == [[0]]  # .mesh is a copy


def test_mesh_errors(world):
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    with pytest.raises(RuntimeError, match="2 dimensions"):
        mesh.get_group()
    with pytest.raises(RuntimeError, match="2 dimensions"):
        mesh.get_local_rank()
    with pytest.raises(KeyError, match="'pp'"):
        mesh["pp"]
    with pytest.raises(KeyError, match="'pp'"):
        mesh.get_group("pp")
    with pytest.raises(IndexError, match="mesh_dim 2"):
        mesh.size(2)
    with pytest.raises(ValueError, match=r"mesh_shape \(2, 2\) holds 4 ranks"):
        init_device_mesh("cpu", (2, 2))
    with pytest.raises(ValueError, match="2 mesh_dim_names"):
        init_device_mesh("cpu", (1,), mesh_dim_names=("a", "b"))
    with pytest.raises(ValueError, match="repeat"):
        init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "a"))
    with pytest.raises(ValueError, match="'tpu'"):
        init_device_mesh("tpu", (1,))
    with pytest.raises(ValueError, match=r"ranks \[3\]"):
        DeviceMesh("cpu", [3])
    with pytest.raises(ValueError, match=r"\[1, 0\] along mesh dim 0"):
        DeviceMesh("cpu", [1, 0]) if dist.get_world_size() > 1 else _check_grid(
            np.array([1, 0]), None, 2, "cpu")
    with pytest.raises(TypeError, match="integer ranks"):
        DeviceMesh("cpu", [0.5])
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(mesh)


def test_local_shape_and_offset(world):
    mesh = init_device_mesh("cpu", (1,))
    assert compute_local_shape_and_global_offset((10, 3), mesh, [Shard(0)]) == ((10, 3), (0, 0))
    assert compute_local_shape_and_global_offset((10, 3), mesh, [Shard(-1)]) == ((10, 3), (0, 0))
    assert compute_local_shape_and_global_offset((4,), mesh, (Replicate(),)) == ((4,), (0,))
    with pytest.raises(ValueError, match=r"Shard\(dim=2\) is beyond the tensor's 2"):
        compute_local_shape_and_global_offset((10, 3), mesh, [Shard(2)])
    with pytest.raises(ValueError, match="2 placements"):
        compute_local_shape_and_global_offset((10, 3), mesh, [Shard(0), Shard(1)])
    with pytest.raises(TypeError, match="'S'"):
        compute_local_shape_and_global_offset((10, 3), mesh, ["S"])


def test_torch_distributed_exports_the_mesh(world):
    """``torch.distributed.DeviceMesh`` and ``torch.distributed.init_device_mesh`` are the
    device_mesh module's, as in torch; a mesh made through them works."""
    assert dist.DeviceMesh is DeviceMesh and dist.init_device_mesh is init_device_mesh
    mesh = dist.init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    assert isinstance(mesh, dist.DeviceMesh) and mesh.size() == 1 and mesh["dp"].size() == 1
