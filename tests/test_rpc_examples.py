"""End-to-end tests of the RPC examples: ``parameter_server.py`` and ``pipeline_rpc.py``.

Each run is a real ``mpiexec`` job (2 or 3 ranks, a few dozen steps) under a hard timeout,
started in an empty temporary directory that must still be empty afterwards; ``run_job``
kills the whole job on a hang and fails the test if any of its processes outlives it. The job's
exit code is the worst of its ranks', so a clean exit means every rank exited 0; the workers
print nothing, so the lines checked are all the job printed, and stderr must stay empty.

The data is the shared MNIST test set (``../shared/data/mnist``) where it is present, else
scikit-learn's Digits. ``MPITENSOR_RPC_EXAMPLE_TIMEOUT`` (seconds, default 180) bounds each
launch. The last test covers the fix these examples needed in ``init_rpc``: each rank's BLAS
pools fitted to its share of the cores, as ``init_process_group`` does.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import pytest

from .launch import find_mpiexec, run_job

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MNIST_DIR = ROOT.parent / "shared" / "data" / "mnist"
HAVE_MNIST = all((MNIST_DIR / f"t10k-{k}-idx{d}-ubyte.gz").is_file()
                 for k, d in (("images", 3), ("labels", 1)))
DATA = (["--dataset", "mnist", "--data-dir", str(MNIST_DIR)] if HAVE_MNIST
        else ["--dataset", "digits"])
TIMEOUT = float(os.environ.get("MPITENSOR_RPC_EXAMPLE_TIMEOUT", "180"))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "GOTO_NUM_THREADS", "MPITENSOR_NUM_THREADS")

_NUM = r"(\d+\.\d+)"
PS_INITIAL = re.compile(rf"^initial held-out loss {_NUM}, accuracy {_NUM}% \((\d+)/(\d+)\)$")
PS_EPOCH = re.compile(rf"^epoch (\d+)/(\d+): train loss {_NUM}, held-out loss {_NUM}, "
                      rf"accuracy {_NUM}% \((\d+)/(\d+)\), [\d,]+ samples/s$")
PS_FINAL = re.compile(rf"^final held-out accuracy {_NUM}% \((\d+)/(\d+)\) after (\d+) "
                      r"epoch\(s\), (\d+) updates from (\d+) worker\(s\), (sync|async), (\w+)$")
DDP_EPOCH = re.compile(rf"^epoch (\d+)/(\d+): train loss {_NUM}, held-out accuracy {_NUM}% "
                       r"\((\d+)/(\d+)\), [\d,]+ samples/s$")
DDP_FINAL = re.compile(rf"^final held-out accuracy {_NUM}% \((\d+)/(\d+)\) after")
PIPE_STEP = re.compile(rf"^step (\d+): loss {_NUM}(?:, single process {_NUM})?$")
PIPE_ACCURACY = re.compile(rf"^held-out accuracy {_NUM}% \((\d+)/(\d+)\) after (\d+) step\(s\); "
                           r"pipeline [\d,]+ samples/s$")
PIPE_WEIGHTS = re.compile(r"^single process [\d,]+ samples/s; largest weight difference after "
                          r"training (\S+)$")
PIPE_DIFF = re.compile(r"^max relative difference of the (\d+) per-step losses: (\S+) "
                       r"\(tolerance 1e-05\): (ok|MISMATCH)$")


@pytest.fixture
def workdir() -> Iterator[Path]:
    """An empty directory to run in, deleted afterwards (pytest's own keeps old runs)."""
    with tempfile.TemporaryDirectory(prefix="mpitensor-rpc-examples-") as d:
        yield Path(d)


def launch(nprocs: int, script: Path, args: Sequence[str], cwd: Path,
           env: Optional[dict] = None) -> Tuple[int, List[str], str]:
    """``mpiexec -n nprocs python script args`` in ``cwd``: (exit code, stdout lines, stderr)."""
    code, out, err, _ = run_job([find_mpiexec(), "-n", str(nprocs), sys.executable,
                                 str(script), *args], timeout=TIMEOUT, cwd=cwd, env=env)
    return code, [line for line in out.splitlines() if line.strip()], err


def run_ok(nprocs: int, name: str, args: Sequence[str], cwd: Path) -> List[str]:
    """Run an example that must succeed on every rank, say nothing on stderr, write nothing."""
    code, lines, err = launch(nprocs, EXAMPLES / name, args, cwd)
    assert code == 0, f"{name} exited {code}:\n" + "\n".join(lines) + "\n" + err
    assert err == "", f"{name} wrote to stderr:\n{err}"
    assert not any(cwd.iterdir()), f"{name} left files: {sorted(cwd.iterdir())}"
    return lines


def match_all(pattern: re.Pattern, lines: Sequence[str]) -> List[re.Match]:
    return [m for m in map(pattern.match, lines) if m]


# ------------------------------------------------------------------------ parameter server
def _ps_lines(lines: Sequence[str]) -> Tuple[re.Match, List[re.Match], re.Match]:
    """The server's lines: a header, the initial evaluation, one per epoch, the final one."""
    assert lines[0].startswith("parameter server on rank 0, 2 worker(s): LeNet on "), lines[0]
    initial, final = PS_INITIAL.match(lines[1]), PS_FINAL.match(lines[-1])
    per_epoch = [PS_EPOCH.match(line) for line in lines[2:-1]]
    assert initial and final and per_epoch and all(per_epoch), "\n".join(lines)
    assert [int(m.group(1)) for m in per_epoch] == list(range(1, len(per_epoch) + 1)), lines
    assert int(final.group(4)) == len(per_epoch), final.group(0)
    return initial, per_epoch, final


def _assert_learned(initial: re.Match, last: re.Match, final: re.Match, min_accuracy: float,
                    max_loss_ratio: float) -> None:
    start_loss, start_acc = float(initial.group(1)), float(initial.group(2))
    assert 2.0 < start_loss < 2.6 and start_acc < 25.0, initial.group(0)  # an untrained net
    end_loss, end_acc = float(last.group(4)), float(last.group(5))
    assert end_loss < max_loss_ratio * start_loss, (initial.group(0), last.group(0))
    assert end_acc >= min_accuracy, last.group(0)
    assert float(final.group(1)) == end_acc, (last.group(0), final.group(0))


def test_parameter_server_sync_is_ddp(workdir: Path) -> None:
    """Sync mode: 2 workers at batch 32 compute exactly what DDP on 2 ranks does."""
    budget = ["--train-size", "2000", "--epochs", "2", "--max-steps", "40", *DATA]
    lines = run_ok(3, "parameter_server.py", budget, workdir)
    initial, per_epoch, final = _ps_lines(lines)
    assert "sync SGD, batch 32 per worker = 64 per update" in lines[0], lines[0]
    assert len(per_epoch) == 2, lines  # 32 steps in epoch 1 (MNIST; 23 for Digits), then 2
    assert final.group(5, 6, 7) == ("40", "2", "sync"), final.group(0)
    _assert_learned(initial, per_epoch[-1], final, min_accuracy=50.0, max_loss_ratio=0.6)

    ddp_dir = workdir / "ddp"
    ddp_dir.mkdir()
    code, ddp, err = launch(2, EXAMPLES / "train.py",
                            [*budget, "--no-plot", "--no-progress", "--checkpoint-dir",
                             str(ddp_dir / "ckpt")], ddp_dir)
    assert code == 0, "\n".join(ddp) + err
    (epoch1,) = match_all(DDP_EPOCH, ddp)  # --max-steps 40 stops inside epoch 2
    (ddp_final,) = match_all(DDP_FINAL, ddp)
    # same train loss and held-out accuracy after epoch 1, same accuracy after 40 steps
    assert per_epoch[0].group(3) == epoch1.group(3), (per_epoch[0].group(0), epoch1.group(0))
    assert per_epoch[0].group(5, 6) == epoch1.group(4, 5), (per_epoch[0].group(0),
                                                           epoch1.group(0))
    assert final.group(1, 2) == ddp_final.group(1, 2), (final.group(0), ddp_final.group(0))


def test_parameter_server_async_learns(workdir: Path) -> None:
    """Async mode: every push is an update (2 per step); the loss falls, the accuracy rises.

    The order of the pushes, and so the result, changes from run to run: the bounds are loose
    (measured after 100 steps at async mode's default momentum of 0.7 on MNIST: 84.2-88.4 %
    over 56 runs, 22 of them beside two busy loops or with one worker 0.2 s late every step,
    held-out loss 0.45-0.50, from 2.31 and 9.3 %; three on Digits, 92 steps: 75.5-86.4 %, loss
    0.47-0.75 from 2.30). The first epoch decides most of it (42-59 % after it in those runs).
    A fresh-clone CI run ended at 69.80 %, its loss under the bound (its per-epoch lines were
    not kept; a late start off LeNet's first plateau would explain it), so the accuracy bound
    is 60 % (chance is 10 %), the loss bound 0.4x. At momentum 0.9 about one run in eight stayed near chance for two epochs (a
    CI run ended at 38.65 %, loss 2.01): these bounds still catch that.
    """
    args = ["--mode", "async", "--train-size", "2000", "--epochs", "4", "--max-steps", "100",
            *DATA]
    lines = run_ok(3, "parameter_server.py", args, workdir)
    initial, per_epoch, final = _ps_lines(lines)
    per_epoch_steps = int(re.search(r"4 epoch\(s\) of (\d+) steps", lines[0]).group(1))
    steps = min(100, 4 * per_epoch_steps)
    assert final.group(5, 6, 7) == (str(2 * steps), "2", "async"), final.group(0)
    assert "async SGD, batch 32 per worker = 32 per update" in lines[0], lines[0]
    assert "momentum 0.7," in lines[0], lines[0]
    bounds = dict(min_accuracy=60.0, max_loss_ratio=0.4) if HAVE_MNIST else dict(
        min_accuracy=50.0, max_loss_ratio=0.5)
    _assert_learned(initial, per_epoch[-1], final, **bounds)


FAILING_WORKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {examples!r})
    import parameter_server as ps
    from mpitensor.distributed.launch import launcher_rank

    def broken(self, epoch, steps):
        raise ValueError("worker2 broke")

    if launcher_rank() == 2:
        ps.Worker.train_epoch = broken
    sys.exit(ps.main())
""")


def test_parameter_server_worker_error_fails_fast(workdir: Path) -> None:
    """A worker that raises: the server reports its error and traceback, nobody waits for it.

    Worker 1's pushes wait for worker 2's gradient; the server fails them as soon as worker 2's
    call fails, instead of leaving them to the 60 s RPC timeout.
    """
    script = workdir / "failing_worker.py"
    script.write_text(FAILING_WORKER.format(examples=str(EXAMPLES)))
    t0 = time.monotonic()
    code, lines, err = launch(3, script, ["--epochs", "1", *DATA], workdir)
    elapsed = time.monotonic() - t0
    assert code != 0, "\n".join(lines) + err
    assert "ValueError: worker2 broke" in err and "On WorkerInfo(id=2, name=worker2)" in err, err
    assert elapsed < 30, f"took {elapsed:.0f} s: the other worker waited for a timeout\n{err}"


@pytest.mark.parametrize("name", ["parameter_server.py", "pipeline_rpc.py"])
def test_one_rank_is_refused(name: str, workdir: Path) -> None:
    """Launched on one rank, the example says why in one line and exits with code 2."""
    code, lines, err = launch(1, EXAMPLES / name, [], workdir)
    assert code == 2 and not lines, (code, lines, err)
    (line,) = err.splitlines()
    assert line.startswith(f"{name} needs at least 2 ranks"), err
    assert line.endswith(f"run `mpiexec -n 3 python examples/{name}`"), err


# ------------------------------------------------------------------------ pipeline
def _pipeline_check(lines: Sequence[str], steps: int) -> float:
    """Assert the --check output of ``steps`` steps; return the largest relative difference."""
    step_lines = match_all(PIPE_STEP, lines)
    assert [int(m.group(1)) for m in step_lines] == list(range(1, steps + 1)), "\n".join(lines)
    ours = [float(m.group(2)) for m in step_lines]
    single = [float(m.group(3)) for m in step_lines]
    # recomputed from the printed losses (8 decimals: 4e-9 relative at a loss near 2.3)
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, single))
    assert worst <= 1e-5, list(zip(ours, single))
    assert all(math.isfinite(v) and 0.0 < v < 5.0 for v in ours), ours
    (diff,) = match_all(PIPE_DIFF, lines)
    assert int(diff.group(1)) == steps and diff.group(3) == "ok", diff.group(0)
    assert float(diff.group(2)) <= 1e-5, diff.group(0)
    (weights,) = match_all(PIPE_WEIGHTS, lines)
    assert float(weights.group(1)) < 1e-5, weights.group(0)
    (acc,) = match_all(PIPE_ACCURACY, lines)
    assert int(acc.group(4)) == steps and 0.0 <= float(acc.group(1)) <= 100.0, acc.group(0)
    assert len(lines) == steps + 4, "\n".join(lines)  # header, steps, accuracy, 2 check lines
    return float(diff.group(2))


@pytest.mark.parametrize("chunks", [1, 4])
def test_pipeline_matches_single_process(chunks: int, workdir: Path) -> None:
    """Three ranks (trainer, conv stage, fc stage): each step's loss is the single process's."""
    lines = run_ok(3, "pipeline_rpc.py",
                   ["--max-steps", "12", "--log-every", "1", "--check", "--chunks", str(chunks),
                    "--train-size", "2000", *DATA], workdir)
    assert lines[0].startswith("pipeline: LeNet's conv1-conv2 on worker1, fc1-fc3 on worker2, "
                               "driven by trainer;"), lines[0]
    assert f"batch 64 in {chunks} micro-batch(es), 12 step(s)" in lines[0], lines[0]
    _pipeline_check(lines, 12)


def test_pipeline_two_ranks_uneven_chunks(workdir: Path) -> None:
    """Two ranks: the conv stage on the trainer itself (RPCs to itself); 64 = 22 + 22 + 20."""
    lines = run_ok(2, "pipeline_rpc.py",
                   ["--max-steps", "4", "--log-every", "1", "--check", "--chunks", "3",
                    "--train-size", "2000", *DATA], workdir)
    assert lines[0].startswith("pipeline: LeNet's conv1-conv2 on trainer, fc1-fc3 on worker1"), \
        lines[0]
    _pipeline_check(lines, 4)


# ------------------------------------------------------------------------ init_rpc's threads
THREAD_PROBE = textwrap.dedent("""
    import json
    import sys
    from mpi4py import MPI
    from threadpoolctl import threadpool_info
    import mpitensor.distributed.rpc as rpc
    from mpitensor._base import threads as _threads

    rank = MPI.COMM_WORLD.Get_rank()
    rpc.init_rpc(f"worker{rank}")          # no process group
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    mine = _threads.affinity()
    everyone = [frozenset(s) for s in node.allgather(sorted(mine))]
    blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    row = json.dumps({"rank": rank, "blas": blas,
                      "expected": _threads.fair_share(mine, everyone,
                                                      _threads.cgroup_cpu_limit())})
    sys.stdout.write(row + "\\n")  # one write: the ranks share mpiexec's stdout
    sys.stdout.flush()
    rpc.shutdown()
""")


def test_init_rpc_fits_thread_pools(workdir: Path) -> None:
    """``init_rpc`` alone gives every rank's BLAS pool its fair share of the node's cores.

    Without it, each of 3 ranks on 2 cores kept one BLAS thread per core, and a pipeline step
    of pipeline_rpc.py took 150 ms instead of 20 ms.
    """
    script = workdir / "probe.py"
    script.write_text(THREAD_PROBE)
    code, lines, err = launch(3, script, [], workdir, env={v: None for v in THREAD_VARS})
    assert code == 0, "\n".join(lines) + err
    # each rank's row is one JSON object; on a busy machine mpiexec may still join two ranks'
    # output on one line, so the objects are taken from the text, not line by line
    objects = re.findall(r"\{[^{}]*\}", "\n".join(lines))
    rows = sorted((json.loads(obj) for obj in objects), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1, 2], lines
    for row in rows:
        assert row["blas"] and set(row["blas"]) == {row["expected"]}, row


def test_pipeline_one_micro_batch_on_digits_is_bit_for_bit(workdir: Path) -> None:
    """docs/rpc.md: with one micro-batch the pipeline is "bit for bit" the single process's.

    On Digits it was not (largest weight difference 6.9e-08 over the default epoch): loading
    scikit-learn after init_rpc brought SciPy's OpenBLAS at a thread per core into the trainer
    only, and the trainer's convolutions then split their sums two ways where the stages'
    split one way. Here one step at a batch of 30 is enough to show it.
    """
    lines = run_ok(3, "pipeline_rpc.py",
                   ["--dataset", "digits", "--batch-size", "30", "--max-steps", "3", "--check"],
                   workdir)
    weights = [m for m in map(PIPE_WEIGHTS.match, lines) if m]
    diff = [m for m in map(PIPE_DIFF.match, lines) if m]
    assert weights and weights[0].group(1) == "0.0e+00", "\n".join(lines)
    assert diff and diff[0].group(2) == "0.0e+00", "\n".join(lines)
