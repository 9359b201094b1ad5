"""The shared results a group's peers write into (``backends/mpi/mapped.py``) and the compiled
copy that writes them (``_cpu_kernels.scatter_runs``), in one process: the pool recycles a
segment only once nothing refers to it, stays within its limits, and a peer maps only the
segment announced (its inode), never another file at that descriptor.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mpitensor.distributed.backends.mpi import mapped

pytestmark = pytest.mark.skipif(not mapped.available(), reason="needs memfd_create and /proc")


@pytest.fixture()
def pool(monkeypatch):
    p = mapped.Pool()
    yield p
    p.clear()


def test_a_segment_is_handed_out_again_only_once_nothing_holds_it(pool):
    a, fd, ino = pool.empty((4, 8), np.float32)
    assert a.shape == (4, 8) and a.dtype == np.float32 and a.flags.c_contiguous
    assert fd >= 0 and os.fstat(fd).st_ino == ino
    a[:] = 7
    row = a[2]
    del a
    b, fd_b, _ = pool.empty((4, 8), np.float32)  # a view of the first is alive: a new one
    assert fd_b != fd and len(pool) == 2
    assert (row == 7).all()
    del row
    c, fd_c, _ = pool.empty((32,), np.float32)  # same bytes, free now: reused
    assert fd_c == fd and len(pool) == 2
    del b, c


def test_the_pool_keeps_to_its_limits(pool):
    pool.MAX_BUFFERS = 2
    held = [pool.empty((16,), np.uint8)[0], pool.empty((16,), np.uint8)[0]]
    assert pool.empty((16,), np.uint8) is None  # every segment in use: none to give
    held.pop()
    got = pool.empty((32,), np.uint8)  # a free segment of another size is closed for it
    assert got is not None and len(pool) == 2
    pool.MAX_BUFFERS, pool.MAX_BYTES = 8, 40
    assert pool.empty((64,), np.uint8) is None  # past the bytes allowed


def test_a_peer_maps_the_announced_segment_and_writes_into_it(pool):
    peers = mapped.Peers()
    a, fd, ino = pool.empty((1000,), np.int32)
    theirs = peers.get(os.getpid(), fd, ino, a.nbytes)
    theirs.view(np.int32)[:] = np.arange(1000, dtype=np.int32)
    assert (a == np.arange(1000)).all()  # the same memory, through another mapping
    assert peers.get(os.getpid(), fd, ino, 16) is not None and len(peers) == 1  # kept


def test_a_peer_refuses_another_file_or_a_short_one(pool, tmp_path):
    peers = mapped.Peers()
    a, fd, ino = pool.empty((64,), np.uint8)
    with pytest.raises(OSError, match="not the segment"):
        peers.get(os.getpid(), fd, ino + 1, 64)
    with pytest.raises(OSError, match="not the segment"):
        peers.get(os.getpid(), fd, ino, 65)
    with pytest.raises(OSError):
        peers.get(os.getpid(), 10**6, ino, 64)  # no such descriptor
    path = tmp_path / "plain"
    path.write_bytes(b"x" * 64)
    other = os.open(path, os.O_RDONLY)
    try:  # a descriptor that is not the announced segment (a reused number, say)
        with pytest.raises(OSError):
            peers.get(os.getpid(), other, ino, 64)
    finally:
        os.close(other)
    assert len(peers) == 0
    del a


def test_peers_drop_the_least_recently_used_mapping(pool):
    peers = mapped.Peers()
    peers.MAX_MAPS = 2
    segs = [pool.empty((8,), np.uint8) for _ in range(3)]
    for _, fd, ino in segs:
        peers.get(os.getpid(), fd, ino, 8)
    assert len(peers) == 2


def test_scatter_runs_reads_each_row_once_into_every_destination():
    kernels = pytest.importorskip("mpitensor._cpu_kernels")
    scatter = getattr(kernels, "scatter_runs", None)
    if scatter is None:
        pytest.skip("_cpu_kernels predates scatter_runs")
    src = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    flat = src.reshape(-1).view(np.uint8)
    cols = [(0, 4), (4, 3), (7, 3)]  # three destinations: uneven column chunks
    dsts = [np.zeros((6, w), np.float32) for _, w in cols]
    rows = np.arange(6, dtype=np.int64)
    soffs = np.concatenate([rows * 40 + c * 4 for c, _ in cols])
    doffs = np.concatenate([rows * w * 4 for _, w in cols])
    runs = np.array([w * 4 for _, w in cols], np.int64)
    for stream in (0, 1):
        for d in dsts:
            d[:] = 0
        scatter([d.reshape(-1).view(np.uint8) for d in dsts], doffs, flat, soffs, runs, stream)
        for d, (c, w) in zip(dsts, cols):
            assert (d == src[:, c:c + w]).all()


def test_scatter_runs_checks_every_run_before_moving_a_byte():
    kernels = pytest.importorskip("mpitensor._cpu_kernels")
    scatter = getattr(kernels, "scatter_runs", None)
    if scatter is None:
        pytest.skip("_cpu_kernels predates scatter_runs")
    src, a, b = np.ones(64, np.uint8), np.zeros(32, np.uint8), np.zeros(32, np.uint8)
    offs = np.array([0, 16, 0, 17], np.int64)  # b's second run would end past b
    with pytest.raises(ValueError, match="leaves its buffer"):
        scatter([a, b], offs, src, np.array([0, 16, 32, 48], np.int64),
                np.array([16, 16], np.int64))
    assert not a.any() and not b.any()
    with pytest.raises(ValueError):
        scatter([a, b], offs[:3], src, offs[:3], np.array([16, 16], np.int64))
    with pytest.raises(ValueError):
        scatter([], offs, src, offs, np.zeros(0, np.int64))
    with pytest.raises(BufferError):
        scatter([a, b"read-only"], offs, src, offs, np.array([1, 1], np.int64))
