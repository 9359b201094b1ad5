"""mpitensor.data across ranks: DistributedSampler shards, evaluation mode, resume, download.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_data_mpi.py`` (N = 1..4).
Every rank asserts on the gathered results of all ranks.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import mpitensor
import mpitensor.distributed as dist
from mpitensor.data import DataLoader, DistributedEvalSampler, DistributedSampler, TensorDataset
from mpitensor.data import mnist as mnist_mod
from mpitensor.data.datasets import MNIST, DownloadError

from ..test_data import _Server

SHARED_MNIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"
SIZES = [1, 5, 7, 16, 23]


def _interleave(shards: list) -> list:
    """Undo ``indices[rank:total:world]``: the order the shards were cut from."""
    out = []
    for i in range(max(map(len, shards))):
        out.extend(s[i] for s in shards if i < len(s))
    return out


def _expected(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    if shuffle:
        return mpitensor.randperm(n, generator=mpitensor.Generator().manual_seed(seed + epoch))\
            .numpy()
    return np.arange(n)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_union_is_the_padded_permutation(shuffle, drop_last):
    world = dist.get_world_size()
    for n in SIZES:
        for epoch in (0, 3):
            s = DistributedSampler(range(n), shuffle=shuffle, seed=11, drop_last=drop_last)
            assert s.num_replicas == world and s.rank == dist.get_rank()
            s.set_epoch(epoch)
            shards: list = [None] * world
            dist.all_gather_object(shards, list(s))
            assert len({len(x) for x in shards}) == 1  # equal shards: DDP steps stay in step
            perm = _expected(n, shuffle, 11, epoch)
            if drop_last:
                want = perm[:(n // world) * world]
            else:
                want = np.resize(perm, -(-n // world) * world)
            assert _interleave(shards) == want.tolist(), (n, epoch, shards)


@pytest.mark.parametrize("shuffle", [False, True])
def test_eval_mode_partitions_exactly(shuffle):
    world = dist.get_world_size()
    for n in SIZES + [2]:
        s = DistributedSampler(range(n), shuffle=shuffle, even=False, seed=2)
        shards: list = [None] * world
        dist.all_gather_object(shards, list(s))
        assert sorted(sum(shards, [])) == list(range(n))
        assert _interleave(shards) == _expected(n, shuffle, 2, 0).tolist()
        e = DistributedEvalSampler(range(n))
        same: list = [None] * world
        dist.all_gather_object(same, list(e))
        assert same == [list(DistributedSampler(range(n), world, r, shuffle=False, even=False))
                        for r in range(world)]


def test_resume_mid_epoch_on_every_rank():
    ds = TensorDataset(mpitensor.arange(41.0), mpitensor.arange(41))

    def run(state=None, stop=None):
        s = DistributedSampler(ds, seed=5)
        if state is not None:
            s.load_state_dict(state)
        s.set_epoch(2)
        out, st = [], None
        for k, (_, y) in enumerate(DataLoader(ds, batch_size=3, sampler=s)):
            out.append(y.tolist())
            if k == stop:
                st = s.state_dict()
                break
        return out, st

    full, _ = run()
    head, state = run(stop=1)
    tail, _ = run(state=state)
    assert head + tail == full
    both: list = [None] * dist.get_world_size()
    dist.all_gather_object(both, (full, head + tail))
    assert all(f == r for f, r in both)


def _shared_tmpdir() -> Path:
    path = [tempfile.mkdtemp(prefix="mt_mnist_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(path, src=0)
    return Path(path[0])


@pytest.mark.skipif(not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
                    reason=f"the shared MNIST test set is not at {SHARED_MNIST}")
def test_rank0_downloads_others_wait(monkeypatch):
    t10k = tuple(r for r in mnist_mod.MNIST_RESOURCES if r[0].startswith("t10k"))
    monkeypatch.setattr(mnist_mod, "MNIST_RESOURCES", t10k)  # the train files are not shared
    tmp = _shared_tmpdir()
    server = None
    try:
        url = [None]
        if dist.get_rank() == 0:
            served = tmp / "served"
            served.mkdir()
            for name, _, _ in t10k:
                shutil.copy(SHARED_MNIST / name, served / name)
            server = _Server(served)
            url[0] = server.url
        dist.broadcast_object_list(url, src=0)
        ds = MNIST(tmp / "root", train=False, download=True, mirrors=[url[0]])
        sums: list = [None] * dist.get_world_size()
        dist.all_gather_object(sums, (len(ds), int(ds.targets.numpy().sum()),
                                      int(ds.data.numpy()[::97].sum())))
        assert len(set(sums)) == 1 and sums[0][0] == 10000
        count = [len(server.requests) if server else None]
        dist.broadcast_object_list(count, src=0)
        assert count[0] == len(t10k)  # one request per file: only rank 0 downloaded
        # a failed download on rank 0 is raised on every rank (nobody hangs)
        with pytest.raises(DownloadError, match="t10k"):
            MNIST(tmp / "empty", train=False, download=True,
                  mirrors=[url[0] + "missing/"])
    finally:
        dist.barrier()
        if server is not None:
            server.close()
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
