"""Runs under ``mpiexec -n N python -m pytest --with-mpi tests/mpi`` (see test_mpi_suites.py).

* One default process group per session, shared by every test.
* Tests marked ``mpi(min_size=k)`` are deselected (not skipped) where the world is smaller.
* After each test the ranks agree on its outcome: a test that failed on any rank fails on every
  rank, naming the ranks, so all ranks stay in step and every rank reports it.
* Each rank writes a JSON summary to ``$MPITENSOR_TEST_REPORT_DIR/rank<r>.json`` for the driver
  to assert on.
"""

from __future__ import annotations

import json
import os

import pytest

import mpitensor  # noqa: F401 - first: MPI starts with the settings users get (mpi_import)

# isort: split
from mpi4py import MPI

_COMM = MPI.COMM_WORLD.Dup()  # test bookkeeping never mixes with the traffic under test
_RESULTS: dict = {"passed": 0, "failed": 0, "failures": []}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    size = _COMM.Get_size()
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker("mpi")
        need = mark.kwargs.get("min_size", 1) if mark is not None else 1
        (keep if need <= size else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    # A collection error on one rank only (an import error, say) would have that rank leave
    # while the others run tests and wait for it: stop every rank instead.
    bad = [r for r, f in enumerate(_COMM.allgather(session.testsfailed > 0)) if f]
    if bad:
        session.shouldstop = f"collection errors on rank(s) {bad}"


@pytest.fixture(scope="session", autouse=True)
def _process_group():
    import mpitensor.distributed as dist

    dist.init_process_group("mpi")
    yield
    dist.destroy_process_group()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    failed_here = getattr(item, "_mt_failed", False) or report.failed
    item._mt_failed = failed_here
    if report.when != "teardown":
        return
    failed = _COMM.allgather(bool(failed_here))
    bad = [r for r, f in enumerate(failed) if f]
    if bad and not failed_here:
        report.outcome = "failed"
        report.longrepr = f"failed on rank(s) {bad} (passed on rank {_COMM.Get_rank()})"
    if bad:
        _RESULTS["failed"] += 1
        _RESULTS["failures"].append(item.nodeid)
    else:
        _RESULTS["passed"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("MPITENSOR_TEST_REPORT_DIR")
    if out:
        rank = _COMM.Get_rank()
        data = dict(_RESULTS, rank=rank, size=_COMM.Get_size(), exitstatus=int(exitstatus))
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
            json.dump(data, fh)
