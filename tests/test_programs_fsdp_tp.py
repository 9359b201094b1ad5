"""A 2-D parallel program of our own (tests/programs/fsdp_tp_transformer.py: a small decoder,
tensor and sequence parallel over "tp", ``fully_shard`` over "dp", AdamW, gradient clipping),
run as a user runs it: under mpitensor with ``mpiexec -n N python ...`` and under torch (the
oracle) with torchrun, from the same weights and batches. Every rank's printed loss and
gradient norm at every step, and the sum of the final weights, agree with torch's: to 1e-10 in
float64 over 6 steps (sums of a few hundred terms, reduced in other orders), to 1e-5 in float32
over 3 steps.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from .launch import clean_env, mpiexec_run, run_job
from .test_programs_rpc import free_ports

PROGRAM = Path(__file__).resolve().parent / "programs" / "fsdp_tp_transformer.py"
NUMBER = r"(-?\d+\.\d{12})"  # fixed decimals: lines of several ranks may run together
STEP = re.compile(rf"rank (\d+) step (\d+) loss {NUMBER} norm {NUMBER}")
FINAL = re.compile(rf"rank (\d+) weight sum {NUMBER}")
RTOL = {"float32": 1e-5, "float64": 1e-10}


def _records(out: str) -> Dict[Tuple, float]:
    rows: Dict[Tuple, float] = {}
    for rank, step, loss, norm in STEP.findall(out):
        rows[(int(rank), int(step), "loss")] = float(loss)
        rows[(int(rank), int(step), "norm")] = float(norm)
    for rank, total in FINAL.findall(out):
        rows[(int(rank), "weight sum")] = float(total)
    return rows


def _ours(n: int, args: List[str], cwd: Path) -> str:
    res = mpiexec_run(n, [sys.executable, str(PROGRAM), *args], timeout=240, cwd=cwd,
                      env=clean_env({"OMP_NUM_THREADS": "1"}))
    assert not res.timed_out and res.returncode == 0, res.output
    return res.output


def _torch(n: int, args: List[str], cwd: Path) -> str:
    env = clean_env({"USE_MPITENSOR": "0", "OMP_NUM_THREADS": "1"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
           "--master-port", str(free_ports(1)[0]), str(PROGRAM), *args]
    rc, out, err, _ = run_job(["timeout", "-k", "5", "240", *cmd], timeout=260, cwd=cwd, env=env)
    if rc != 0:
        # torch 2.13 over gloo sometimes aborts a worker at exit, after the program finished
        # ("terminate called without an active exception", seen once in a fresh-clone CI): its
        # records are complete, so the oracle's numbers stand; any other failure fails
        teardown = "terminate called without an active exception" in err
        assert teardown and len(FINAL.findall(out)) == n, f"{out}\n{err}"
    return out


@pytest.mark.parametrize("n, tp, dtype, loss_parallel", [
    (4, 2, "float64", False),   # the 2x2 mesh
    (4, 2, "float32", True),    # logits sharded over the vocabulary, loss_parallel
    (2, 2, "float64", True),    # dp of one: tensor parallel only, fully_shard a no-op split
    (2, 1, "float64", False),   # tp of one: fully_shard over two, plans on a 1-rank mesh
])
def test_program_matches_torch(n: int, tp: int, dtype: str, loss_parallel: bool,
                               tmp_path: Path) -> None:
    # float32: AdamW divides by the root of small second moments, so the roundings of the
    # two libraries' gradients grow from step to step (seen 1.5e-5 in the gradient norm at
    # step 6); 3 steps stay within 16 u per step (tests/test_ported_programs.float32_rtol)
    steps = 6 if dtype == "float64" else 3
    args = ["--steps", str(steps), "--tp", str(tp), "--dtype", dtype]
    args += ["--loss-parallel"] if loss_parallel else []
    ours = _records(_ours(n, args, tmp_path))
    assert len(ours) == n * (2 * steps + 1), ours
    # the ranks of one tensor-parallel line see one batch: one loss; every rank one norm
    for step in range(1, steps + 1):
        assert len({ours[(r, step, "norm")] for r in range(n)}) == 1
        for r in range(n):
            assert ours[(r, step, "loss")] == ours[(r - r % tp, step, "loss")]
    losses = [ours[(r, s, "loss")] for r in range(n) for s in (1, steps)]
    assert all(2.0 < v < 6.0 for v in losses), losses  # cross-entropy over 48 tokens, ~ln 48
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("torch is not installed (the oracle)")
    theirs = _records(_torch(n, args, tmp_path))
    assert sorted(ours, key=str) == sorted(theirs, key=str)
    for key, value in ours.items():
        assert value == pytest.approx(theirs[key], rel=RTOL[dtype]), (key, value, theirs[key])
