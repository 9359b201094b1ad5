"""Faults in collectives through shared memory (``backends/mpi/shm_coll.py``, issue 29).

Each scenario runs a small script under ``mpiexec`` with ``MPITENSOR_SHM_COLLECTIVES=on`` and
a hard timeout, and asserts every rank's outcome: a rank killed mid-collective, a rank that
never arrives, and a ``/dev/shm`` too small for the segment. Each must give a clear error on
every rank within the timeout (or, for the full ``/dev/shm``, the MPI path on every rank) and
leave no segment behind: every script records the names of the segments it created.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .launch import mpich_segments, mpiexec_run, sweep_mpich_segments
from .test_faults_comm import PRELUDE, results

TIMEOUT = 120.0  # the launcher kills the job past this


def run_script(tmp_path: Path, body: str, nprocs: int, *args: str, hydra: tuple = ()):
    """PRELUDE + body under ``mpiexec [hydra options] -n nprocs``, switch on; (result, s)."""
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = {"MPITENSOR_DEBUG": "0", "MPITENSOR_ABORT_ON_EXCEPTION": "1",
           "MPITENSOR_SHM_COLLECTIVES": "on"}
    start, before = time.monotonic(), mpich_segments()
    try:
        res = mpiexec_run(nprocs, [*hydra, sys.executable, str(script), *args],
                          timeout=TIMEOUT, env=env, cwd=tmp_path)
    finally:
        # a rank killed with hydra's clean-up off leaves MPICH's segment, and it can die
        # before the session's watch sees it map the segment: remove it here
        sweep_mpich_segments(before)
    return res, time.monotonic() - start

RECORD = """
import os, signal, time
from mpitensor.distributed.backends.mpi import shm_coll, shm_pipe
made = []
_create = shm_coll._shm.create
def create(prefix, nbytes):
    path = _create(prefix, nbytes)
    made.append(path)
    return path
shm_coll._shm.create = create
shm_coll.set_chunk(1 << 16)  # 64 KiB slots: a 1 MiB call takes 16 chunks
FORM = "in place"  # or "into": the group's all_reduce out of place


def attempt(x, t0):  # all_reduce(x), reported; True if it raised
    try:
        if FORM == "into":
            dist.group.WORLD.all_reduce_into(np.empty_like(x), x)
        else:
            dist.all_reduce(x)
        report(stage="done", made=made)
        return False
    except Exception as exc:
        report(stage="raised", error=f"{type(exc).__name__}: {exc}",
               took=time.monotonic() - t0, made=made)
        return True
"""


def _no_segment_left(got: dict) -> None:
    for r, res in got.items():
        for path in res.get("made") or []:
            if path is not None:
                assert not os.path.exists(path), f"rank {r} left {path}"


def mpich_ended_the_job(res) -> None:
    """The job ended at once, non-zero, its launcher saying why: hydra names the signal, or
    (its proxy's pipe to the killed rank broken first) reports its own failure."""
    if "signal 9" in res.output or "KILLED BY SIGNAL: 9" in res.output:
        return
    assert "process manager error" in res.output and res.returncode != 0, res.output


def _survivors_say_rank_1_died(res, got: dict, seq: int, ok, bound: float,
                               op: str = "all_reduce") -> None:
    """Ranks 0 and 2 raised PeerFailedError naming rank 1's ended process in call ``#seq``
    (an ``op``) within ``bound`` seconds (``ok(report)`` true), or MPI ended the job before
    they could report past "ready" (the known defect); no segment left."""
    for r in (0, 2):
        if got[r]["stage"] == "ready":  # MPICH ended the job first (see above)
            mpich_ended_the_job(res)
            continue
        assert got[r]["stage"] == "raised" and ok(got[r]), (got, res.output)
        err = got[r]["error"]
        assert err.startswith(f"PeerFailedError: rank {r}: {op} (#{seq} on WORLD) "
                              f"cannot complete: rank 1 failed in {op} (#{seq} on "
                              "WORLD): its process (pid "), err
        assert got[r]["took"] < bound, got[r]
    _no_segment_left(got)


KILL = RECORD + """
shm_coll.set_direct(sys.argv[2] == "direct")  # the path of the groups made from here on
FORM = sys.argv[3]
dist.init_process_group("mpi", timeout=float(sys.argv[1]))
rank = dist.get_rank()
x = np.ones(1 << 18, np.float32)
dist.all_reduce(x)  # the engine is made
report(stage="ready", made=made)
if rank == 1:
    publish = shm_pipe.Engine.publish
    def dying(self, w, t):
        # half-way through the next call: its chunks (segment), its reduced part (direct:
        # the meeting after it; in place, where the members write their reduced parts into
        # each other's buffers and have no such meeting, the call's last one, while a peer
        # may still write into it)
        if self.step - t == 8 or (self.cma and self.seq == 2 and (
                w == shm_pipe.RED or (w == shm_pipe.OUT and self.puts))):
            os.kill(os.getpid(), signal.SIGKILL)
        publish(self, w, t)
    shm_pipe.Engine.publish = dying
if attempt(x, time.monotonic()):
    sys.stdout.flush()
    time.sleep(3)  # the other survivor finds rank 1 gone, not this rank
    os._exit(0)  # (a peer is gone: no exit notices); 0 keeps hydra from killing the rest
"""


@pytest.mark.parametrize("form", ["in place", "into"])
@pytest.mark.parametrize("path", ["direct", "segment"])
def test_a_rank_killed_mid_collective(tmp_path: Path, path: str, form: str) -> None:
    """Rank 1 SIGKILLs itself inside an all_reduce through shared memory (in place, or the
    group's out-of-place ``all_reduce_into``). With hydra's clean-up off, ranks 0 and 2 stay
    to tell: each ends its wait with PeerFailedError naming rank 1 and its pid, in well under
    the 60 s timeout.

    Known defect (about one run in six here): MPICH itself finds rank 1 gone first, in a call
    of its own that a survivor is making (its progress engine), and ends the whole job, hydra
    naming the signal (or, its proxy's pipe to rank 1 broken first, its own failure). The job
    still ends at once and leaves no segment, as checked here, but that run's survivors print
    no error of their own."""
    res, took = run_script(tmp_path, KILL, 3, "60", path, form,
                           hydra=("-disable-auto-cleanup",))
    assert not res.timed_out, res.output
    got = results(tmp_path)
    assert got[1]["stage"] == "ready", res.output  # killed before it could report more
    _survivors_say_rank_1_died(res, got, 2, lambda g: True, 20)
    assert took < 60


@pytest.mark.parametrize("path", ["direct", "segment"])
def test_a_rank_killed_ends_the_job_under_hydra(tmp_path: Path, path: str) -> None:
    """The same kill with hydra's default clean-up: the job ends at once, non-zero, hydra
    naming the signal; no segment is left."""
    res, took = run_script(tmp_path, KILL, 2, "60", path, "in place")
    assert not res.timed_out, res.output
    assert res.returncode != 0
    mpich_ended_the_job(res)
    assert took < 60
    _no_segment_left(results(tmp_path))


LATE = RECORD + """
dist.init_process_group("mpi", timeout=3.0, abort_on_exception=False)
rank = dist.get_rank()
x = np.ones(1 << 18, np.float32)
dist.all_reduce(x)  # the engine is made
t0 = time.monotonic()
if rank == 1:
    time.sleep(6)  # never arrives within the others' timeout
attempt(x, t0)
"""


def test_a_rank_that_never_arrives(tmp_path: Path) -> None:
    """Rank 1 comes 6 s late to an all_reduce through shared memory (timeout 3 s): ranks 0 and
    2 raise DistributedTimeoutError naming rank 1 after about 3 s (or the PeerFailedError of
    the one that timed out first, which broke the group); rank 1, arriving, is refused with
    the story."""
    res, _ = run_script(tmp_path, LATE, 3)
    got = results(tmp_path)
    rank_1_came_too_late(res, got)
    _no_segment_left(got)


def rank_1_came_too_late(res, got: dict, op: str = "all_reduce") -> None:
    """Ranks 0 and 2 raised DistributedTimeoutError for ``op`` #2 naming rank 1 after about
    3 s (or the PeerFailedError of the one that timed out first, which broke the group);
    rank 1, arriving, was refused with the story."""
    assert not res.timed_out, res.output
    assert sorted(got) == [0, 1, 2], res.output
    timed_out = []
    for r in (0, 2):  # the first to time out breaks the group: the other hears it from it
        err = got[r]["error"]
        assert got[r]["stage"] == "raised", (got, res.output)
        if err.startswith("DistributedTimeoutError"):
            timed_out.append(r)
            assert err.startswith(f"DistributedTimeoutError: rank {r}: {op} (#2 on "
                                  "WORLD) did not complete within 3 s"), err
            assert "Ranks that had not arrived: [1]" in err, err
        else:
            assert err.startswith(f"PeerFailedError: rank {r}: {op} (#2 on WORLD) cannot "
                                  f"complete: rank {2 - r} failed in {op} (#2 on WORLD): "
                                  "DistributedTimeoutError"), err
        assert 2.5 < got[r]["took"] < 6, got[r]
    assert timed_out, got
    assert got[1]["stage"] == "raised"
    assert got[1]["error"].startswith(f"PeerFailedError: rank 1: {op}"), got[1]
    assert "DistributedTimeoutError" in got[1]["error"], got[1]


FULL = RECORD + """
import errno
from mpitensor.distributed.backends.mpi import shm as _shm
dist.init_process_group("mpi")
rank = dist.get_rank()
_shm.DIR = sys.argv[1]  # the tiny tmpfs (or a directory that is not there): creation fails
def no_memory(*args):  # and a segment without a name finds no memory either
    raise OSError(errno.ENOMEM, "no memory")
os.memfd_create = no_memory
n = int(sys.argv[2])
if sys.argv[3] == "late" and rank == 2:
    # rank 2 leaves each of the engine's exchanges late: its watchdog's last look comes
    # after its peers gave the engine up and posted this same call on the small calls' board
    from mpitensor.distributed.health import watchdog
    _exchange = shm_coll._exchange
    def late_exchange(h, v, mop, s, op):
        _exchange(h, v, mop, s, op)
        time.sleep(0.3)
        watchdog.fault_in_wait(h, "coll", s, op, None, time.monotonic())
    shm_coll._exchange = late_exchange
x = np.arange(n, dtype=np.float32) * (rank + 1)
dist.all_reduce(x)
dist.all_reduce(y := np.ones(n, np.float32))  # and the group goes on
g = dist.group.WORLD
report(engine=repr(g.shm), ok=bool((x == np.arange(n) * 6).all() and (y == 3).all()),
       made=made,
       left=sorted(os.listdir(sys.argv[1])) if os.path.isdir(sys.argv[1]) else [])
"""


@pytest.fixture
def tiny_shm(tmp_path: Path):
    """A 64 KiB tmpfs (root and mount(2) permitting), else a directory that does not exist:
    either way the segment cannot be made there."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                             capture_output=True).returncode == 0
    try:
        yield mnt if mounted else tmp_path / "absent"
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("n, when", [(1 << 18, "prompt"), (1 << 10, "late")])
def test_a_full_dev_shm_falls_back_to_mpi_on_every_rank(tmp_path: Path, tiny_shm: Path,
                                                        n: int, when: str):
    """Neither a segment without a name (no memory) nor one in /dev/shm (full) can be made:
    every rank stays on MPI, and the result is right. "late": a call the small calls' board
    takes (4 KiB) falls back there, and a rank still waiting in the engine's last exchange
    sees its peers' posts of that call: not a mismatch (seen once in CI, at 1 MiB on 3 ranks
    of 2 cores, whose board takes 1 MiB)."""
    res, _ = run_script(tmp_path, FULL, 3, str(tiny_shm), str(n), when)
    assert not res.timed_out, res.output
    assert res.returncode == 0, res.output
    got = results(tmp_path)
    assert sorted(got) == [0, 1, 2], res.output
    for r, g in got.items():
        assert g["engine"] == "False" and g["ok"] and g["left"] == [], (r, g)
    assert got[0]["made"][-1] is None  # rank 0 tried to make the engine's, and could not


ORPHAN = RECORD + """
_anon = shm_coll._shm.create_anonymous
def create_anonymous(nbytes):  # rank 0 dies with the segment made, before any peer maps it
    got = _anon(nbytes)
    report(stage="made", where=None if got is None else got[1],
           names=sorted(n for n in os.listdir("/dev/shm") if n.startswith("mpitensor-coll")))
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
shm_coll._shm.create_anonymous = create_anonymous
dist.init_process_group("mpi", timeout=10.0)
dist.all_reduce(np.ones(1 << 18, np.float32))  # rank 0 makes the engine's segment
"""


@pytest.mark.skipif(not hasattr(os, "memfd_create") or not os.path.isdir("/dev/shm"),
                    reason="needs Linux's memfd_create and /dev/shm")
def test_rank_0_killed_after_making_the_segment_leaves_nothing(tmp_path: Path) -> None:
    """Rank 0 is killed between making the engine's segment and its peers mapping it: the
    segment has no name (it lives in rank 0's descriptor only), so nothing is left in
    /dev/shm; the job ends."""
    before = {n for n in os.listdir("/dev/shm") if n.startswith("mpitensor-coll")}
    res, took = run_script(tmp_path, ORPHAN, 2)
    assert not res.timed_out, res.output
    assert res.returncode != 0
    made = results(tmp_path)[0]
    assert made["stage"] == "made" and made["where"].startswith("/proc/"), made
    pid = int(made["where"].split("/")[2])
    assert not os.path.exists(f"/proc/{pid}/fd"), "rank 0 still runs"
    after = {n for n in os.listdir("/dev/shm") if n.startswith("mpitensor-coll")}
    assert not (after - before) - set(made["names"]), after


BETWEEN = RECORD + """
shm_coll.set_direct(sys.argv[2] == "direct")
dist.init_process_group("mpi", timeout=float(sys.argv[1]))
rank = dist.get_rank()
x = np.ones(1 << 18, np.float32)
dist.all_reduce(x)  # the engine is made
report(stage="ready", made=made)
if rank != 1:  # still in call #2 when rank 1 has left it and died: its last wait comes late
    wait = shm_pipe.Engine.wait
    def late(self, w, t, ranks):
        if self.seq == 2 and (w == shm_pipe.OUT if self.cma else
                              w == shm_pipe.RED and t == self.step):
            time.sleep(0.05)
        wait(self, w, t, ranks)
    shm_pipe.Engine.wait = late
x = np.ones(1 << 18, np.float32)
dist.all_reduce(x)  # call #2: every rank's part is there
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
ok = bool((x == 3).all())
report(stage="call 2", ok=ok, made=made)
t0 = time.monotonic()
try:
    dist.all_reduce(np.ones(1 << 18, np.float32))
    report(stage="done", ok=ok, made=made)
except Exception as exc:
    report(stage="raised", ok=ok, error=f"{type(exc).__name__}: {exc}",
           took=time.monotonic() - t0, made=made)
    sys.stdout.flush()
    time.sleep(3)  # the other survivor finds rank 1 gone, not this rank
    os._exit(0)  # (a peer is gone: no exit notices); 0 keeps hydra from killing the rest
"""


@pytest.mark.parametrize("path", ["direct", "segment"])
def test_a_rank_killed_between_calls(tmp_path: Path, path: str) -> None:
    """Rank 1 completes call #2 and is killed while ranks 0 and 2 are still finishing it:
    their call #2 completes with the right sum (every member's part was there), and their
    call #3 raises PeerFailedError naming rank 1 and call #3, well within the 20 s timeout.
    (Hydra's clean-up off, as above; MPI itself may still end the job first while the
    survivors finish call #2, the same defect: 1 run in 6 here.)"""
    res, took = run_script(tmp_path, BETWEEN, 3, "20", path,
                           hydra=("-disable-auto-cleanup",))
    assert not res.timed_out, res.output
    # call #2's sum on every survivor that got past it; not stage "call 2": the wait to
    # enter call #3 looks at the members not there yet before MPI's calls do (which ended the
    # job in all of 3 runs before it did)
    _survivors_say_rank_1_died(res, results(tmp_path), 3, lambda g: g["ok"], 15)
    assert took < 60
