"""Shared test configuration.

The plain run (``python -m pytest``) runs the in-process unit tests and, through
``tests/test_mpi_suites.py``, launches ``tests/mpi`` under ``mpiexec`` at 1, 2, 3 and 4 ranks.
``tests/mpi`` itself is only collected inside those launches (``--with-mpi``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

MPI_DIR = Path(__file__).parent / "mpi"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("with_mpi", default=False):
        return None
    if collection_path == MPI_DIR or MPI_DIR in collection_path.parents:
        return True
    return None


_shm_before: set = set()
_hydra_before: set = set()
_torch_logs_before: set = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not session.config.getoption("with_mpi", default=False):
        from .launch import hydra_files, mpich_segments, torch_log_dirs

        _shm_before.update(mpich_segments())
        _hydra_before.update(hydra_files())
        _torch_logs_before.update(torch_log_dirs())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The whole run leaves no MPICH shared memory behind: jobs that the fault tests kill or
    abort never unlink theirs (about 60 segments, 120 MB of RAM, per run before this); nor
    hydra's topology files in /tmp, which ``mpiexec`` leaves when a job aborts (about 35), nor
    the log directory torch's own launcher leaves there when a test runs it as the oracle."""
    if not session.config.getoption("with_mpi", default=False):
        from .launch import sweep_hydra_files, sweep_mpich_segments, sweep_torch_log_dirs

        sweep_mpich_segments(_shm_before)
        sweep_hydra_files(_hydra_before)
        sweep_torch_log_dirs(_torch_logs_before)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    from mpitensor.backend import cupy_unavailable_reason

    reason = None
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            if reason is None:
                reason = cupy_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))
