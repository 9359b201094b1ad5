"""``backends/mpi/cma_runs.transfer``: runs moved with process_vm_readv/writev, here between
this process and itself (the kernel allows a process its own memory): every run lands where
its offsets say, in calls of at most ``_IOV_MAX`` runs, runs that lie end to end merged, and
a range outside the mapped memory raises CmaError."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mpitensor.distributed.backends.mpi import cma_runs
from mpitensor.distributed.backends.mpi.cma import CmaError

pytestmark = pytest.mark.skipif(not cma_runs.available(), reason="no process_vm_readv here")


def _allowed() -> bool:
    a, b = np.arange(4, dtype=np.uint8), np.zeros(4, np.uint8)
    try:
        cma_runs.transfer(os.getpid(), False, b.ctypes.data, np.zeros(1, np.int64),
                          a.ctypes.data, np.zeros(1, np.int64), 4)
    except OSError:
        return False
    return bool((a == b).all())


@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("iov_max", [1024, 3])
def test_runs_land_where_the_offsets_say(monkeypatch, write, iov_max):
    if not _allowed():
        pytest.skip("the kernel refuses cross-memory attach here (ptrace restricted)")
    monkeypatch.setattr(cma_runs, "_IOV_MAX", iov_max)
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, np.uint8)
    run = 24
    here = np.array([0, 24, 48, 500, 1000, 1024, 3000], np.int64)  # some end to end
    there = np.array([7, 100, 124, 148, 2000, 2024, 4000], np.int64)
    if write:  # from src here into "the peer's" dst
        cma_runs.transfer(os.getpid(), True, src.ctypes.data, here, dst.ctypes.data, there, run)
        pairs = zip(there, here)
    else:  # from "the peer's" src into dst here
        cma_runs.transfer(os.getpid(), False, dst.ctypes.data, here, src.ctypes.data, there, run)
        pairs = zip(here, there)
    want = np.zeros(4096, np.uint8)
    for d, s in pairs:
        want[d:d + run] = src[s:s + run]
    assert dst.tobytes() == want.tobytes()


def test_ranges_merge_runs_that_lie_end_to_end():
    iov = cma_runs._ranges(1000, np.array([0, 8, 16, 40, 48, 100], np.int64), 8)
    assert iov.tolist() == [[1000, 24], [1040, 16], [1100, 8]]


def test_memory_outside_the_mapping_raises():
    if not _allowed():
        pytest.skip("the kernel refuses cross-memory attach here (ptrace restricted)")
    dst = np.zeros(64, np.uint8)
    with pytest.raises(CmaError):
        cma_runs.transfer(os.getpid(), False, dst.ctypes.data, np.zeros(1, np.int64), 8,
                          np.zeros(1, np.int64), 64)
