"""Launch the MPI test suite (``tests/mpi``) under ``mpiexec`` at 1, 2, 3 and 4 ranks, and its
collective suites at 2 ranks with ``MPITENSOR_SHM_COLLECTIVES=on`` and ``off`` (the others run
with auto).

Each launch runs with a hard timeout, so a hang fails instead of blocking; every rank writes its
own summary, and the test asserts that each rank ran the same tests and none failed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from .launch import mpiexec_run

ROOT = Path(__file__).resolve().parent.parent
SUITE_TIMEOUT = float(os.environ.get("MPITENSOR_SUITE_TIMEOUT", "900"))


# the suite's own bound (SUITE_TIMEOUT) decides, not the run's per-test timeout: at 4 ranks on
# 2 loaded cores the suite can take longer than that (a local CI run under 8 other jobs: > 300 s)
@pytest.mark.timeout(SUITE_TIMEOUT + 60)
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_mpi_suite(nprocs: int, tmp_path: Path) -> None:
    _run_suite(nprocs, [ROOT / "tests" / "mpi"], {}, tmp_path)


# The collective suites once more with every collective that can go through shared memory
# going there (backends/mpi/shm_coll.py); the runs above take the switch's default (auto),
# which keeps small calls on MPI.
COLLECTIVE_SUITES = ("test_cco_buf.py", "test_large_collectives.py", "test_agreement.py",
                     "test_half_mpi.py", "test_errors.py", "test_shm_collectives.py",
                     "test_shm_tiny.py", "test_shm_tiny_lane.py", "test_timeouts.py")


@pytest.mark.timeout(SUITE_TIMEOUT + 60)
def test_collective_suites_through_shared_memory(tmp_path: Path) -> None:
    _run_suite(2, [ROOT / "tests" / "mpi" / name for name in COLLECTIVE_SUITES],
               {"MPITENSOR_SHM_COLLECTIVES": "on"}, tmp_path)


# ... and with the switch off: no shared memory at all (no engine, no small calls' board:
# every call on MPI, small ones on persistent requests), which auto otherwise never runs
@pytest.mark.timeout(SUITE_TIMEOUT + 60)
def test_collective_suites_on_mpi_alone(tmp_path: Path) -> None:
    _run_suite(2, [ROOT / "tests" / "mpi" / name for name in COLLECTIVE_SUITES],
               {"MPITENSOR_SHM_COLLECTIVES": "off"}, tmp_path)


def _run_suite(nprocs: int, paths: list, extra: dict, tmp_path: Path) -> None:
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    env = {"MPITENSOR_TEST_REPORT_DIR": str(report_dir), **extra}
    args = [sys.executable, "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
            "--timeout=180", "--timeout-method=thread", *map(str, paths)]
    proc = mpiexec_run(nprocs, args, timeout=SUITE_TIMEOUT, env=env, cwd=ROOT)
    tail = proc.output[-8000:]
    assert not proc.timed_out, f"MPI suite at {nprocs} ranks hung (> {SUITE_TIMEOUT}s):\n{tail}"
    reports = [report_dir / f"rank{r}.json" for r in range(nprocs)]
    missing = [p.name for p in reports if not p.exists()]
    assert not missing, f"ranks without a report {missing} (rc={proc.returncode}):\n{tail}"
    data = [json.loads(p.read_text()) for p in reports]
    for d in data:
        assert d["size"] == nprocs
        assert d["failed"] == 0, f"rank {d['rank']} failures: {d['failures']}\n{tail}"
        assert d["passed"] > 0, f"rank {d['rank']} ran no test:\n{tail}"
    assert len({d["passed"] for d in data}) == 1, f"ranks ran different tests: {data}"
    assert proc.returncode == 0, f"mpiexec exited {proc.returncode}:\n{tail}"
