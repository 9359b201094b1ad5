"""``mpitensor.distributed.nn.functional``: every differentiable collective, forward and
backward, on every rank of a 3-rank job, against closed forms (issue 25, family 9).

The script (tests/fault_scripts/dist_nn_functional.py) gives rank r the input
x_r = (r + 1) * [1, 2] and weights each output by known numbers; the expected values and
gradients below are those numbers worked out by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .launch import find_mpiexec, run_job

SCRIPT = Path(__file__).resolve().parent / "fault_scripts" / "dist_nn_functional.py"
N = 3


def _expected(r: int) -> dict:
    def x(k: int) -> list:
        return [1.0 * (k + 1), 2.0 * (k + 1)]

    weights = sum(q + 1 for q in range(N))  # 6: the sum of every rank's loss weight
    out = {
        "all_reduce": ([6.0, 12.0], [6.0, 6.0]),
        "all_gather": ([x(i) for i in range(N)], [float(weights * (r + 1))] * 2),
        "broadcast": (x(1), [6.0, 6.0] if r == 1 else [0.0, 0.0]),
        "reduce": ([6.0, 12.0] if r == 0 else x(r), [1.0, 1.0]),
        "gather": ([x(i) for i in range(N)] if r == N - 1 else [[0.0, 0.0]] * N,
                   [float(r + 1)] * 2),
        "scatter": (x(r), [2.0, 2.0] if r == 0 else [0.0, 0.0]),
        "reduce_scatter": ([float(sum(10 * q + r + 1 for q in range(N))),
                            float(2 * sum(10 * q + r + 1 for q in range(N)))], [1.0, 1.0]),
        "all_to_all": ([x(10 * i + r) for i in range(N)], [3.0 * (r + 1)] * 2),
        "all_to_all_single": ([float(2 * r + k + 100 * i) for i in range(N) for k in (0, 1)],
                              [float(2 * r + k) for _ in range(N) for k in (0, 1)]),
    }
    return {name: f"rank {r} {name} {value} {grad}" for name, (value, grad) in out.items()}


@pytest.fixture(scope="module")
def output() -> str:
    rc, out, err, _ = run_job([find_mpiexec(), "-n", str(N), sys.executable, str(SCRIPT)],
                              timeout=120)
    assert rc == 0, out + err
    return out


@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "broadcast", "reduce", "gather",
                                  "scatter", "reduce_scatter", "all_to_all",
                                  "all_to_all_single"])
def test_value_and_gradient_on_every_rank(output: str, name: str) -> None:
    for r in range(N):
        assert _expected(r)[name] in output, (name, r, output)


def test_ops_without_a_gradient_raise_only_when_one_is_recorded(output: str) -> None:
    for r in range(N):
        assert f"rank {r} MAX RuntimeError: distributed.nn.all_reduce: op MAX has no gradient" \
               in output
        assert f"rank {r} MAX no_grad [3.0, 6.0]" in output
