"""The test run's sweep of MPICH shared memory (tests/launch.py, used by conftest.py)."""

from __future__ import annotations

import mmap
import os
import uuid

import pytest

from .launch import SHM_DIR, SHM_PREFIX, mpich_segments, sweep_mpich_segments

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm on this system")


def test_sweep_removes_new_unmapped_segments_and_keeps_the_rest():
    before = mpich_segments()
    tag = uuid.uuid4().hex[:8]
    stale, live, old = (SHM_DIR / f"{SHM_PREFIX}test{tag}{i}_0" for i in range(3))
    old.write_bytes(b"\0" * 4096)
    before.add(old.name)  # there before the run: not ours to remove
    stale.write_bytes(b"\0" * 4096)
    live.write_bytes(b"\0" * 4096)
    fd = os.open(live, os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, 4096)  # a running job's segment
        try:
            removed = sweep_mpich_segments(before)
            assert stale.name in removed and not stale.exists()
            assert live.exists() and old.exists()
        finally:
            mapping.close()
    finally:
        os.close(fd)
        for p in (stale, live, old):
            if p.exists():
                p.unlink()
