"""The torch programs of ``examples/ported``, run as a user runs them, and against PyTorch.

Each program picks its library with one switch (``USE_MPITENSOR``, default 1: mpitensor) and is
otherwise plain torch code. The tests run every program under mpitensor, the way its docstring
says (``python`` or ``mpiexec``), and, where PyTorch is installed, run it a second time under
torch with the same initial weights (an ``.npz`` written here), the same data order and no
randomness that cannot match across libraries (``--dropout 0``, ``--fixed-noise``,
``--no-shuffle``), and compare what they print and save.

What the comparison may assume holds on every x86-64 machine, whichever BLAS kernels NumPy's and
torch's libraries pick there (OpenBLAS chooses by processor; ``OPENBLAS_CORETYPE`` may force one):
the two libraries do the same operations, but sum their products in different orders. So:

* **In float64** (``--dtype float64``) the two runs agree to :data:`RTOL64`: losses, test
  results, and the final weights. Rounding (2**-53 a step) amplified over a few dozen steps is
  still many orders of magnitude below it.
* **In float32** (the programs' default) each printed loss agrees to :func:`float32_rtol` relative,
  float32 rounding (2**-24) times the steps taken with a generous constant, up to the first step
  where a tie may have been broken the other way: a max-pooling window or a ReLU whose inputs
  tie to within an ulp routes a gradient differently under another summation order, a
  legitimate difference of the order of the gradient itself in a few weights (seen: 2 of 400
  conv1 weights differing by 2.8e-4 after 16 Adadelta steps, on a machine whose OpenBLAS picked
  SkylakeX kernels). From that step on the losses agree to :data:`TIE_RTOL`. Final weights and
  argmax counts are not compared in float32; weights are compared in float64, where no such tie
  arises.

Every launch runs under coreutils ``timeout`` and ``tests/launch.py``'s hard timeout, in
``tmp_path``, and must leave no process behind.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from .launch import find_mpiexec, run_job

ROOT = Path(__file__).resolve().parent.parent
PORTED = ROOT / "examples" / "ported"
# the shared MNIST test set beside the checkout, as in test_train.py (never copied into it)
MNIST = Path(os.environ.get("MPITENSOR_MNIST_DIR", ROOT.parent / "shared" / "data" / "mnist"))
TIMEOUT = float(os.environ.get("MPITENSOR_PORTED_TIMEOUT", "90"))
#: float64 runs of the two libraries: 2**-53 rounding, amplified by a few dozen training steps,
#: stays below 1e-12 (seen: 7e-16); this leaves three orders of magnitude for other kernels
RTOL64 = 1e-9
#: float32 unit roundoff
U32 = 2.0 ** -24
#: float32 losses once a tie went the other way (see above): a few weights then move by one
#: optimizer step of the other gradient. Adadelta's first steps move a weight by about
#: sqrt(eps) = 1e-3 whatever its gradient, and the loss changes by 1e-2-1e-1 of that per weight
#: (its gradient), so 1e-5-1e-4 relative for each weight routed otherwise: this bound covers a
#: handful. Seen: 2.2e-5 at the last of mnist_cnn's 16 steps, all 15 before within 2e-7, where
#: torch's oneDNN took AVX-512 kernels (2026-11-30; with ONEDNN_MAX_CPU_ISA=AVX2, 1e-7 at every
#: step). Real errors are the float64 runs' business (RTOL64).
TIE_RTOL = 1e-3


def float32_rtol(steps: int) -> float:
    """The relative bound on a float32 loss after ``steps`` steps: each step's forward rounds at
    u = 2**-24 per operation and inherits the rounding of the weights from every step before;
    16 u per step covers the sums' depth and the losses' conditioning (seen: under 2 u per step).
    """
    return 16 * U32 * max(steps, 1)

needs_mnist = pytest.mark.skipif(
    not (MNIST / "t10k-images-idx3-ubyte.gz").exists()
    and not (MNIST / "t10k-images-idx3-ubyte").exists(),
    reason=f"no MNIST IDX files in {MNIST} (set MPITENSOR_MNIST_DIR)")

_STEP = re.compile(r"step (\d+) (?:\[[^\]]*\] )?loss (\d+\.\d+)")
_RANK_STEP = re.compile(r"rank (\d+) epoch \d+ step (\d+) loss (\d+\.\d+)")
# PYTHONUNBUFFERED splits a print into two writes, so lines of two ranks can run together:
# results are found by pattern anywhere in the output, never by splitting it into lines.
_RESULT = re.compile(r"rank (\d+) ([^:\n]+?): (tensor\(.*?\]\))")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_program(name: str, args: Sequence[str], cwd: Path, *, nprocs: Optional[int] = None,
                torch_lib: bool = False) -> str:
    """Run ``[mpiexec -n N] python examples/ported/name args`` under a timeout; return stdout.

    Asserts exit status 0 and that no process of the job is left.
    """
    cmd = [sys.executable, str(PORTED / name), *args]
    if nprocs is not None:
        cmd = [find_mpiexec(), "-n", str(nprocs), *cmd]
    cmd = ["timeout", "-k", "5", str(int(TIMEOUT)), *cmd]
    env: Dict[str, Optional[str]] = {"USE_MPITENSOR": "0" if torch_lib else "1",
                                     "PYTHONUNBUFFERED": None}
    # torch, the oracle, gets a second try: its gloo teardown now and then aborts or hangs
    # after the program's work is done ("terminate called without an active exception")
    for _attempt in range(2 if torch_lib else 1):
        if torch_lib:
            # one thread per rank on a small machine; a fresh port per run for env://
            env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(_free_port()))
        rc, out, err, _ = run_job(cmd, timeout=TIMEOUT + 15, cwd=cwd, env=env)
        if rc == 0:
            break
    lib = "torch" if torch_lib else "mpitensor"
    assert rc == 0, f"{name} under {lib} exited {rc}:\n{out[-4000:]}\n{err[-4000:]}"
    return out


def _load_program(name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("USE_MPITENSOR", "1")
    spec = importlib.util.spec_from_file_location(f"ported_{name}", PORTED / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save_initial_weights(path: Path, module: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write a freshly initialised model's state dict as an .npz of numpy arrays."""
    prog = _load_program(path.stem, monkeypatch)
    prog.torch.manual_seed(0)
    model = getattr(prog, module)()
    np.savez(path.with_suffix(".npz"),
             **{k: np.asarray(v.numpy()) for k, v in model.state_dict().items()})


def steps(out: str) -> Dict[int, float]:
    found = {int(s): float(v) for s, v in _STEP.findall(out)}
    assert found, f"no 'step N loss X' line in:\n{out[-3000:]}"
    return found


def rank_steps(out: str) -> Dict[Tuple[int, int], float]:
    found = {(int(r), int(s)): float(v) for r, s, v in _RANK_STEP.findall(out)}
    assert found, f"no 'rank R epoch E step N loss X' line in:\n{out[-3000:]}"
    return found


def assert_losses_match(ours: Dict, theirs: Dict, what: str, rtol: Optional[float] = None,
                        printed: float = 0.0, ties: bool = False) -> None:
    """Each printed loss agrees: to ``rtol`` relative (by default :func:`float32_rtol` of the
    steps, and ``ties``), plus ``printed``, one unit in the last printed place, where both were
    rounded. ``ties`` (float32 runs): from the first loss past that bound on, in step order,
    :data:`TIE_RTOL` (see the module docstring)."""
    if rtol is None:
        rtol, ties = float32_rtol(len(ours)), True
    assert ours.keys() == theirs.keys(), f"different steps: {sorted(ours)} vs {sorted(theirs)}"
    table = "\n".join(f"{k}: mpitensor {ours[k]!r} torch {theirs[k]!r}" for k in sorted(ours))
    tied = None  # the first step past rtol, where a tie may have gone the other way
    # in step order: (rank, step) keys by step (the ranks of a DDP run share their weights)
    for k in sorted(ours, key=lambda k: k[::-1] if isinstance(k, tuple) else k):
        if tied is None and abs(ours[k] - theirs[k]) > rtol * abs(theirs[k]) + printed and ties:
            tied = k
        tol = rtol if tied is None else TIE_RTOL
        assert abs(ours[k] - theirs[k]) <= tol * abs(theirs[k]) + printed, (
            f"{what}: losses differ by more than {tol:.3g} relative (+{printed:g})"
            + (f" from step {tied} on, {rtol:.3g} before" if tied is not None else "")
            + f":\n{table}")


def test_the_loss_comparison_itself() -> None:
    """Rounding-level agreement until a loss departs; with ``ties`` (float32), TIE_RTOL from
    there on, never more; without (float64), no departure at all; steps in order, (rank, step)
    keys by step."""
    theirs = {k: 1.5 for k in range(1, 5)}
    ours = {1: 1.5, 2: 1.5 * (1 + 1e-7), 3: 1.5 * (1 + 2e-5), 4: 1.5 * (1 + 5e-4)}
    assert_losses_match(ours, theirs, "tie", float32_rtol(4), ties=True)
    with pytest.raises(AssertionError, match="from step 3 on"):
        assert_losses_match({**ours, 4: 1.5 * (1 + 2e-3)}, theirs, "past", float32_rtol(4),
                            ties=True)
    with pytest.raises(AssertionError, match=r"more than 9.54e-07 relative \(\+0\):"):
        assert_losses_match(ours, theirs, "float64-like", float32_rtol(1))
    ranked = {(r, s): 1.5 for r in (0, 1) for s in (1, 2)}
    assert_losses_match({**ranked, (0, 2): 1.5 * (1 + 1e-5), (1, 2): 1.5 * (1 + 1e-5)}, ranked,
                        "ddp", float32_rtol(2), ties=True)


def printed_values(pattern: str, out: str) -> Dict[int, float]:
    """The numbers a regular expression's group finds in a program's output, by order."""
    return dict(enumerate(float(v) for v in re.findall(pattern, out)))


def assert_weights_match(ours: Dict, theirs: Dict, rtol: float = RTOL64) -> None:
    """Two state dicts (name -> tensor or array) hold the same names, shapes and dtypes, and each
    tensor agrees to ``rtol`` relative to its largest entry (float64 runs only: see above)."""
    assert ours.keys() == theirs.keys()
    for k in theirs:
        a, b = np.asarray(ours[k].numpy()), np.asarray(theirs[k].numpy())
        assert a.shape == b.shape and a.dtype == b.dtype, (k, a.shape, a.dtype, b.shape, b.dtype)
        scale = max(float(np.abs(b).max()), 1e-300)
        worst = float(np.abs(a - b).max()) / scale
        assert worst <= rtol, f"{k}: differs by {worst:.3g} of its largest entry (> {rtol:g})"


# ------------------------------------------------------------------------------ mnist_cnn
@needs_mnist
def test_mnist_cnn_trains_and_tests(tmp_path: Path) -> None:
    out = run_program("mnist_cnn.py", ["--data-dir", str(MNIST), "--epochs", "1",
                                       "--train-limit", "960", "--batch-size", "32",
                                       "--test-limit", "200", "--log-interval", "10",
                                       "--save-model"], tmp_path)
    losses = steps(out)
    assert sorted(losses) == [1, 11, 21], out
    assert all(np.isfinite(v) and 0 < v < 5 for v in losses.values()), out
    acc = re.search(r"Test set: Average loss: (\d+\.\d+), Accuracy: (\d+)/200 ", out)
    assert acc, out
    assert int(acc.group(2)) > 40, f"chance is 20/200; a trained net does better:\n{out}"
    assert (tmp_path / "mnist_cnn.pt").stat().st_size > 0


@needs_mnist
def test_mnist_cnn_dry_run(tmp_path: Path) -> None:
    out = run_program("mnist_cnn.py", ["--data-dir", str(MNIST), "--dry-run", "--epochs", "2",
                                       "--test-limit", "100"], tmp_path)
    assert sorted(steps(out)) == [1, 2], out  # one batch per epoch
    assert len(re.findall(r"Accuracy: \d+/100 ", out)) == 2, out


@needs_mnist
def test_mnist_cnn_matches_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    save_initial_weights(tmp_path / "mnist_cnn.npz", "Net", monkeypatch)
    args = ["--data-dir", str(MNIST), "--epochs", "2", "--train-limit", "256",
            "--batch-size", "32", "--test-limit", "200", "--log-interval", "1",
            "--dropout", "0", "--init-from", str(tmp_path / "mnist_cnn.npz"), "--save-model"]
    # float32, as users run it: the same losses to float32 rounding
    ours = run_program("mnist_cnn.py", args, tmp_path)
    saved = torch.load(tmp_path / "mnist_cnn.pt")  # mpitensor.save's file, read by torch
    theirs = run_program("mnist_cnn.py", args, tmp_path, torch_lib=True)
    assert sorted(steps(ours)) == list(range(1, 17))
    assert_losses_match(steps(ours), steps(theirs), "mnist_cnn (Adadelta + StepLR)")
    final = torch.load(tmp_path / "mnist_cnn.pt")  # torch's own, same names, shapes, dtypes
    assert {k: (v.shape, v.dtype) for k, v in saved.items()} == \
        {k: (v.shape, v.dtype) for k, v in final.items()}
    assert all(v.dtype == torch.float32 for v in final.values())
    test_loss = r"Test set: Average loss: (\d+\.\d+)"  # printed to 4 decimals
    assert_losses_match(printed_values(test_loss, ours), printed_values(test_loss, theirs),
                        "mnist_cnn test loss", float32_rtol(16), printed=1e-4, ties=True)
    # float64: the same losses, the same test accuracy and the same final weights
    args64 = [*args, "--dtype", "float64"]
    ours = run_program("mnist_cnn.py", args64, tmp_path)
    saved = torch.load(tmp_path / "mnist_cnn.pt")
    theirs = run_program("mnist_cnn.py", args64, tmp_path, torch_lib=True)
    assert_losses_match(steps(ours), steps(theirs), "mnist_cnn float64", RTOL64)
    assert re.findall(r"Accuracy: .*", ours) == re.findall(r"Accuracy: .*", theirs)
    final = torch.load(tmp_path / "mnist_cnn.pt")
    assert all(v.dtype == torch.float64 for v in final.values())
    assert_weights_match(saved, final)


# ------------------------------------------------------------------------------------ vae
@needs_mnist
def test_vae_trains_and_samples(tmp_path: Path) -> None:
    out = run_program("vae.py", ["--data-dir", str(MNIST), "--epochs", "2", "--limit", "512",
                                 "--batch-size", "64", "--log-interval", "4",
                                 "--samples", str(tmp_path / "samples.npy")], tmp_path)
    losses = steps(out)
    assert sorted(losses) == [1, 5, 9, 13], out
    assert losses[13] < losses[1], f"the VAE's loss did not fall:\n{out}"
    epochs = [float(v) for v in re.findall(r"Epoch: \d+ Average loss: (\d+\.\d+)", out)]
    tests = [float(v) for v in re.findall(r"Test set loss: (\d+\.\d+)", out)]
    assert len(epochs) == 2 and len(tests) == 2 and tests[1] < tests[0], out
    sample = np.load(tmp_path / "samples.npy")
    assert sample.shape == (64, 28, 28) and 0 <= sample.min() and sample.max() <= 1


@needs_mnist
def test_vae_matches_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    save_initial_weights(tmp_path / "vae.npz", "VAE", monkeypatch)
    args = ["--data-dir", str(MNIST), "--epochs", "2", "--limit", "384", "--batch-size", "64",
            "--log-interval", "1", "--fixed-noise", "--init-from", str(tmp_path / "vae.npz")]
    test_loss = r"Test set loss: (\d+\.\d+)"  # printed to 4 decimals
    for dtype, rtol in (("float32", float32_rtol(12)), ("float64", RTOL64)):
        ours = run_program("vae.py", [*args, "--dtype", dtype], tmp_path)
        theirs = run_program("vae.py", [*args, "--dtype", dtype], tmp_path, torch_lib=True)
        assert sorted(steps(ours)) == list(range(1, 13))
        f32 = dtype == "float32"
        assert_losses_match(steps(ours), steps(theirs), f"vae (Adam, BCE + KL) {dtype}", rtol,
                            ties=f32)
        assert_losses_match(printed_values(test_loss, ours), printed_values(test_loss, theirs),
                            f"vae test loss {dtype}", rtol, printed=1e-4, ties=f32)


# ----------------------------------------------------------------------------- resnet_ddp
DDP_ARGS = ["--epochs", "2", "--max-steps", "3", "--train-size", "256", "--test-size", "64",
            "--image-size", "16", "--batch-size", "16", "--log-interval", "1"]


def test_resnet_ddp_two_ranks(tmp_path: Path) -> None:
    out = run_program("resnet_ddp.py", [*DDP_ARGS, "--save-model", "resnet.pt"], tmp_path,
                      nprocs=2)
    losses = rank_steps(out)
    assert sorted(losses) == [(r, s) for r in (0, 1) for s in range(1, 7)], out
    assert all(np.isfinite(v) and 0 < v < 10 for v in losses.values()), out
    assert len(re.findall(r"epoch \d test accuracy \d+\.\d%", out)) == 2, out
    assert (tmp_path / "resnet.pt").stat().st_size > 0


def test_resnet_ddp_matches_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    save_initial_weights(tmp_path / "resnet_ddp.npz", "SmallResNet", monkeypatch)
    args = [*DDP_ARGS, "--no-shuffle", "--init-from", str(tmp_path / "resnet_ddp.npz")]
    what = "resnet_ddp (2-rank DDP, SGD nesterov + OneCycleLR, BatchNorm)"
    ours = run_program("resnet_ddp.py", args, tmp_path, nprocs=2)
    theirs = run_program("resnet_ddp.py", args, tmp_path, nprocs=2, torch_lib=True)
    assert_losses_match(rank_steps(ours), rank_steps(theirs), what, float32_rtol(6), ties=True)
    # float64: the same losses, accuracies and final weights
    args += ["--dtype", "float64", "--save-model", "resnet.pt"]
    ours = run_program("resnet_ddp.py", args, tmp_path, nprocs=2)
    saved = torch.load(tmp_path / "resnet.pt")
    theirs = run_program("resnet_ddp.py", args, tmp_path, nprocs=2, torch_lib=True)
    assert_losses_match(rank_steps(ours), rank_steps(theirs), what + " float64", RTOL64)
    accuracy = re.compile(r"epoch \d test accuracy \d+\.\d%")
    assert len(accuracy.findall(ours)) == 2
    assert accuracy.findall(ours) == accuracy.findall(theirs)
    final = torch.load(tmp_path / "resnet.pt")
    assert all(v.dtype in (torch.float64, torch.int64) for v in final.values())
    assert_weights_match(saved, final)


def test_resnet_ddp_clip_grad_norm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [*DDP_ARGS, "--clip-grad-norm", "0.5", "--max-steps", "2", "--epochs", "1"]
    try:
        import torch  # noqa: F401
    except ImportError:
        ours = run_program("resnet_ddp.py", args, tmp_path, nprocs=2)
        assert rank_steps(ours)
        return
    save_initial_weights(tmp_path / "resnet_ddp.npz", "SmallResNet", monkeypatch)
    args += ["--no-shuffle", "--init-from", str(tmp_path / "resnet_ddp.npz")]
    ours = run_program("resnet_ddp.py", args, tmp_path, nprocs=2)
    theirs = run_program("resnet_ddp.py", args, tmp_path, nprocs=2, torch_lib=True)
    assert_losses_match(rank_steps(ours), rank_steps(theirs), "resnet_ddp --clip-grad-norm",
                        float32_rtol(2), ties=True)


# -------------------------------------------------------------------- collectives_tutorial
def _results(out: str) -> List[Tuple[int, str, str]]:
    return sorted((int(r), name, value) for r, name, value in _RESULT.findall(out))


@pytest.mark.parametrize("nprocs", [2, 3])
def test_collectives_tutorial(tmp_path: Path, nprocs: int) -> None:
    out = run_program("collectives_tutorial.py", [], tmp_path, nprocs=nprocs)
    for rank in range(nprocs):
        assert f"rank {rank} all checks passed" in out, out
    names = {name for _, name, _ in _results(out)}
    assert {"isend/irecv ring", "all_reduce SUM", "all_reduce MAX", "broadcast", "reduce",
            "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all",
            "all_to_all_single", "new_group([0, 1]) all_reduce"} <= names, out


def test_collectives_tutorial_matches_torch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ours = run_program("collectives_tutorial.py", [], tmp_path, nprocs=3)
    theirs = run_program("collectives_tutorial.py", [], tmp_path, nprocs=3, torch_lib=True)
    # same results, printed the same way, on every rank
    assert _results(ours) == _results(theirs)
    assert len(_results(ours)) == 12 + 11 + 12  # rank 1 has no reduce/gather result
