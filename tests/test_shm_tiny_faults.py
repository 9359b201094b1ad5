"""Faults in small collectives through the shared board (``backends/mpi/shm_tiny.py``).

Each scenario runs a script under ``mpiexec`` with a hard timeout (``test_shm_faults``'s
launcher) and asserts every rank's outcome: a rank killed before it posts its part of a small
all_reduce (or reduce to one root), and a rank that never arrives. Both must end in a clear
error on every surviving rank within the group's timeout, never a hang or a wrong number.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_faults_comm import results
from .test_shm_faults import _survivors_say_rank_1_died, rank_1_came_too_late, run_script

SMALL = """
import os, signal, time
from mpitensor.distributed import _world
from mpitensor.distributed.backends.mpi import shm_tiny


def attempt(x, t0):  # the call, reported; True if it raised
    try:
        THE_CALL
        report(stage="done", value=x.tolist())
        return False
    except Exception as exc:
        report(stage="raised", error=f"{type(exc).__name__}: {exc}",
               took=time.monotonic() - t0)
        return True
"""

KILL = SMALL + """
dist.init_process_group("mpi", timeout=float(sys.argv[1]))
rank = dist.get_rank()
x = np.ones(4, np.float32)
dist.all_reduce(x)  # call #1, on the board
assert _world._pg(None).tiny is not None or shm_tiny._tiny is None
report(stage="ready", board=_world._pg(None).tiny is not None)
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # before it posts call #2
if attempt(x, time.monotonic()):
    sys.stdout.flush()
    time.sleep(3)  # the other survivor finds rank 1 gone, not this rank
    os._exit(0)  # (a peer is gone: no exit notices); 0 keeps hydra from killing the rest
"""


#: the call each scenario's ranks attempt, by kind of board call: an all_reduce, and a reduce
#: to rank 0 (whose other members wait for every member's post all the same)
CALLS = {"all_reduce": "dist.all_reduce(x)", "reduce": "dist.reduce(x, dst=0)"}


@pytest.mark.parametrize("kind", sorted(CALLS))
def test_a_rank_killed_before_it_posts(tmp_path: Path, kind: str) -> None:
    """Rank 1 SIGKILLs itself between two small calls. With hydra's clean-up off, ranks 0 and
    2 stay to tell: each ends its wait on the board with PeerFailedError naming rank 1 and its
    pid, well within the 60 s timeout (or MPICH ends the job first, as ``test_shm_faults``
    describes)."""
    res, took = run_script(tmp_path, KILL.replace("THE_CALL", CALLS[kind]), 3, "60",
                           hydra=("-disable-auto-cleanup",))
    assert not res.timed_out, res.output
    got = results(tmp_path)
    assert got[1]["stage"] == "ready", res.output
    if not got[1]["board"]:
        return  # built without the board's module: the MPI path, test_shm_faults' cases
    _survivors_say_rank_1_died(res, got, 2, lambda g: True, 20, kind)
    assert took < 60


LATE = SMALL + """
dist.init_process_group("mpi", timeout=3.0, abort_on_exception=False)
rank = dist.get_rank()
x = np.ones(4, np.float32)
dist.all_reduce(x)  # call #1, on the board
t0 = time.monotonic()
if rank == 1:
    time.sleep(6)  # never arrives within the others' timeout
attempt(x, t0)
"""


@pytest.mark.parametrize("kind", sorted(CALLS))
def test_a_rank_that_never_arrives(tmp_path: Path, kind: str) -> None:
    """Rank 1 comes 6 s late to a small call (timeout 3 s): ranks 0 and 2 raise
    DistributedTimeoutError naming rank 1 after about 3 s (or the PeerFailedError of the one
    that timed out first); rank 1, arriving, is refused with the story; nobody gets a value."""
    res, _ = run_script(tmp_path, LATE.replace("THE_CALL", CALLS[kind]), 3)
    rank_1_came_too_late(res, results(tmp_path), kind)
