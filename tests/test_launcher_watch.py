"""``mpitensor-run``'s rank watch hears only the job's own processes.

The watch is an abstract Unix socket: it has no permissions, and any local process can find
its name in /proc/net/unix and connect. A stranger made the launcher print "rank 9 of 2 raised
FakeError". Here a stranger (a process of the test, not of the job) connects while the job
runs and forges reports; the launcher must print nothing of them, and name the rank that
really failed. The launch runs in its own session with a hard timeout and leaves no process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from mpitensor._base import procfs
from mpitensor.run import watch as _run

from .launch import _kill, _start, leftovers

TIMEOUT = 120.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the rank watch uses Linux abstract sockets")

# Every rank says it is up, then waits for the test's "go"; on the first attempt rank 1 fails
# for real, on the second every rank ends well.
JOB = """\
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"up.{rank}.{attempt}").write_text(str(os.getpid()))
deadline = time.monotonic() + 60
while not (out / f"go.{attempt}").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
class RealError(Exception):
    pass
if attempt == "0" and rank == "1":
    raise RealError("the job's own failure")
if attempt == "0":
    time.sleep(60)  # ended by the launcher when rank 1 fails
"""

# The stranger: connects to the socket named in argv and forges the reports of a rank that
# does not exist and of one that does, dated before anything the job did.
STRANGER = """\
import socket, sys, time
early = time.time() - 1000
said = []
for lines in ([f"rank 9", f"end 1 {early:.6f} raised FakeError: from a stranger"],
              [f"rank 1", f"end 1 {early:.6f} raised FakeError: forged for rank 1"],
              [f"rank 0"]):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\\0" + sys.argv[1])
        s.sendall("".join(l + "\\n" for l in lines).encode())
        said.append("sent")
    except OSError as exc:
        said.append(type(exc).__name__)
    finally:
        s.close()
print(" ".join(said), flush=True)
"""


def _watch_name(launcher_pid: int, deadline: float) -> str:
    """The abstract name of the launcher's watch, found as a stranger finds it: the
    launcher's socket inodes (/proc/PID/fd) looked up in /proc/net/unix."""
    while time.monotonic() < deadline:
        inodes = set()
        fd_dir = Path(f"/proc/{launcher_pid}/fd")
        for fd in fd_dir.iterdir() if fd_dir.exists() else []:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            m = re.fullmatch(r"socket:\[(\d+)\]", link)
            if m:
                inodes.add(m.group(1))
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[6] in inodes and parts[7].startswith("@mpitensor-run-"):
                return parts[7][1:]
        time.sleep(0.05)
    raise AssertionError("the launcher's watch socket was not found")


def _wait_for(paths: List[Path], deadline: float) -> None:
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"the ranks did not come up: {paths}"
        time.sleep(0.05)


def test_a_strangers_reports_are_not_heard(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "out"
    out.mkdir()
    proc, job_id = _start([sys.executable, "-m", "mpitensor.run", "--max-restarts", "1",
                           "--nproc-per-node", "2", str(script), str(out)],
                          None, tmp_path, None, False)
    deadline = time.monotonic() + TIMEOUT
    try:
        _wait_for([out / "up.0.0", out / "up.1.0"], deadline)
        name = _watch_name(proc.pid, deadline)
        stranger = subprocess.run([sys.executable, "-c", STRANGER, name],
                                  capture_output=True, text=True, timeout=60)
        assert stranger.returncode == 0, stranger.stderr
        time.sleep(0.5)  # time enough for the watch to have read every word of it
        (out / "go.0").write_text("")
        _wait_for([out / "up.0.1", out / "up.1.1"], deadline)
        (out / "go.1").write_text("")
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        _kill(proc, job_id)
        proc.communicate()
        raise
    assert not leftovers(job_id)
    lines = [ln for ln in stderr.splitlines() if ln.startswith("mpitensor-run: ")]
    assert proc.returncode == 0, stderr[-3000:]
    assert "FakeError" not in stderr and "rank 9" not in stderr, stderr[-3000:]
    assert len(lines) == 1, lines
    assert lines[0] == ("mpitensor-run: rank 1 of 2 raised RealError (exit code 1); every rank "
                        "was stopped: restart 1 of 1 (TORCHELASTIC_RESTART_COUNT=1)"), lines


def test_the_peer_check(tmp_path: Path) -> None:
    """The check itself: this process and its children pass, a process outside does not."""
    here = os.getpid()
    assert procfs.descends_from(here, here)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert procfs.descends_from(child.pid, here)
        assert not procfs.descends_from(here, child.pid)
        assert not procfs.descends_from(os.getppid(), here)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert not procfs.descends_from(child.pid, here)  # gone: never trusted


# A rank that says who it is, then ends without a word: os._exit(CODE), or SIGKILL.
SILENT_RANK = """\
import os, signal, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
s.sendall(f"rank {sys.argv[2]}\\n".encode())
sys.stdin.readline()  # the test's go
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
os._exit(int(sys.argv[3]))
"""


def _silent_rank(name: str, rank: int, how: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SILENT_RANK, name, str(rank), how],
                            stdin=subprocess.PIPE, text=True)


def test_a_silent_exit_is_given_its_code(tmp_path: Path) -> None:
    """os._exit(3) says nothing on the watch; the watch reads the code from /proc while the
    process is unreaped (here until the test waits for it), and names that rank alone even
    beside a rank SIGKILLed in the same instant (mpiexec's cleanup)."""
    watch = _run._RankWatch(2)
    watch.start()
    ranks = [_silent_rank(watch.address, 0, "kill"), _silent_rank(watch.address, 1, "3")]
    try:
        deadline = time.monotonic() + 30
        while watch.connected != {0, 1}:
            assert time.monotonic() < deadline, watch.connected
            time.sleep(0.01)
        ranks[1].stdin.write("go\n")
        ranks[1].stdin.flush()
        while not watch.batches:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ranks[0].stdin.write("go\n")
        ranks[0].stdin.flush()
        assert ranks[0].wait(timeout=30) == -9
        while len(watch.batches) < 2:
            assert time.monotonic() < deadline, watch.batches
            time.sleep(0.01)
    finally:
        for p in ranks:
            p.kill()
            p.wait(timeout=30)
        watch.stop()
    assert watch.ends[1][0] == 3 and watch.ends[1][2] == "exit" and 0 not in watch.ends
    assert watch.exited == {1}
    assert watch.failed_first() == [1]
    # the same two in one look: the killed rank is taken for the cleanup
    watch.batches = [[0, 1]]
    assert watch.failed_first() == [1]
    # but a rank that said it raised is never set aside
    watch.ends[0] = (1, watch.ends[1][1] - 1, "raised RuntimeError")
    assert watch.failed_first() == [0, 1]


# A rank whose connection outlives it: a child keeps a copy, as a dying rank's last thread,
# still waiting for a core, keeps its descriptors open after the kernel has set its status.
HELD_RANK = """\
import os, signal, socket, subprocess, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
s.sendall(f"rank {sys.argv[2]}\\n".encode())
keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                          pass_fds=[s.fileno()])
print(keeper.pid, flush=True)
sys.stdin.readline()  # the test's go
os.kill(os.getpid(), signal.SIGKILL)
"""


@contextlib.contextmanager
def _beside_a_held_rank(other: str) -> Iterator[Tuple[Any, subprocess.Popen]]:
    """A watch with rank 1 (:data:`HELD_RANK`) dead by SIGKILL, unreaped, its connection
    still open, and rank 0 run from ``other`` (argv: the watch, the rank, and ``kill`` for
    :data:`SILENT_RANK`), connected and waiting for its go; the watch stopped after."""
    watch = _run._RankWatch(2)
    watch.start()
    held = subprocess.Popen([sys.executable, "-c", HELD_RANK, watch.address, "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rank0 = subprocess.Popen([sys.executable, "-c", other, watch.address, "0", "kill"],
                             stdin=subprocess.PIPE, text=True)
    keeper = None
    try:
        keeper = int(held.stdout.readline())
        deadline = time.monotonic() + 30
        while watch.connected != {0, 1}:
            assert time.monotonic() < deadline, watch.connected
            time.sleep(0.01)
        held.stdin.write("go\n")
        held.stdin.flush()
        while procfs.stat(held.pid)[:1] != [b"Z"]:  # dead, unreaped, its socket still open
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert watch.batches == []
        yield watch, rank0
    finally:
        if keeper is not None:
            os.kill(keeper, 9)
        for p in (held, rank0):
            p.kill()
            p.wait(timeout=30)
        watch.stop()


def _until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_rank_dying_before_its_connection_closes_is_not_left_out(tmp_path: Path) -> None:
    """Rank 1 SIGKILLs itself, but its connection stays open (the fresh-clone CI once saw
    this: its last thread waited for a core); then mpiexec's cleanup SIGKILLs rank 0, whose
    connection closes first. Rank 1's status is in /proc all along: the watch must count it
    as ending in the same look, so that rank 0, the cleanup's victim, is never named alone."""
    with _beside_a_held_rank(SILENT_RANK) as (watch, rank0):
        rank0.stdin.write("go\n")
        rank0.stdin.flush()
        _until(lambda: bool(watch.batches))
    assert watch.batches[0] == [0, 1] and watch.ends == {} and watch.exited == set()
    assert watch.failed_first() == [0, 1]  # "one of ranks 0, 1 (the same instant)"


# A rank that says it raised, then goes at once.
SAYING_RANK = """\
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
s.sendall(f"rank {sys.argv[2]}\\n".encode())
sys.stdin.readline()  # the test's go
s.sendall(f"end 1 {time.time():.6f} raised RuntimeError\\n".encode())
os._exit(1)
"""


def test_a_rank_that_said_it_failed_is_named_beside_one_dying_by_a_signal(
        tmp_path: Path) -> None:
    """The rule above is for ranks that went without a word: rank 0 says it raised and goes
    while rank 1 is already dying by a signal (its connection held open). Rank 0 said so
    before its connection closed: it is named, as before, and rank 1 joins no look of its."""
    with _beside_a_held_rank(SAYING_RANK) as (watch, rank0):
        rank0.stdin.write("go\n")
        rank0.stdin.flush()
        assert rank0.wait(timeout=30) == 1
        _until(lambda: any(0 in b for b in watch.batches) and 0 not in watch._alive)
    assert watch.ends[0][0] == 1 and watch.ends[0][2] == "raised RuntimeError"
    assert all(b == [0] for b in watch.batches[:2] if 0 in b), watch.batches
    assert watch.failed_first() == [0]


def test_exit_codes_from_proc() -> None:
    """Only a process exiting by itself with a non-zero code has one; a live process, a
    number whose start time is another's, or a process gone, has none."""
    def code(pid: int, start: bytes) -> Optional[int]:
        return procfs.own_code(procfs.exit_status(pid, start))

    me = procfs.stat(os.getpid())
    assert code(os.getpid(), me[19]) is None  # alive: exit_code 0
    assert code(os.getpid(), b"0") is None  # not the process that connected
    child = subprocess.Popen([sys.executable, "-c", "import os; os._exit(7)"])
    deadline = time.monotonic() + 30
    start = None
    while time.monotonic() < deadline:
        fields = procfs.stat(child.pid)
        if fields and start is None:
            start = fields[19]
        if fields and fields[0] == b"Z":
            break
        time.sleep(0.01)
    assert start is not None
    assert code(child.pid, start) == 7
    child.wait(timeout=30)
    assert code(child.pid, start) is None


def _zombie(code: int) -> subprocess.Popen:
    """A child that exits with ``code`` at once and stays unreaped until the test waits."""
    child = subprocess.Popen([sys.executable, "-c", f"import os; os._exit({code})"])
    deadline = time.monotonic() + 30
    while procfs.stat(child.pid)[:1] != [b"Z"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return child


def test_spawn_names_the_rank_that_exited_by_itself(tmp_path: Path) -> None:
    """``mp.spawn``'s own watch (``launch/processes.py``): when ranks end in one look, the
    one found exiting with a code of its own (``os._exit(3)``, which leaves no record) is
    named with that code, not mpiexec's (hydra exits 9 when the rank it SIGKILLed in its
    cleanup is reaped first); the rank killed beside it is taken for that cleanup. Where
    neither can be told apart, nobody is named."""
    from mpitensor.distributed.launch import mpiexec
    from mpitensor.distributed.launch.processes import ProcessContext
    from mpitensor.multiprocessing import ProcessExitedException

    done = subprocess.Popen([sys.executable, "-c", "pass"])  # the job's "mpiexec", ended
    done.wait(timeout=30)
    ctx = ProcessContext(done, str(tmp_path), 2, None, None, "watch-test", False,
                         mpiexec.MPICH)
    ctx._watcher.join(timeout=30)
    exited, killed = _zombie(3), subprocess.Popen([sys.executable, "-c", "import time; "
                                                   "time.sleep(60)"])
    try:
        killed.send_signal(9)
        deadline = time.monotonic() + 30
        while procfs.stat(killed.pid)[:1] != [b"Z"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for rank, p in ((0, killed), (1, exited)):
            ctx._pid_of[rank], ctx._start[rank] = p.pid, procfs.stat(p.pid)[19]
        assert ctx._look(1) and ctx._look(0)
        assert ctx._own_code(1) == 3 and ctx._own_code(0) is None  # (0: SIGKILL's status)
        ctx._ended = [([0, 1], True)]
        assert ctx._culprit(set()) == 1
        with pytest.raises(ProcessExitedException) as info:
            ctx._collect(9)
        assert (info.value.error_index, info.value.exit_code, info.value.signal_name) == (
            1, 3, None)
        assert str(info.value).startswith("spawn: rank 1 of 2 exited with code 3 ")
        # neither seen exiting by itself (both reaped before the watch looked): no name
        ctx._status.clear()
        assert ctx._culprit(set()) is None
        # a rank whose return value was recorded ended well: the other one is named
        assert ctx._culprit({1}) == 0
    finally:
        for p in (exited, killed):
            p.kill()
            p.wait(timeout=30)
    assert not ctx._look(1)  # reaped: nothing to read, nothing guessed
    ctx._finish()


def test_spawn_counts_a_rank_already_dying_by_a_signal(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``mp.spawn``'s watch: rank 0's pidfd wakes while rank 1 is already dying by a signal
    (its status is in /proc, its last thread not yet gone: the race the fresh-clone CI once
    lost for ``mpitensor-run``). Rank 1 must join rank 0's look, which then names nobody;
    rank 0, whose death may be mpiexec's cleanup, must not be named alone.

    A process cannot be held half-dead on demand, so rank 1's status is what the process
    table is made to say here: SIGKILL's, while it still runs."""
    from mpitensor.distributed.launch import mpiexec, processes

    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for _ in range(3)]
    fake_mpiexec, ranks = sleepers[0], sleepers[1:]
    real = procfs.exit_status
    monkeypatch.setattr(processes.procfs, "exit_status",
                        lambda pid, start: 9 if pid == ranks[1].pid else real(pid, start))
    workdir = tmp_path / "job"
    workdir.mkdir()
    for rank, p in enumerate(ranks):
        (workdir / f"pid.{rank}").write_bytes(pickle.dumps(p.pid))
    ctx = processes.ProcessContext(fake_mpiexec, str(workdir), 2, None, None, "watch-test",
                                   False, mpiexec.MPICH)
    try:
        deadline = time.monotonic() + 30
        while len(ctx._pid_of) < 2 or len(ctx._start) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # registered and watched
        assert ctx._ended == []
        ranks[0].kill()
        while not ctx._ended:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert ctx._ended[0] == ([0, 1], True)
        assert ctx._culprit(set()) is None
    finally:
        ctx._finished = True
        for p in sleepers:
            p.kill()
            p.wait(timeout=30)
        ctx._watcher.join(timeout=30)
        ctx._finish()
