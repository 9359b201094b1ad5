"""Checkpoints across ranks: rank 0 writes, every rank loads the same values, and a bad file or a
failed save raises the same CheckpointError on every rank.

Run with ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_checkpoint_mpi.py`` (N = 1..4).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.checkpoint import CheckpointError, load, load_on_all_ranks, save, save_on_rank0


@pytest.fixture
def shared_dir():
    """A directory made by rank 0, known to every rank, removed after the test."""
    box = [tempfile.mkdtemp(prefix="mt_ckpt_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)
    yield box[0]
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(box[0], ignore_errors=True)


def _payload(rank: int) -> dict:
    """A checkpoint-like object that differs from rank to rank."""
    rng = np.random.default_rng(rank)
    return {"model": {"fc.weight": mt.tensor(rng.standard_normal((4, 3))),
                      "fc.bias": mt.tensor(np.full(4, float(rank)))},
            "optimizer": {"state": {0: {"momentum_buffer": mt.tensor(rng.standard_normal(4))}},
                          "param_groups": [{"lr": 0.1, "params": [0]}]},
            "epoch": 7 + rank, "rng": rng.bit_generator.state, "rank": rank}


def _digest(obj) -> str:
    """A hash of every value in the tree, to compare what the ranks loaded."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, mt.Tensor):
            walk(x._data)
        elif isinstance(x, np.ndarray):
            h.update(f"{x.dtype}{x.shape}".encode())
            h.update(x.tobytes())
        elif isinstance(x, dict):
            for k in x:
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


def _all_same(value) -> list:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


@pytest.mark.parametrize("read_on_rank0", [False, True])
def test_rank0_writes_every_rank_loads_the_same(shared_dir, read_on_rank0):
    rank = dist.get_rank()
    path = os.path.join(shared_dir, "ckpt.mt")
    save_on_rank0(_payload(rank), path)
    assert os.path.exists(path)  # complete as soon as save_on_rank0 returns
    out = load_on_all_ranks(path, read_on_rank0=read_on_rank0)
    want = _payload(0)
    assert out["rank"] == 0 and out["epoch"] == 7 and out["rng"] == want["rng"]
    np.testing.assert_array_equal(out["model"]["fc.weight"]._data, want["model"]["fc.weight"]._data)
    np.testing.assert_array_equal(out["model"]["fc.bias"]._data, np.zeros(4))
    np.testing.assert_array_equal(out["optimizer"]["state"][0]["momentum_buffer"]._data,
                                  want["optimizer"]["state"][0]["momentum_buffer"]._data)
    digests = _all_same(_digest(out))
    assert digests == [_digest(want)] * dist.get_world_size()
    leftovers = [n for n in os.listdir(shared_dir) if n != "ckpt.mt"]
    assert leftovers == []


def test_overwrite_keeps_rank0_content(shared_dir):
    path = os.path.join(shared_dir, "ckpt.mt")
    for epoch in range(3):
        save_on_rank0({"epoch": epoch, "rank": dist.get_rank()}, path)
        assert load_on_all_ranks(path) == {"epoch": epoch, "rank": 0}


@pytest.mark.parametrize("read_on_rank0", [False, True])
def test_corrupt_file_same_error_on_every_rank(shared_dir, read_on_rank0):
    path = os.path.join(shared_dir, "bad.mt")
    if dist.get_rank() == 0:
        save({"w": np.arange(50.0)}, path)
        data = bytearray(open(path, "rb").read())
        data[-10] ^= 0xFF
        with open(path, "wb") as fh:
            fh.write(bytes(data))
    dist.barrier()
    with pytest.raises(CheckpointError) as ei:
        load_on_all_ranks(path, read_on_rank0=read_on_rank0)
    msg = str(ei.value)
    assert "bad.mt" in msg and "SHA-256" in msg
    assert _all_same(msg) == [msg] * dist.get_world_size()


def test_missing_file_same_error_on_every_rank(shared_dir):
    path = os.path.join(shared_dir, "nope.mt")
    with pytest.raises(CheckpointError) as ei:
        load_on_all_ranks(path)
    msg = str(ei.value)
    assert "nope.mt" in msg and "FileNotFoundError" in msg
    assert f"rank(s) {list(range(dist.get_world_size()))}" in msg
    assert _all_same(msg) == [msg] * dist.get_world_size()


@pytest.mark.mpi(min_size=2)
def test_file_bad_on_some_ranks_only(shared_dir):
    """Rank 0 sees a good file, the others a missing one: every rank raises the same error."""
    rank = dist.get_rank()
    good = os.path.join(shared_dir, "good.mt")
    save_on_rank0({"a": 1}, good)
    path = good if rank == 0 else os.path.join(shared_dir, "absent.mt")
    with pytest.raises(CheckpointError) as ei:
        load_on_all_ranks(path)
    msg = str(ei.value)
    assert f"rank(s) {list(range(1, dist.get_world_size()))}" in msg and "absent.mt" in msg
    assert _all_same(msg) == [msg] * dist.get_world_size()


def test_failed_save_same_error_on_every_rank(shared_dir):
    path = os.path.join(shared_dir, "no_such_dir", "ckpt.mt")
    with pytest.raises(CheckpointError) as ei:
        save_on_rank0({"a": np.ones(3)}, path)
    msg = str(ei.value)
    assert "rank 0 failed to save" in msg and "no_such_dir" in msg
    assert _all_same(msg) == [msg] * dist.get_world_size()
    # an object refused on rank 0 (the strict format) is also reported everywhere
    with pytest.raises(CheckpointError, match="TypeError: cannot save obj"):
        save_on_rank0({"a": object()}, os.path.join(shared_dir, "x.mt"), allow_pickle=False)
    assert not os.path.exists(os.path.join(shared_dir, "x.mt"))


@pytest.mark.mpi(min_size=2)
def test_sub_group_rank0_is_its_first_member(shared_dir):
    size, rank = dist.get_world_size(), dist.get_rank()
    members = list(range(1, size))
    group = dist.new_group(members)
    path = os.path.join(shared_dir, "sub.mt")
    if rank in members:
        save_on_rank0({"writer": rank}, path, group=group)
        assert load_on_all_ranks(path, group=group, read_on_rank0=True) == {"writer": 1}
    dist.barrier()
    assert load(path) == {"writer": 1}
