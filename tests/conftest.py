"""Shared test configuration.

The plain run (``python -m pytest``) runs the in-process unit tests and, through
``tests/test_mpi_suites.py``, launches ``tests/mpi`` under ``mpiexec`` at 1, 2, 3 and 4 ranks.
``tests/mpi`` itself is only collected inside those launches (``--with-mpi``).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

MPI_DIR = Path(__file__).parent / "mpi"

# A shell without job control starts a background command (`python -m pytest &`) with SIGINT
# ignored, and every process a test starts inherits that: the tests that send SIGINT to a
# launcher or a rank then wait in vain. Ctrl-C means what it means in a foreground run.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("with_mpi", default=False):
        return None
    if collection_path == MPI_DIR or MPI_DIR in collection_path.parents:
        return True
    return None


_hydra_before: set = set()
_torch_logs_before: set = set()
_watch: list = []  # this session's SegmentWatch, once started


def _clean_up() -> None:
    """End what this session started and remove what its jobs left: run once, at the end of
    the session, at exit, or on SIGTERM/SIGHUP (Ctrl-C ends the session through pytest)."""
    if not _watch:
        return
    from .launch import end_session, sweep_hydra_files, sweep_torch_log_dirs

    watch = _watch.pop()
    end_session(watch)
    sweep_hydra_files(_hydra_before)
    sweep_torch_log_dirs(_torch_logs_before)


def _on_signal(signum: int, frame: object) -> None:
    import os
    import signal

    _clean_up()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def pytest_sessionstart(session: pytest.Session) -> None:
    if session.config.getoption("with_mpi", default=False):
        return  # a suite under mpiexec: the session that launched it cleans up
    import atexit
    import os
    import signal
    import threading
    import uuid

    from .launch import SESSION_VAR, SegmentWatch, hydra_files, torch_log_dirs

    _hydra_before.update(hydra_files())
    _torch_logs_before.update(torch_log_dirs())
    # every process this session starts inherits the mark, and so does every segment's maker
    os.environ[SESSION_VAR] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    _watch.append(SegmentWatch(os.environ[SESSION_VAR]))
    atexit.register(_clean_up)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The whole run leaves no MPICH shared memory behind: jobs that the fault tests kill or
    abort never unlink theirs (about 60 segments, 120 MB of RAM, per run before this); nor
    hydra's topology files in /tmp, which ``mpiexec`` leaves when a job aborts (about 35), nor
    the log directory torch's own launcher leaves there when a test runs it as the oracle.
    Only what this session made goes: other runs on the machine keep theirs. An interrupted
    run (Ctrl-C) ends here too, after killing the jobs it left running."""
    _clean_up()


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    from mpitensor.backend import cupy_unavailable_reason

    reason = None
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            if reason is None:
                reason = cupy_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))
