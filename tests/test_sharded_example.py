"""examples/sharded_training.py from the user's side: the command docs/sharding.md shows, run
as written, trains the model a single process trains, and torch runs the same program.

Spec:
- ``mpiexec -n 4 python examples/sharded_training.py`` (the docs' command, found in the doc and
  run through bash from the repository root) trains on a 2x2 mesh (tensor parallel over "tp",
  DDP over "dp") and its loss falls;
- every step's loss equals the loss of the same model trained by one process without any
  parallelism (``--no-parallel``) to 1e-5 relative: the runs differ only in the order of
  float32 sums (partial products reduced over "tp", per-rank means averaged over "dp"), a few
  ulps per step, which 20 AdamW steps grow to about 1e-6 here;
- ``--fsdp`` (torch's FSDP2 + TP recipe: ``fully_shard`` over "dp" instead of DDP), run as
  docs/sharding.md shows it at 4 ranks, trains the same model to 1e-5 for 20 steps, on the
  degenerate meshes and with ``--loss-parallel`` too, and torch runs the same ``--fsdp``
  program to the same losses;
- the degenerate meshes (1 rank: 1x1; 2 ranks: 1x2; 3 ranks: 3x1), four-way tensor
  parallelism (1x4) and the loss on class-split logits (``--loss-parallel``) train the same
  model too;
- flags that do not fit the world print one line on stderr and exit with code 2;
- under torch (``USE_MPITENSOR=0``, gloo, where torch is installed) the same program at 4
  ranks prints the same header and the same losses to 1e-5.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pytest

from .launch import find_mpiexec, run_job

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "sharding.md"
TIMEOUT = float(os.environ.get("MPITENSOR_EXAMPLE_TIMEOUT", "120"))
RTOL = 1e-5
STEPS = 20
_STEP = re.compile(r"^step (\d+)/(\d+): loss (\d+\.\d+)$", re.MULTILINE)
_FINAL = re.compile(r"^final loss (\d+\.\d+) after (\d+) steps \(step 1: (\d+\.\d+)\)$",
                    re.MULTILINE)


def _env(extra: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Optional[str]]:
    # a new user's shell: this Python and mpiexec first on PATH, nothing else set
    bindirs = {str(Path(sys.executable).parent), str(Path(find_mpiexec()).parent)}
    env: Dict[str, Optional[str]] = {
        "PATH": os.pathsep.join([*bindirs, os.environ.get("PATH", "")]),
        "PYTHONUNBUFFERED": None, "USE_MPITENSOR": None}
    env.update(extra or {})
    return env


def run(command: str, expect: int = 0, env: Optional[Dict[str, Optional[str]]] = None,
        tries: int = 1) -> str:
    """Run ``command`` in bash from the repository root under a hard timeout; return stdout
    (stderr where a failure is expected)."""
    for _ in range(tries):
        extra = {} if env is None else {**env, "MASTER_PORT": str(_free_port())}
        rc, out, err, _ = run_job(["bash", "-c", command], timeout=TIMEOUT, cwd=ROOT,
                                  env=_env(extra))
        if rc == expect:
            break
    assert rc == expect, f"{command} exited {rc}, not {expect}:\n{out[-4000:]}\n{err[-4000:]}"
    return out if expect == 0 else err


def losses(out: str, steps: int = STEPS) -> np.ndarray:
    """The per-step losses a run printed, checked against its final line."""
    found = [(int(s), int(n), float(v)) for s, n, v in _STEP.findall(out)]
    assert [s for s, _, _ in found] == list(range(1, steps + 1)), out
    assert {n for _, n, _ in found} == {steps}, out
    final = _FINAL.findall(out)
    assert len(final) == 1, out
    values = np.array([v for _, _, v in found])
    last, n, first = final[0]
    assert (float(last), int(n), float(first)) == (values[-1], steps, values[0]), out
    return values


def documented_command(flags: str = "") -> str:
    """The 4-rank command of docs/sharding.md (with ``flags``), as written there."""
    lines = [ln[2:].strip() for ln in DOC.read_text().splitlines()
             if ln.startswith("$ ") and "sharded_training.py" in ln]
    command = f"mpiexec -n 4 python examples/sharded_training.py {flags}".strip()
    assert command in lines, lines
    return command


@pytest.fixture(scope="module")
def single() -> np.ndarray:
    """The losses of the same model on one process, without any parallelism."""
    out = run("python examples/sharded_training.py --no-parallel")
    assert out.splitlines()[0] == ("sharded_training: 2-layer transformer, 18,176 parameters; "
                                   "one process, no parallelism"), out
    return losses(out)


@pytest.fixture(scope="module")
def two_by_two() -> str:
    return run(documented_command())


def test_documented_command_trains_on_a_2x2_mesh(two_by_two: str) -> None:
    head = two_by_two.splitlines()[0]
    assert head == ("sharded_training: 2-layer transformer, 18,176 parameters; 4 rank(s) as a "
                    "2x2 mesh (dp=2, tp=2); layers.0.attention.wq.weight (Shard(dim=0),) over "
                    "tp, local (16, 32) of (32, 32)"), two_by_two
    got = losses(two_by_two)
    assert got[-1] < 0.6 * got[0], got  # it learns: 2.83 -> 1.37 here
    assert len(two_by_two.splitlines()) == STEPS + 2, two_by_two  # rank 0 prints, alone


def test_2x2_mesh_trains_the_single_process_model(two_by_two: str,
                                                  single: np.ndarray) -> None:
    np.testing.assert_allclose(losses(two_by_two), single, rtol=RTOL)


@pytest.mark.parametrize("n, mesh", [(1, "1x1 mesh (dp=1, tp=1)"), (2, "1x2 mesh (dp=1, tp=2)"),
                                     (3, "3x1 mesh (dp=3, tp=1)")])
def test_degenerate_meshes_train_the_same_model(n: int, mesh: str,
                                                single: np.ndarray) -> None:
    out = run(f"mpiexec -n {n} python examples/sharded_training.py --steps 8")
    assert f"{n} rank(s) as a {mesh}" in out.splitlines()[0], out
    np.testing.assert_allclose(losses(out, 8), single[:8], rtol=RTOL)


def test_four_way_tensor_parallel(single: np.ndarray) -> None:
    out = run("mpiexec -n 4 python examples/sharded_training.py --tp 4 --steps 8")
    assert "1x4 mesh (dp=1, tp=4)" in out and "local (8, 32) of (32, 32)" in out, out
    np.testing.assert_allclose(losses(out, 8), single[:8], rtol=RTOL)


def test_loss_parallel_on_class_split_logits(single: np.ndarray) -> None:
    out = run("mpiexec -n 4 python examples/sharded_training.py --loss-parallel --steps 8")
    assert "2x2 mesh (dp=2, tp=2)" in out, out
    np.testing.assert_allclose(losses(out, 8), single[:8], rtol=RTOL)


@pytest.fixture(scope="module")
def fsdp_two_by_two() -> str:
    return run(documented_command("--fsdp"))


def test_fsdp_over_dp_trains_the_single_process_model(fsdp_two_by_two: str,
                                                      single: np.ndarray) -> None:
    head = fsdp_two_by_two.splitlines()[0]
    assert head.endswith("local (16, 32) of (32, 32); fully_shard over dp"), head
    assert "2x2 mesh (dp=2, tp=2)" in head, head
    np.testing.assert_allclose(losses(fsdp_two_by_two), single, rtol=RTOL)


@pytest.mark.parametrize("n, flags, mesh", [(2, "", "1x2"), (3, "", "3x1"),
                                            (4, "--loss-parallel", "2x2")])
def test_fsdp_on_other_meshes_and_with_loss_parallel(n: int, flags: str, mesh: str,
                                                     single: np.ndarray) -> None:
    out = run(f"mpiexec -n {n} python examples/sharded_training.py --fsdp {flags} --steps 8")
    assert f"{n} rank(s) as a {mesh} mesh" in out and "fully_shard over dp" in out, out
    np.testing.assert_allclose(losses(out, 8), single[:8], rtol=RTOL)


@pytest.mark.parametrize("command, message", [
    ("mpiexec -n 2 python examples/sharded_training.py --tp 4",
     "sharded_training.py: --tp 4 must be 1, 2 or 4 and divide the world size 2"),
    ("mpiexec -n 2 python examples/sharded_training.py --no-parallel",
     "sharded_training.py: --no-parallel trains on one process: run it without mpiexec "
     "(python examples/sharded_training.py --no-parallel)"),
    ("python examples/sharded_training.py --fsdp --no-parallel",
     "sharded_training.py: --fsdp shards over a mesh: leave out --no-parallel"),
])
def test_flags_that_do_not_fit_the_world(command: str, message: str) -> None:
    err = run(command, expect=2)
    assert [ln for ln in err.splitlines() if ln.strip()] == [message], err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torch_run(flags: str = "") -> str:
    pytest.importorskip("torch")
    env = {"USE_MPITENSOR": "0", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    # a second try (on a fresh port): torch's gloo teardown now and then aborts after the
    # work is done
    return run(documented_command(flags), env=env, tries=2)


def test_torch_runs_the_same_program(two_by_two: str) -> None:
    """The oracle: torch's DTensor, tensor parallelism and DDP (gloo) on the same program."""
    theirs = _torch_run()
    assert theirs.splitlines()[0] == two_by_two.splitlines()[0], theirs
    np.testing.assert_allclose(losses(two_by_two), losses(theirs), rtol=RTOL)


def test_torch_runs_the_same_fsdp_program(fsdp_two_by_two: str) -> None:
    """The oracle of ``--fsdp``: torch's fully_shard over "dp" on its tensor-parallel model."""
    theirs = _torch_run("--fsdp")
    assert theirs.splitlines()[0] == fsdp_two_by_two.splitlines()[0], theirs
    np.testing.assert_allclose(losses(fsdp_two_by_two), losses(theirs), rtol=RTOL)

