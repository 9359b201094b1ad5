"""A worker killed outright (SIGKILL) in the middle of RPC calls: the survivors' calls fail fast.

The job is ``mpiexec -n 3`` running this file as a program. Worker 2 is killed by SIGKILL while
serving calls from workers 0 and 1 (default deadline: 60 s). Each survivor must get a
``PeerFailedError`` naming worker 2 within a few seconds, refuse later calls to it at once,
still call the other survivor, and shut down gracefully without it.

Hydra (the MPICH wheel's ``mpiexec``) tears the whole job down as soon as one of its processes
ends before the others -- a rank killed by a signal, even with ``-disable-auto-cleanup``
(measured: 0.15-1.2 s after the kill), or one that exits -- so the survivors would never get
to see anything. Each rank therefore runs under ``sh``, which outlives its rank, reports its
exit status and waits until all three ranks have ended (a marker file each): to hydra no
process ends early, as under launchers that keep a job running when one of its processes
dies. ``MPI_Finalize`` cannot complete with a dead rank, so the survivors end with
``os._exit``.

Variants: the survivors notice the death through the process table (``/proc``: the peers
share this host), or through the heartbeat used for peers on other hosts (the process-table
check turned off); and a death while the survivors wait for the dead worker in a graceful
``shutdown()``.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Tuple

import pytest

HERE = Path(__file__).resolve()
HARD_TIMEOUT = 90.0


# ------------------------------------------------------------------------------ the program
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


def die() -> None:
    print(f"rank 2: dying at {time.time():.6f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def add(a: int, b: int) -> int:
    return a + b


def program(mode: str) -> None:
    from mpi4py import MPI

    import mpitensor.distributed.rpc as rpc
    from mpitensor.distributed.rpc import _liveness
    from mpitensor.errors import PeerFailedError

    if mode == "heartbeat":
        _liveness.PID_CHECK = False
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    rpc.init_rpc(f"worker{rank}")
    if mode == "shutdown":
        shutdown_program(rpc, comm, rank)
    # every survivor has a call in flight on worker 2 when it dies
    slow = rpc.rpc_async(2, nap, args=(30.0,)) if rank != 2 else None
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)
    if rank == 2:
        time.sleep(120)  # serving; killed by the call below
        return
    if rank == 0:
        time.sleep(0.2)  # both naps are running on worker 2
        rpc.rpc_async(2, die)
    try:
        slow.wait()
        print(f"rank {rank}: the call to worker 2 returned", flush=True)
    except PeerFailedError as e:
        print(f"rank {rank}: PeerFailedError at {time.time():.6f}: {e}", flush=True)
    except Exception as e:  # noqa: BLE001 - reported for the test to see
        print(f"rank {rank}: {type(e).__name__} at {time.time():.6f}: {e}", flush=True)
    t0 = time.monotonic()
    try:
        rpc.rpc_sync("worker2", add, args=(1, 2))
        print(f"rank {rank}: a new call to worker 2 succeeded", flush=True)
    except PeerFailedError:
        print(f"rank {rank}: new call refused in {time.monotonic() - t0:.3f} s", flush=True)
    other = 1 - rank
    print(f"rank {rank}: call to worker {other} gave {rpc.rpc_sync(other, add, args=(rank, 10))}",
          flush=True)
    rpc.shutdown(timeout=20)
    print(f"rank {rank}: shutdown ok", flush=True)
    os._exit(0)  # MPI_Finalize would wait for the dead rank


def shutdown_program(rpc: Any, comm: Any, rank: int) -> None:
    """Workers 0 and 1 are in a graceful shutdown, waiting for worker 2, when it is killed."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)
    if rank == 2:
        time.sleep(0.5)  # the others are waiting for it in shutdown()
        die()
    rpc.shutdown(timeout=20)
    print(f"rank {rank}: shutdown ok at {time.time():.6f}", flush=True)
    os._exit(0)


# ------------------------------------------------------------------------------ the test
def _launch(mode: str, tmp_path: Path) -> Tuple[str, float]:
    """Run the program on 3 ranks (under the waiting ``sh``); (its output, rank 2's death)."""
    from .launch import mpiexec_run  # (this file also runs as the job's program)

    # sh runs the rank, reports its exit status, leaves a marker, and ends once all three
    # have (hydra tears the job down when the first of its processes ends)
    wrapper = ["sh", "-c", '"$@"; s=$?; echo "rank $PMI_RANK: exit status $s" >&2; '
               'touch "$MT_DONE_DIR/$PMI_RANK"; n=0; '
               'while [ "$(ls "$MT_DONE_DIR" | wc -l)" -lt 3 ] && [ $n -lt 1200 ]; do '
               'sleep 0.05; n=$((n + 1)); done', "sh"]
    res = mpiexec_run(3, [*wrapper, sys.executable, str(HERE), mode], timeout=HARD_TIMEOUT,
                      env={"MT_DONE_DIR": str(tmp_path)})
    out = res.output
    assert not res.timed_out, f"the job hung ({HARD_TIMEOUT:g} s):\n{out}"
    m = re.search(r"rank 2: dying at ([\d.]+)", out)
    assert m, out
    assert "rank 2: exit status 137" in out, out  # killed by SIGKILL (128 + 9)
    return out, float(m.group(1))


@pytest.mark.parametrize("mode", ["pid", "heartbeat"])
def test_killed_worker_fails_calls_fast(mode: str, tmp_path: Path) -> None:
    """Each survivor's call in flight fails with PeerFailedError within seconds, not 60 s."""
    start = time.time()
    out, died = _launch(mode, tmp_path)
    took = time.time() - start
    limit = 2.0 if mode == "pid" else 9.0  # heartbeat: ping after 1 s, silence limit 5 s
    for r in (0, 1):
        m = re.search(rf"rank {r}: PeerFailedError at ([\d.]+): (.*)", out)
        assert m, f"rank {r} got no PeerFailedError:\n{out}"
        noticed = float(m.group(1)) - died
        print(f"{mode}: rank {r} noticed the death {noticed:.3f} s after the kill")
        assert 0 <= noticed < limit, f"rank {r} took {noticed:.2f} s:\n{out}"
        msg = m.group(2)
        assert "WorkerInfo(id=2, name=worker2)" in msg and "died without notice" in msg, msg
        assert ("pid" in msg) if mode == "pid" else ("liveness probe" in msg), msg
        m = re.search(rf"rank {r}: new call refused in ([\d.]+) s", out)
        assert m and float(m.group(1)) < 0.5, out
        assert f"rank {r}: call to worker {1 - r} gave {r + 10}" in out, out
        assert f"rank {r}: shutdown ok" in out, out
        assert f"rank {r}: exit status 0" in out, out
    assert took < 60, f"the job took {took:.1f} s"


def test_killed_worker_during_shutdown(tmp_path: Path) -> None:
    """The survivors' graceful shutdown, waiting for the dead worker, completes without it."""
    out, died = _launch("shutdown", tmp_path)
    for r in (0, 1):
        m = re.search(rf"rank {r}: shutdown ok at ([\d.]+)", out)
        assert m, f"rank {r} did not shut down:\n{out}"
        took = float(m.group(1)) - died
        print(f"shutdown: rank {r} finished {took:.3f} s after the kill")
        assert 0 <= took < 2.0, out
        assert f"rank {r}: exit status 0" in out, out


if __name__ == "__main__":
    program(sys.argv[1])
