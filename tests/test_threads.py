"""The per-rank thread budget (``mpitensor._base.threads``): arithmetic, who wins, and real jobs.

Issue 9: each rank's BLAS used to start one thread per core, so four ranks on two cores ran
eight busy threads. ``init_process_group`` now limits every loaded BLAS/OpenMP pool to the
rank's fair share of its cores; the user's variables, ``MPITENSOR_NUM_THREADS`` and an explicit
``set_num_threads`` win.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

import mpitensor as mt
from mpitensor._base import threads as _threads

from .launch import mpiexec_run

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "GOTO_NUM_THREADS", "MPITENSOR_NUM_THREADS")


def _blas_threads() -> list:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


@pytest.fixture
def pools():
    """Restore every pool and the module's state after a test that changes them."""
    from threadpoolctl import ThreadpoolController

    before = [(lib, lib.num_threads) for lib in ThreadpoolController().lib_controllers]
    explicit, applied = _threads._budget.explicit, _threads._budget.applied
    yield
    for lib, n in before:
        lib.set_num_threads(n)
    _threads._budget.explicit, _threads._budget.applied = explicit, applied


# ---------------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize("mine, everyone, limit, expected", [
    ({0, 1}, [{0, 1}], None, 2),                        # one rank owns the node
    ({0, 1}, [{0, 1}] * 2, None, 1),                    # two unbound ranks on two cores
    ({0, 1}, [{0, 1}] * 4, None, 1),                    # oversubscribed: never below 1
    (set(range(8)), [set(range(8))] * 3, None, 2),      # 8 // 3
    (set(range(16)), [set(range(16))] * 4, None, 4),
    ({0, 1, 2, 3}, [{0, 1, 2, 3}, {4, 5, 6, 7}], None, 4),  # bound to disjoint sets: own them
    ({0}, [{0}, {1}, {2}, {3}], None, 1),               # --bind-to core
    ({0, 1}, [{0, 1}, {1, 2}, {2, 3}], None, 1),        # partial overlap: 1 + 1/2 -> 1
    ({0, 1, 2}, [{0, 1, 2}, {2, 3, 4}], None, 2),       # 1 + 1 + 1/2 -> 2
    (set(range(8)), [set(range(8))], 1.5, 1),           # a container's --cpus=1.5
    (set(range(8)), [set(range(8))] * 2, 6.0, 3),       # quota of 6 CPUs for two ranks
    (set(range(8)), [set(range(8))], 0.2, 1),           # a tiny quota still runs one thread
])
def test_fair_share(mine, everyone, limit, expected):
    assert _threads.fair_share(mine, everyone, limit) == expected


@pytest.mark.parametrize("text, expected", [
    ("max 100000\n", None), ("150000 100000\n", 1.5), ("200000 100000", 2.0),
    ("garbage", None), ("", None), ("-1 100000", None),
])
def test_cgroup_cpu_limit(tmp_path, text, expected):
    f = tmp_path / "cpu.max"
    f.write_text(text)
    assert _threads.cgroup_cpu_limit(str(f)) == expected
    assert _threads.cgroup_cpu_limit(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("env, api, expected", [
    ({}, "openblas", []),
    ({"OMP_NUM_THREADS": "2"}, "openblas", ["OMP_NUM_THREADS"]),
    ({"OPENBLAS_NUM_THREADS": "1"}, "openblas", ["OPENBLAS_NUM_THREADS"]),
    ({"OPENBLAS_NUM_THREADS": "1"}, "openmp", []),      # OpenMP does not read OpenBLAS's
    ({"MKL_NUM_THREADS": "3"}, "mkl", ["MKL_NUM_THREADS"]),
    ({"MKL_NUM_THREADS": "3"}, "openblas", []),
    ({"OMP_NUM_THREADS": " "}, "openmp", []),           # blank: not set
    ({"OMP_NUM_THREADS": "4"}, "some-new-runtime", ["OMP_NUM_THREADS"]),
])
def test_user_vars(env, api, expected):
    assert _threads.user_vars(env, api) == expected


@pytest.mark.parametrize("raw, expected", [
    (None, None), ("", None), ("auto", None), (" AUTO ", None), ("off", "off"), ("0", "off"),
    ("1", 1), ("12", 12),
])
def test_parse_env(raw, expected):
    env = {} if raw is None else {"MPITENSOR_NUM_THREADS": raw}
    assert _threads.parse_env(env) == expected


@pytest.mark.parametrize("raw", ["-1", "two", "1.5", "2x"])
def test_parse_env_rejects(raw):
    with pytest.raises(ValueError, match=r"MPITENSOR_NUM_THREADS=.*positive integer.*'off'"):
        _threads.parse_env({"MPITENSOR_NUM_THREADS": raw})


# ---------------------------------------------------------------------------- the pools
def test_set_get_num_threads(pools):
    mt.set_num_threads(1)
    assert mt.get_num_threads() == 1
    assert _blas_threads() and set(_blas_threads()) == {1}
    mt.set_num_threads(2)
    assert mt.get_num_threads() == 2 and set(_blas_threads()) == {2}


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                      ("2", TypeError), (True, TypeError), (None, TypeError)])
def test_set_num_threads_rejects(pools, bad, exc):
    before = _blas_threads()
    with pytest.raises(exc, match="set_num_threads"):
        mt.set_num_threads(bad)
    assert _blas_threads() == before


def test_budget_applies_fair_share(pools):
    _threads._budget.explicit = None
    n = _threads.apply_node_budget(frozenset({0, 1}), [frozenset({0, 1})] * 2, 0, environ={})
    assert n == 1 and set(_blas_threads()) == {1}
    n = _threads.apply_node_budget(frozenset({0, 1}), [frozenset({0, 1})], 0, environ={})
    assert n == 2 and set(_blas_threads()) == {2}


def test_budget_number_from_environment(pools):
    _threads._budget.explicit = None
    env = {"MPITENSOR_NUM_THREADS": "3"}
    assert _threads.apply_node_budget(frozenset({0}), [frozenset({0})] * 4, 0, env) == 3
    assert set(_blas_threads()) == {3}
    # it ranks above the user's OMP_NUM_THREADS & co (the documented order)
    env = {"MPITENSOR_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    assert _threads.apply_node_budget(frozenset({0}), [frozenset({0})] * 4, 0, env) == 2
    assert set(_blas_threads()) == {2}


def test_budget_leaves_user_variables_and_off(pools):
    _threads._budget.explicit = None
    mt.set_num_threads(2)
    _threads._budget.explicit = None
    four = [frozenset({0, 1})] * 4
    for env in ({"OMP_NUM_THREADS": "2"}, {"OPENBLAS_NUM_THREADS": "2"}):
        # numpy's BLAS here is OpenBLAS (the wheels' scipy-openblas): both variables govern it
        _threads.apply_node_budget(frozenset({0, 1}), four, 0, env)
        assert set(_blas_threads()) == {2}, env
    assert _threads.apply_node_budget(frozenset({0, 1}), four, 0,
                                      {"MPITENSOR_NUM_THREADS": "off"}) is None
    assert set(_blas_threads()) == {2}


def test_explicit_call_wins_over_budget(pools):
    mt.set_num_threads(2)
    assert _threads.apply_node_budget(frozenset({0, 1}), [frozenset({0, 1})] * 4, 0, {}) is None
    assert set(_blas_threads()) == {2}


# ---------------------------------------------------------------------------- real jobs
PROBE = textwrap.dedent("""
    import json, sys
    import mpitensor as mt
    import mpitensor.distributed as dist
    from mpitensor._base import threads as _threads
    from threadpoolctl import threadpool_info
    if sys.argv[1] == "explicit":
        mt.set_num_threads(2)
    dist.init_process_group()
    from mpi4py import MPI
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    mine = _threads.affinity()
    everyone = [frozenset(s) for s in node.allgather(sorted(mine))]
    blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as f:
        json.dump({"rank": dist.get_rank(), "blas": blas,
                   "expected": _threads.fair_share(mine, everyone, _threads.cgroup_cpu_limit()),
                   "get": mt.get_num_threads()}, f)
    dist.destroy_process_group()
""")


def _probe(tmp_path: Path, nprocs: int, env: dict, mode: str = "auto") -> list:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = tmp_path / f"out-{mode}-{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    base = {v: None for v in THREAD_VARS}
    res = mpiexec_run(nprocs, [sys.executable, str(script), mode, str(out)], timeout=120,
                      env={**base, **env})
    assert not res.timed_out and res.returncode == 0, res.output[-3000:]
    rows = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]
    assert [r["rank"] for r in rows] == list(range(nprocs)), res.output[-3000:]
    return rows


@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpiexec_ranks_get_their_fair_share(tmp_path, nprocs):
    """As typed (no thread variables): every rank's BLAS pool is limited to its share."""
    for row in _probe(tmp_path, nprocs, {}):
        assert row["blas"] and set(row["blas"]) == {row["expected"]}, row
        assert row["get"] == row["expected"], row


def test_mpiexec_user_variable_wins(tmp_path):
    # one rank, whose share is every core: the user's 1 must stay (OpenBLAS caps a larger
    # value read at load time to the cores it sees, so 1 is the value that tells)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        (row,) = _probe(tmp_path, 1, {var: "1"})
        if row["expected"] < 2:
            pytest.skip("one usable core: the user's 1 and the fair share cannot differ")
        assert set(row["blas"]) == {1}, (var, row)


def test_mpiexec_budget_number_and_explicit_call(tmp_path):
    for row in _probe(tmp_path, 2, {"MPITENSOR_NUM_THREADS": "3"}):
        assert set(row["blas"]) == {3}, row
    for row in _probe(tmp_path, 2, {}, mode="explicit"):
        assert set(row["blas"]) == {2}, row


def test_malformed_variable_fails_before_mpi(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import mpitensor.distributed as dist\ndist.init_process_group()\n")
    res = mpiexec_run(1, [sys.executable, str(script)], timeout=60,
                      env={"MPITENSOR_NUM_THREADS": "many"})
    assert res.returncode != 0
    assert "MPITENSOR_NUM_THREADS='many' is not valid" in res.output
