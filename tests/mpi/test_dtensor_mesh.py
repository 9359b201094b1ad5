"""DeviceMesh across ranks: the groups of each dimension, slicing, the cross-rank check, and
compute_local_shape_and_global_offset against the chunk split of the full tensor."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.device_mesh import DeviceMesh, init_device_mesh
from mpitensor.distributed.tensor import Replicate, Shard
from mpitensor.distributed.tensor._utils import compute_local_shape_and_global_offset


def grid_shapes(n):
    """The 1-D and 2-D mesh shapes a world of n ranks allows."""
    shapes = [(n,)]
    shapes += [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    return shapes


@pytest.mark.parametrize("which", [0, 1, 2])
def test_groups_follow_the_grid(which):
    n, me = dist.get_world_size(), dist.get_rank()
    shapes = grid_shapes(n)
    shape = shapes[which % len(shapes)]
    names = ("a", "b")[:len(shape)]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    grid = np.arange(n).reshape(shape)
    coord = [int(c) for c in np.argwhere(grid == me)[0]]
    assert mesh.get_coordinate() == coord
    for d, name in enumerate(names):
        line = np.moveaxis(grid, d, -1)[tuple(c for i, c in enumerate(coord) if i != d)]
        g = mesh.get_group(name)
        assert dist.get_process_group_ranks(g) == line.tolist()
        assert mesh.get_local_rank(d) == coord[d] == dist.get_rank(g)
        t = mt.tensor([float(me)])
        dist.all_reduce(t, group=g)
        assert t.item() == float(line.sum())
        sub = mesh[name]
        assert sub.mesh.tolist() == line.tolist() and sub.get_group() is g


@pytest.mark.mpi(min_size=4)
def test_two_by_two_slices():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    me = dist.get_rank()
    assert mesh["tp"].mesh.tolist() == [2 * (me // 2), 2 * (me // 2) + 1]
    assert mesh["dp"].mesh.tolist() == [me % 2, me % 2 + 2]
    swapped = mesh["tp", "dp"]
    assert swapped.mesh.tolist() == [[0, 2], [1, 3]]
    assert swapped.get_group("dp") is mesh.get_group("dp")
    if dist.get_world_size() == 4:
        assert mesh.get_group("tp") is not dist.group.WORLD


def _reduced(group):
    """The sum of the global ranks of ``group``'s members, through an all_reduce on it."""
    t = mt.tensor([float(dist.get_rank())])
    dist.all_reduce(t, group=group)
    return t.item()


@pytest.mark.mpi(min_size=4)
def test_flatten_merges_dimensions_and_the_root_learns_the_name():
    """torchtitan's pattern: a 3-D mesh, two dims flattened into one, then sliced beside the
    third by the new name; every group holds this rank's line of the row-major grid."""
    n, me = dist.get_world_size(), dist.get_rank()
    if n % 4:
        pytest.skip("needs a world of a multiple of 4 ranks (a 2 x 1 x 2 grid per 4)")
    shape = (n // 2, 1, 2)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("rep", "shard", "tp"))
    grid = np.arange(n).reshape(shape)
    flat = mesh["shard", "tp"]._flatten("shard_tp")
    line = grid[me // 2].reshape(-1).tolist()
    assert flat.mesh.tolist() == line and flat.mesh_dim_names == ("shard_tp",)
    assert dist.get_process_group_ranks(flat.get_group()) == line
    assert _reduced(flat.get_group()) == float(sum(line))
    assert mesh["shard_tp"].mesh.tolist() == line
    assert mesh["shard_tp"].get_group() is flat.get_group()
    hsdp = mesh["rep", "shard_tp"]
    assert hsdp.mesh.tolist() == grid.reshape(n // 2, 2).tolist()
    assert hsdp.get_group("rep") is mesh.get_group("rep")
    assert hsdp.get_local_rank("shard_tp") == me % 2 and hsdp._get_root_mesh() is mesh
    # the same name for the same dims again: the same group, no new communicator
    assert mesh["shard", "tp"]._flatten("shard_tp").get_group() is flat.get_group()
    # default name: the names joined
    whole = mesh._flatten()
    assert whole.mesh_dim_names == ("rep_shard_tp",) and whole.mesh.tolist() == list(range(n))
    assert _reduced(whole.get_group()) == float(n * (n - 1) // 2)
    with pytest.raises(ValueError, match="already names"):
        mesh["rep", "shard"]._flatten("shard_tp")
    with pytest.raises(ValueError, match="already a dimension"):
        mesh["shard", "tp"]._flatten("rep")
    with pytest.raises(KeyError, match="share a dimension"):
        mesh["tp", "shard_tp"]
    with pytest.raises(KeyError, match="not a dimension"):
        mesh["rep"]["shard_tp"]


@pytest.mark.mpi(min_size=2)
def test_unflatten_splits_a_dimension_into_new_groups():
    n, me = dist.get_world_size(), dist.get_rank()
    if n % 2:
        pytest.skip("needs an even world")
    world = init_device_mesh("cpu", (n,), mesh_dim_names=("world",))
    mesh = world._unflatten(0, (n // 2, 2), ("dp", "tp"))
    grid = np.arange(n).reshape(n // 2, 2)
    assert mesh.mesh.tolist() == grid.tolist() and mesh.mesh_dim_names == ("dp", "tp")
    assert mesh.get_coordinate() == [me // 2, me % 2]
    assert dist.get_process_group_ranks(mesh.get_group("tp")) == grid[me // 2].tolist()
    assert dist.get_process_group_ranks(mesh.get_group("dp")) == grid[:, me % 2].tolist()
    assert _reduced(mesh.get_group("dp")) == float(grid[:, me % 2].sum())
    with pytest.raises(ValueError, match="do not split"):
        world._unflatten(0, (n, 2), ("a", "b"))


@pytest.mark.mpi(min_size=2)
def test_from_group_wraps_existing_groups_without_communication():
    n, me = dist.get_world_size(), dist.get_rank()
    half = [r for r in range(n) if r % 2 == me % 2]
    groups = [dist.new_group([r for r in range(n) if r % 2 == k]) for k in (0, 1)]
    mine = groups[me % 2]
    mesh = DeviceMesh.from_group(mine, "cpu", mesh_dim_names=("x",))
    assert mesh.mesh.tolist() == half and mesh.get_group() is mine
    assert mesh.get_local_rank() == half.index(me)
    assert _reduced(mesh.get_group()) == float(sum(half))
    whole = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    assert whole.mesh.tolist() == list(range(n))
    with pytest.raises(ValueError, match="need mesh="):
        DeviceMesh.from_group([mine, mine], "cpu")
    with pytest.raises(ValueError, match="holds ranks"):
        DeviceMesh.from_group(mine, "cpu", mesh=list(range(n)))


@pytest.mark.mpi(min_size=2)
def test_different_meshes_fail_on_every_rank():
    n, me = dist.get_world_size(), dist.get_rank()
    names = ("x",) if me == 0 else ("y",)
    with pytest.raises(ValueError, match="different meshes"):
        init_device_mesh("cpu", (n,), mesh_dim_names=names)
    shape = (n,) if me else (1, n)  # rank 0's shape has a right product but another form
    with pytest.raises(ValueError, match="different meshes"):
        init_device_mesh("cpu", shape)
    shape = (n,) if me else (n + 1,)  # a bad shape on rank 0 only: all ranks raise
    with pytest.raises(ValueError):
        init_device_mesh("cpu", shape)
    # and the world still works afterwards
    t = mt.ones(1)
    dist.all_reduce(t)
    assert t.item() == n


@pytest.mark.mpi(min_size=2)
def test_mesh_without_this_rank():
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = DeviceMesh("cpu", list(range(n - 1)))
    if me == n - 1:
        assert mesh.get_coordinate() is None
        assert compute_local_shape_and_global_offset((5,), mesh, [Shard(0)]) == ((0,), ())
        with pytest.raises(RuntimeError, match="not in the mesh"):
            mesh.get_group()
    else:
        assert dist.get_process_group_ranks(mesh.get_group()) == list(range(n - 1))


@pytest.mark.parametrize("gshape", [(10, 3), (3, 5), (1, 7), (0, 2)])
def test_local_shape_and_offset_cover_the_tensor(gshape):
    n = dist.get_world_size()
    full = np.arange(int(np.prod(gshape))).reshape(gshape)
    for shape in grid_shapes(n):
        mesh = init_device_mesh("cpu", shape)
        for placements in ([Shard(0)] * len(shape), [Shard(1)] + [Replicate()] * (len(shape) - 1),
                           [Shard(1), Shard(0)][:len(shape)], [Replicate()] * len(shape)):
            lshape, off = compute_local_shape_and_global_offset(gshape, mesh, placements)
            piece = full[tuple(slice(o, o + s) for o, s in zip(off, lshape))]
            assert piece.shape == lshape
            # every element of the tensor is held by some rank, as often as it is replicated
            count = np.zeros(gshape, np.int64)
            count[tuple(slice(o, o + s) for o, s in zip(off, lshape))] = 1
            total = mt.from_numpy(count)
            dist.all_reduce(total)
            reps = int(np.prod([shape[d] for d, p in enumerate(placements)
                                if p == Replicate()]))
            assert (total.numpy() == reps).all(), (shape, placements)
