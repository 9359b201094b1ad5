"""``FileStore`` under hostile use: handles with different ``world_size`` on one file, users
killed with SIGKILL, a file left by a crashed job.

Every user that must die runs in a process of its own, started here and ended here by its pid,
with a hard timeout; every file lives in the test's own temporary directory.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest

import mpitensor.distributed as dist
from mpitensor.distributed._store import file as _file

TIMEOUT = 60.0

# A user in a process of its own: opens the store, runs the given statements, says "ready",
# then waits for a line on stdin (or to be killed) before closing the store.
USER = """\
import sys
import mpitensor.distributed as dist
store = dist.FileStore(sys.argv[1], int(sys.argv[2]))
{body}
print("ready", flush=True)
sys.stdin.readline()
store.close()
print("closed", flush=True)
"""


def _user(path: Path, world_size: int, body: str = "") -> subprocess.Popen:
    code = USER.format(body=textwrap.dedent(body))
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(world_size)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # (a dead child gives "" at once, never a hang)
        assert line == "ready\n", (line, proc.poll())
    except BaseException:
        _end(proc)
        raise
    return proc


def _close(proc: subprocess.Popen) -> None:
    """Let the user close its store and exit; assert it did."""
    out, _ = proc.communicate("go\n", timeout=TIMEOUT)
    assert proc.returncode == 0 and out == "closed\n", (proc.returncode, out)


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=TIMEOUT)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the user: it closes nothing and writes nothing more."""
    proc.kill()
    proc.wait(timeout=TIMEOUT)
    assert proc.returncode == -9


@pytest.fixture
def procs() -> List[subprocess.Popen]:
    started: List[subprocess.Popen] = []
    yield started
    for p in started:
        _end(p)


def test_a_smaller_world_size_never_removes_the_file_under_a_live_user(
        tmp_path: Path, procs: List[subprocess.Popen]) -> None:
    """FileStore(p, 1) and FileStore(p, 3) on one file: closing the first removed the file
    under the second, and its keys were lost."""
    path = tmp_path / "store"
    procs.append(_user(path, 1, "store.set('from_first', 'x')"))
    second = dist.FileStore(str(path), 3)
    second.set("from_second", "y")
    _close(procs[0])
    assert path.exists()
    assert second.get("from_first") == b"x" and second.get("from_second") == b"y"
    assert second.add("n", 5) == 5
    # in one process too, as the report had it
    first = dist.FileStore(str(path), 1)
    first.close()
    assert path.exists() and second.get("n") == b"5"
    second.close()
    # 3 users closed, none is left: now the file goes (torch's rule)
    assert not path.exists()


def test_a_crashed_jobs_file_is_emptied_not_reused(tmp_path: Path,
                                                   procs: List[subprocess.Popen],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A job's users were SIGKILLed: the next job's add('step', 1) returned 42 + 1."""
    path = tmp_path / "store"
    procs.append(_user(path, 2, "store.add('step', 42); store.set('addr', 'old:1')"))
    procs.append(_user(path, 2, "assert store.get('step') == b'42'"))
    for p in procs:
        _kill(p)
    assert path.exists()  # what a crash leaves
    with caplog.at_level(logging.WARNING, logger="mpitensor.distributed"):
        store = dist.FileStore(str(path), 2)
    assert store.add("step", 1) == 1
    assert not store.check(["addr"]) and store.num_keys() == 2  # step + torch's internal key
    assert any(str(path) in r.getMessage() and "ended without closing" in r.getMessage()
               for r in caplog.records), caplog.text
    # the new job runs as a new job: its second user sees the first's keys, and the last
    # to close removes the file
    other = dist.FileStore(str(path), 2)
    assert other.get("step") == b"1"
    store.close()
    other.close()
    assert not path.exists()


def test_a_killed_user_beside_a_live_one_empties_nothing(tmp_path: Path,
                                                         procs: List[subprocess.Popen]) -> None:
    """One user SIGKILLed while another lives: the store is not stale, its keys stay; the
    dead user never counts as a live one, and the file goes when the live ones are done."""
    path = tmp_path / "store"
    live = dist.FileStore(str(path), 2)
    live.set("k", "v")
    procs.append(_user(path, 2, "store.add('n', 7)"))
    _kill(procs[0])
    late = dist.FileStore(str(path), 2)  # joins while a dead user's J has no L
    assert late.get("k") == b"v" and late.get("n") == b"7"
    live.close()
    assert path.exists()  # `late` is still open
    assert late.add("n", 1) == 8
    late.close()  # 2 users closed and none alive: removed, the dead one notwithstanding
    assert not path.exists()


def test_a_user_in_another_process_keeps_the_file(tmp_path: Path,
                                                  procs: List[subprocess.Popen]) -> None:
    """The live lock is held per handle, whatever process holds it: a user elsewhere that
    opened later, with world_size 1, keeps the file alive when this one closes."""
    path = tmp_path / "store"
    here = dist.FileStore(str(path), 1)
    here.set("a", "1")
    procs.append(_user(path, 1, "assert store.get('a') == b'1'"))
    here.close()
    assert path.exists()
    _close(procs[0])  # the other user was the last: the file goes with it
    assert not path.exists()


@pytest.mark.skipif(not _file._OFD, reason="needs open-file-description locks (Linux)")
def test_a_forked_child_does_not_keep_its_parents_handle_alive(tmp_path: Path) -> None:
    """A child forked after the store was opened inherits its descriptors; the parent's
    close must still remove the file while the child runs on."""
    path = tmp_path / "store"
    store = dist.FileStore(str(path), 1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(w)
            os.read(r, 1)  # lives on until the parent has closed the store
        finally:
            os._exit(0)
    try:
        os.close(r)
        store.close()
        assert not path.exists()
    finally:
        os.close(w)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


_KEPT: List[dist.FileStore] = []


def _child_sets_and_returns(path: str) -> None:
    store = dist.FileStore(path, -1)
    store.set("result", "from the child")  # and no close(): the child just returns,
    _KEPT.append(store)  # with the store still referenced (a module's, a global's)


def test_a_multiprocessing_child_that_returns_is_not_a_crash(tmp_path: Path) -> None:
    """multiprocessing ends its children with os._exit (no atexit, no finalizer): a store
    they opened and never closed must not look like a crashed job's to the next user."""
    import multiprocessing

    path = tmp_path / "store"
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    child = ctx.Process(target=_child_sets_and_returns, args=(str(path),))
    child.start()
    child.join(TIMEOUT)
    if child.is_alive():  # pragma: no cover - only on failure
        child.kill()
        child.join(5)
    assert child.exitcode == 0
    store = dist.FileStore(str(path), -1)
    assert store.check(["result"]) and store.get("result") == b"from the child"
    store.close()


@pytest.mark.skipif(not _file._OFD, reason="needs open-file-description locks (Linux)")
def test_a_filesystem_without_the_locks_is_a_clear_error(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def refuse(fd: int, cmd: int, kind: int) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(_file, "_live_lock", refuse)
    with pytest.raises(dist.DistStoreError, match=r"cannot lock .*store.*Invalid argument.*"
                                                  r"local filesystem"):
        dist.FileStore(str(tmp_path / "store"), 1)
