"""A caught timeout breaks the group on every rank (issue 24, section 1).

Each test runs ``tests/fault_scripts/broken_group.py``, a torch-style program whose one rank
skips a call while the others catch the timeout and go on, under ``mpiexec`` with a hard
timeout, and asserts what every rank's every call did. The rule: after the fault, every call
on the group raises on every rank, at once, naming the call that broke it; no call ever
returns a wrong number (before this, the timed-out request stayed posted in MPI and the next
calls met the wrong partner: ``[1, 1]`` for ``[3, 3]``, with no error anywhere).
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from .launch import find_mpiexec, run_job

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "fault_scripts" / "broken_group.py"
CALL_ID = runpy.run_path(str(SCRIPT))["CALL_ID"]  # (its __main__ does not run)
TIMEOUT = 2.0  # the group's timeout in the scripts
HARD_TIMEOUT = 90.0  # the launcher kills the job past this
AT_ONCE = 1.0  # seconds: a refused call, or a rank learning of the break


def run(tmp_path: Path, scenario: str, n: int) -> dict:
    """Run the scenario on ``n`` ranks; every rank's log of calls, keyed by rank."""
    rc, out, err, _ = run_job([find_mpiexec(), "-n", str(n), sys.executable, str(SCRIPT),
                               scenario, "--timeout", str(TIMEOUT), "--out", str(tmp_path)],
                              HARD_TIMEOUT, cwd=tmp_path,
                              env={"MPITENSOR_DEBUG": "0", "MPITENSOR_STALL_WARN": "60"})
    assert rc == 0, f"exit code {rc}:\n{out[-3000:]}\n{err[-3000:]}"
    got = {}
    for r in range(n):
        path = tmp_path / f"result{r}.json"
        assert path.exists(), f"rank {r} wrote no result:\n{out[-3000:]}\n{err[-3000:]}"
        got[r] = {e["call"]: e for e in json.loads(path.read_text())["log"]}
    return got


def expected(call: str, rank: int, n: int) -> "list | None":
    """What a call that returns must give on ``rank`` (None: it returns no tensor). Rank r
    contributes ``r + 1 + 100 k`` to the program's call number k (the script's CALL_ID)."""
    if call in ("recv_first", "recv_second", "irecv_long_wait"):
        return [{"recv_first": 10.0, "recv_second": 20.0, "irecv_long_wait": 5.0}[call]] * 2
    if call not in CALL_ID:
        return None
    k = CALL_ID[call]
    if call == "broadcast":
        return [1.0 + 100 * k] * 2  # from rank 0
    if call == "skipped_broadcast":
        return [2.0 + 100 * k] * 2  # from rank 1
    if call == "ring":
        return [float((rank - 1) % n + 1 + 100 * k)] * 2  # from the previous rank
    return [n * (n + 1) / 2 + 100 * k * n] * 2  # a sum over the ranks


def never_wrong(got: dict, n: int) -> None:
    """Every call that returned a tensor gave the right numbers (the one unforgivable outcome
    is a wrong number without an error)."""
    for r, calls in got.items():
        for name, e in calls.items():
            want = expected(name, r, n)
            if "value" in e and want is not None:
                assert e["value"] == want, f"rank {r}: {name} returned {e['value']}, not {want}"


def refused(e: dict, culprit: str) -> None:
    """``e`` raised PeerFailedError at once, naming the call that broke the group."""
    assert e.get("error") == "PeerFailedError", e
    assert culprit in e["msg"], e
    assert e["took"] < AT_ONCE, e


LATER = ("all_reduce", "broadcast", "async_all_reduce", "ring")


@pytest.mark.parametrize("n", [2, 3])
def test_caught_timeout_breaks_the_group_on_every_rank(tmp_path, n):
    """The user's scenario: rank 1 skips an all_reduce and stays away past the timeout; rank 0
    catches the DistributedTimeoutError, and every rank goes on. Rank 0's next all_reduce gave
    [1, 1] for [3, 3] and rank 1's the wrong sum too, silently. Now every later call, collective
    or p2p, sync or async, raises PeerFailedError at once on every rank, naming rank 0's
    all_reduce #2; at 3 ranks, rank 2, which came late to the all_reduce, learns of the break
    within a second, not at its own timeout."""
    got = run(tmp_path, "all_reduce", n)
    never_wrong(got, n)
    culprit = "rank 0 failed in all_reduce (#2 on WORLD): DistributedTimeoutError"
    first = got[0]["skipped_all_reduce"]
    assert first["error"] == "DistributedTimeoutError", first
    assert "WORLD is broken from here on" in first["msg"], first
    assert "skipped_all_reduce" not in got[1]
    if n == 3:
        late = got[2]["skipped_all_reduce"]
        assert late["error"] == "PeerFailedError", late
        assert "all_reduce (#2 on WORLD) cannot complete: " + culprit in late["msg"], late
        assert late["took"] < 0.4 * TIMEOUT + AT_ONCE, late  # not its own timeout
    for r in range(n):
        for name in LATER:
            refused(got[r][name], culprit if r else culprit.replace("rank 0", "rank 0 (this "
                                                                               "rank)"))


def test_timed_out_broadcast_breaks_the_group(tmp_path):
    """The same with a broadcast whose root (rank 1) skips it."""
    got = run(tmp_path, "broadcast", 2)
    never_wrong(got, 2)
    assert got[0]["skipped_broadcast"]["error"] == "DistributedTimeoutError"
    for r in range(2):
        for name in LATER:
            refused(got[r][name], "failed in broadcast (#2 on WORLD): DistributedTimeoutError")


def test_timed_out_recv_breaks_the_group(tmp_path):
    """Rank 0's recv times out; rank 1 sends late, then its next message. Rank 0's next recv
    took the late message (10 for 20); now rank 1's sends and rank 0's recv are refused."""
    got = run(tmp_path, "recv", 2)
    never_wrong(got, 2)
    assert got[0]["recv_first"]["error"] == "DistributedTimeoutError"
    culprit = "failed in recv (p2p #1 on WORLD): DistributedTimeoutError"
    refused(got[0]["recv_second"], culprit)
    refused(got[1]["send_first"], culprit)
    refused(got[1]["send_second"], culprit)
    for r in range(2):
        for name in LATER:
            refused(got[r][name], culprit)


def test_timed_out_work_wait_breaks_the_group(tmp_path):
    """Rank 0's ``all_reduce(async_op=True).wait()`` times out; rank 1, waiting meanwhile in
    ``irecv(...).wait(timeout=3600)`` on the same group, raises within a second of it instead
    of in an hour."""
    got = run(tmp_path, "work", 2)
    never_wrong(got, 2)
    assert got[0]["work_wait"]["error"] == "DistributedTimeoutError"
    culprit = "rank 0 failed in all_reduce (#2 on WORLD): DistributedTimeoutError"
    wait = got[1]["irecv_long_wait"]
    assert wait["error"] == "PeerFailedError" and "irecv on WORLD cannot complete" in \
        wait["msg"] and culprit in wait["msg"], wait
    assert wait["took"] < TIMEOUT + AT_ONCE, wait
    refused(got[0]["send_after"], culprit.replace("rank 0", "rank 0 (this rank)"))
    for r in range(2):
        for name in LATER:
            refused(got[r][name], "failed in all_reduce (#2 on WORLD)")


def test_dropped_work_after_its_own_wait_timeout_breaks_the_group(tmp_path):
    """``wait(timeout=...)`` with a bound of its own leaves the work pending, to be waited on
    again (the group stays usable: tests/mpi/test_errors.py). A program that drops the work
    instead leaves its request posted: the group breaks when the work is collected, and rank 1,
    back from skipping the call, is refused instead of meeting it."""
    got = run(tmp_path, "poll", 2)
    never_wrong(got, 2)
    first = got[0]["skipped_all_reduce"]
    assert first["error"] == "DistributedTimeoutError", first
    assert "The operation is still pending: wait on it again" in first["msg"], first
    culprit = "failed in all_reduce (#2 on WORLD): its work was dropped unfinished"
    for r in range(2):
        for name in LATER:
            refused(got[r][name], culprit)


def test_exception_inside_a_wait_breaks_the_group(tmp_path):
    """Rank 0's all_reduce, with an hour's timeout, is interrupted by an exception its signal
    handler raises (as Ctrl-C does), which the program catches; its data was posted, so the
    group breaks: rank 1, back from skipping the call, is refused instead of completing
    rank 0's posted all_reduce with its next one."""
    got = run(tmp_path, "interrupt", 2)
    never_wrong(got, 2)
    first = got[0]["skipped_all_reduce"]
    assert first["error"] == "Interrupted" and first["took"] < TIMEOUT, first
    culprit = ("failed in all_reduce (#2 on WORLD): Interrupted: signal 14 while waiting "
               "(raised while it waited)")
    for r in range(2):
        for name in LATER:
            refused(got[r][name], culprit)


@pytest.mark.parametrize("n", [2, 3])
def test_recovery_after_the_break(tmp_path, n):
    """After the break a program goes on as torch programs do: new_group works (on the broken
    world too), and destroy_process_group() + init_process_group() give a group whose
    collectives and p2p give the right numbers on every rank."""
    got = run(tmp_path, "recover", n)
    never_wrong(got, n)
    for r in range(n):
        calls = got[r]
        refused(calls["refused_all_reduce"], "failed in all_reduce (#2 on WORLD)")
        assert calls["all_reduce"]["value"] == expected("all_reduce", r, n), calls["all_reduce"]
        for name in ("new_group", "all_reduce_new_group", "destroy", "init", "broadcast",
                     "async_all_reduce", "ring"):
            assert "value" in calls[name], (r, calls[name])
        assert calls["ring"]["value"] == expected("ring", r, n)
