"""The compiled board of small collectives (``backends/mpi/_tiny.c``), in one process: its
two copies of a post's data and the timing ``shm_tiny._copy_choice`` runs on a spare board."""

from __future__ import annotations

import mmap
import time

import numpy as np
import pytest

from mpitensor.distributed.backends.mpi import shm_tiny

_tiny = shm_tiny._tiny
pytestmark = pytest.mark.skipif(_tiny is None, reason="the board's compiled module was not "
                                "built (no C compiler at install)")
GATHER = shm_tiny.GATHER


def board(size, rank=0):
    mm = mmap.mmap(-1, shm_tiny.segment_bytes(size))
    return mm, _tiny.Board(mm, rank, size, shm_tiny.SLOTS, shm_tiny.CAP)


@pytest.mark.parametrize("nt_min", [shm_tiny.NEVER, 0, _tiny.NT_MIN if _tiny else 0])
def test_a_post_gives_its_bytes_whichever_copy_it_takes(nt_min):
    """Every size around the 64-byte step and the threshold, from an address one byte past
    alignment, read back by a one-member gather."""
    mm, b = board(1)
    b.nt_min = nt_min
    rng = np.random.default_rng(5)
    for s, nb in enumerate((1, 15, 63, 64, 65, 127, 2047, 2048, 2049, 4031, 4095, 4096), 1):
        src = rng.integers(0, 256, nb + 1, dtype=np.uint8)[1:]
        out = np.zeros(nb, np.uint8)
        assert b.run(s, 0, nb, src, out, GATHER, 0, 15, 15, 0) == 1
        np.testing.assert_array_equal(out, src)
    b.release()
    mm.close()


def test_timed_calls_of_one_member_and_their_bad_arguments():
    mm, b = board(1)
    for nt in (shm_tiny.NEVER, 0):
        assert 0 < b.time_calls(1 if nt else 100, 8, shm_tiny.CAP, nt, 5.0) < 5.0
    for bad in ((0, 8, 64, 0, 1.0), (1, 0, 64, 0, 1.0), (1, 8, 0, 0, 1.0),
                (1, 8, shm_tiny.CAP + 1, 0, 1.0)):
        with pytest.raises(ValueError, match="time_calls"):
            b.time_calls(*bad)
    assert b.nt_min == _tiny.NT_MIN  # (time_calls puts the board's own back)
    b.release()
    mm.close()


def test_a_member_that_never_comes_ends_the_timing_within_its_limit():
    mm, b = board(2)
    t0 = time.monotonic()
    assert b.time_calls(1, 64, shm_tiny.CAP, 0, 0.05) == -1.0
    assert time.monotonic() - t0 < 2.0
    b.release()
    mm.close()


def test_every_cap_stays_below_the_engines_floor():
    """No call the engine is asked for first (``shm_coll.FLOOR`` bytes and more) comes to the
    board. Where one could, a member still timing the engine's calibration within call s took
    a faster member's post of call s on the board for a mismatch (seen with a cap of 1 MiB on
    4 ranks: CollectiveMismatchError in a correct program)."""
    from mpitensor.distributed.backends.mpi import shm_coll

    assert all(shm_tiny.cap(n) < shm_coll.FLOOR for n in range(1, 257))
    assert all(shm_tiny.segment_bytes(n) <= 4.5 * 2**20 for n in range(1, shm_tiny.WIDE + 1))
