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


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    from mpitensor.backend import cupy_unavailable_reason

    reason = None
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            if reason is None:
                reason = cupy_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))
