"""tests/programs/reinforce.py (a REINFORCE policy-gradient program over a 3-armed bandit,
with Categorical.log_prob) run as a user runs it under mpitensor and, where torch is installed,
under torch: the same NumPy-drawn actions, so the printed losses agree to 1e-9 (float64)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict

import pytest

from .launch import run_job
from .test_ported_programs import RTOL64, assert_losses_match, float32_rtol

PROGRAM = Path(__file__).resolve().parent / "programs" / "reinforce.py"


def _run(args: list, cwd: Path, torch_lib: bool = False) -> str:
    env: Dict[str, str] = {"USE_MPITENSOR": "0" if torch_lib else "1", "OMP_NUM_THREADS": "1"}
    rc, out, err, _ = run_job(["timeout", "-k", "5", "120", sys.executable, str(PROGRAM),
                               *args], timeout=140, cwd=cwd, env=env)
    assert rc == 0, f"reinforce.py under {'torch' if torch_lib else 'mpitensor'}:\n{out}\n{err}"
    return out


def steps(out: str) -> Dict[int, float]:
    """step -> loss of the "step N loss X" lines (a policy-gradient loss may be negative, which
    the other programs' parser does not take)."""
    found = {int(n): float(v) for n, v in re.findall(r"step (\d+) loss (\S+)", out)}
    assert found, f"no 'step N loss X' line in:\n{out[-3000:]}"
    return found


def _rewards(out: str) -> tuple:
    m = re.search(r"last 10 steps (-?\d+\.\d+) \(first 10: (-?\d+\.\d+)\)", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


def test_reinforce_learns(tmp_path: Path) -> None:
    out = _run([], tmp_path)
    assert sorted(steps(out)) == list(range(1, 61))
    last, first = _rewards(out)
    assert last > first + 0.3, out  # the policy learned to pick the better arms


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_reinforce_matches_torch(dtype: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["--steps", "40", "--dtype", dtype]
    ours, theirs = _run(args, tmp_path), _run(args, tmp_path, torch_lib=True)
    rtol = RTOL64 if dtype == "float64" else float32_rtol(40)
    assert_losses_match(steps(ours), steps(theirs), f"reinforce.py {dtype}", rtol)
    if dtype == "float64":
        assert _rewards(ours) == _rewards(theirs)  # the same actions were taken
