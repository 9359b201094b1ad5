"""Documented commands whose behaviour was wrong (issue 27): each runs as the doc writes it.

- ``MPITENSOR_LOG=INFO`` / ``DEBUG`` (docs/getting-started.md, docs/launching.md) print the
  lines they promise, on stderr, with the rank, through a handler of the ``mpitensor`` logger
  only (the root logger is left alone).
- ``python -m pytest`` (README) interrupted with Ctrl-C or ended with SIGTERM kills the jobs it
  left running and removes the MPICH shared-memory segments they made, and only those.

The train.py commands of the issue (torchrun, the one ``error:`` line, the fallback's reason)
are tested in ``tests/test_train.py``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from .launch import (
    SESSION_VAR,
    SHM_DIR,
    _mappers,
    clean_env,
    find_mpiexec,
    mpich_segments,
    session_pids,
)

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=clean_env(env), stdin=subprocess.DEVNULL)


# ------------------------------------------------------------------------------ MPITENSOR_LOG
def test_log_info_shows_the_gloo_notice_once() -> None:
    """launching.md: "`MPITENSOR_LOG=INFO` shows it" (the gloo notice, rank 0, once)."""
    out = _run([find_mpiexec(), "-n", "2", sys.executable, "examples/p2p_blocking.py"],
               {"MPITENSOR_LOG": "INFO"})
    assert out.returncode == 0, out.stderr
    notice = "[rank 0] mpitensor.distributed INFO: backend 'gloo' runs on mpitensor's MPI path " \
             "(same API and results)"
    assert out.stderr.splitlines().count(notice) == 1, out.stderr
    assert sorted(out.stdout.splitlines()) == ["Rank 0 has data tensor(1.)",
                                               "Rank 1 has data tensor(1.)"]


def test_log_debug_shows_each_ranks_thread_choice() -> None:
    """launching.md: the thread budget "is logged once per rank at DEBUG level"."""
    out = _run([find_mpiexec(), "-n", "2", sys.executable, "examples/hello.py"],
               {"MPITENSOR_LOG": "DEBUG"})
    assert out.returncode == 0, out.stderr
    for rank in (0, 1):
        lines = [ln for ln in out.stderr.splitlines()
                 if ln.startswith(f"[rank {rank}] mpitensor DEBUG: rank {rank}: BLAS/OpenMP "
                                  "threads per rank: ")]
        assert len(lines) == 1, out.stderr


def test_log_switch_leaves_the_root_logger_alone() -> None:
    code = ("import logging, mpitensor\n"
            "root = logging.getLogger()\n"
            "print(len(root.handlers), logging.getLevelName(root.level))\n"
            "logging.getLogger('mpitensor.x').info('hello')\n")
    out = _run([sys.executable, "-c", code], {"MPITENSOR_LOG": "info"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "WARNING"]
    assert out.stderr.splitlines() == ["[rank 0] mpitensor.x INFO: hello"]


def test_without_the_switch_no_handler_is_added() -> None:
    before = list(logging.getLogger("mpitensor").handlers)
    out = _run([sys.executable, "-c", "import logging, mpitensor; "
                "print(len(logging.getLogger('mpitensor').handlers))"],
               {"MPITENSOR_LOG": None})
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr
    assert logging.getLogger("mpitensor").handlers == before


# ------------------------------------------------------------------------------ interrupted runs
WAITING_TEST = textwrap.dedent('''
    import sys
    from pathlib import Path

    from tests.launch import mpiexec_run

    RANK = (
        "import os, time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
        "open(os.path.join({where!r}, 'up%d' % MPI.COMM_WORLD.Get_rank()), 'w')"
        ".write(os.environ.get({var!r}, '')); time.sleep(300)"
    )


    def test_waits():
        mpiexec_run(2, [sys.executable, "-c", RANK], timeout=300)
''')


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm on this system")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_pytest_leaves_no_segments_or_ranks(sig: int) -> None:
    """README: `python -m pytest`, stopped by Ctrl-C (SIGINT) or SIGTERM while a job runs:
    the job's ranks (in sessions of their own, out of the terminal's reach) are ended and
    their MPICH segments removed; before, about 50 segments stayed in /dev/shm per run."""
    with tempfile.TemporaryDirectory(prefix="mpitensor-interrupt-") as d:
        where = Path(d)
        (where / "test_waiting.py").write_text(
            WAITING_TEST.replace("{where!r}", repr(str(where))).replace("{var!r}",
                                                                         repr(SESSION_VAR)))
        others_before = mpich_segments()
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p",
             "no:cacheprovider", str(where / "test_waiting.py")],
            cwd=ROOT, env=clean_env({SESSION_VAR: None}), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
            start_new_session=True)
        inner, ranks = "", []
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(
                    (where / f"up{r}").exists() for r in (0, 1)):
                assert proc.poll() is None, proc.communicate()[0]
                time.sleep(0.1)
            assert (where / "up1").exists(), "the job did not start within 120 s"
            time.sleep(0.2)
            inner = (where / "up0").read_text()
            assert inner, "the test session's mark did not reach the ranks"
            ranks = session_pids(inner)
            made = {name for name, pids in _mappers(mpich_segments() - others_before).items()
                    if set(pids) & set(ranks)}
            assert made, "the ranks map no MPICH segment here: nothing to check"
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=60)
            left = session_pids(inner)
            assert left == [], f"processes of the interrupted run still alive: {left}\n{out}"
            assert not {n for n in made if (SHM_DIR / n).exists()}, out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            for pid in session_pids(inner) if inner else []:  # this test's own job only
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


# ------------------------------------------------------------------------------ MPI imported early
EARLY = textwrap.dedent('''
    import mpitensor.distributed as dist
    from mpi4py import MPI  # too early: each process is an MPI job of its own from here on

    dist.init_process_group("gloo")
''')


def test_mpi_imported_before_init_process_group_names_the_line(tmp_path: Path) -> None:
    """Processes started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT, no MPI
    launcher) that import mpi4py.MPI before init_process_group cannot be joined with this
    MPICH: the error says which line of which file started MPI, and to move it."""
    import socket

    from mpitensor.distributed.launch.rendezvous import _library

    if not _library().startswith("MPICH Version:      5.0"):
        pytest.skip("only MPICH 5.0.x refuses to connect processes that started MPI alone")
    script = tmp_path / "early.py"
    script.write_text(EARLY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
        env=clean_env({"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "MPITENSOR_TIMEOUT": "60"}))
        for r in range(2)]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 1, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert f"In this process (rank {rank}) mpi4py.MPI, which starts MPI, was first " \
               f"imported at {script}, line 3, in <module>: `from mpi4py import MPI`: move " \
               "that import below init_process_group" in last, last
