"""Programs of our own, one per API family of issue 25, run as a user runs them under
mpitensor and, where torch is installed, under torch from the same initial weights: their
printed losses agree to float32 rounding times the steps (float32) and to 1e-9 (float64).

- tests/programs/lstm_lm.py: an LSTM language model (tied embedding, truncated BPTT with
  detached hidden state, gradient clipping, manual SGD);
- tests/programs/gru_classifier.py: a bidirectional GRU over packed, unsorted sequences
  (pad_sequence, pack_padded_sequence, pad_packed_sequence), Adam;
- tests/programs/dcgan.py: a ConvTranspose2d generator against a Conv2d discriminator, with
  BatchNorm2d, Adam and BCE in the usual alternating loop;
- tests/programs/hogwild.py (shared memory) has its own tests in test_shared_memory.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Dict, Sequence

import numpy as np
import pytest

from .launch import run_job
from .test_ported_programs import RTOL64, assert_losses_match, float32_rtol, steps

PROGRAMS = Path(__file__).resolve().parent / "programs"


def _run(name: str, args: Sequence[str], cwd: Path, torch_lib: bool = False) -> str:
    env: Dict[str, str] = {"USE_MPITENSOR": "0" if torch_lib else "1", "OMP_NUM_THREADS": "1"}
    rc, out, err, _ = run_job(["timeout", "-k", "5", "120", sys.executable,
                               str(PROGRAMS / name), *args], timeout=140, cwd=cwd, env=env)
    assert rc == 0, f"{name} under {'torch' if torch_lib else 'mpitensor'}:\n{out}\n{err}"
    return out


def _initial_weights(name: str, build: str, path: Path, monkeypatch: pytest.MonkeyPatch,
                     **kw: object) -> None:
    monkeypatch.setenv("USE_MPITENSOR", "1")
    spec = importlib.util.spec_from_file_location(f"prog_{path.stem}", PROGRAMS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.torch.manual_seed(0)
    model = getattr(module, build)(**kw)
    np.savez(path, **{k: np.asarray(v.detach().numpy()) for k, v in model.state_dict().items()})


@pytest.mark.parametrize("name, build, kw, n_steps", [
    ("lstm_lm.py", "RNNModel", dict(ntoken=50, ninp=32, nhid=32, nlayers=2), 40),
    ("gru_classifier.py", "Classifier", {}, 20),
])
def test_program_trains(name: str, build: str, kw: dict, n_steps: int, tmp_path: Path) -> None:
    out = _run(name, [], tmp_path)
    losses = steps(out)
    assert sorted(losses) == list(range(1, n_steps + 1))
    assert losses[n_steps] < losses[1], out
    if name == "gru_classifier.py":
        acc = float(re.search(r"train accuracy (\d\.\d+)", out).group(1))
        assert acc > 0.8, out
    else:
        assert len(re.findall(r"epoch \d valid loss \d+\.\d+ ppl", out)) == 2


@pytest.mark.parametrize("name, build, kw, n_steps", [
    ("lstm_lm.py", "RNNModel", dict(ntoken=50, ninp=32, nhid=32, nlayers=2), 40),
    ("gru_classifier.py", "Classifier", {}, 20),
    ("dcgan.py", "Pair", {}, 6),
])
def test_program_matches_torch(name: str, build: str, kw: dict, n_steps: int, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    weights = tmp_path / "init.npz"
    _initial_weights(name, build, weights, monkeypatch, **kw)
    for dtype, rtol in (("float32", float32_rtol(n_steps)), ("float64", RTOL64)):
        args = ["--init-from", str(weights), "--dtype", dtype]
        ours, theirs = _run(name, args, tmp_path), _run(name, args, tmp_path, torch_lib=True)
        f32 = dtype == "float32"  # (ties: see test_ported_programs.TIE_RTOL)
        assert_losses_match(steps(ours), steps(theirs), f"{name} {dtype}", rtol, ties=f32)
        d_loss = r"step (\d+) loss_D (\d+\.\d+)"
        ours_d = {int(k): float(v) for k, v in re.findall(d_loss, ours)}
        theirs_d = {int(k): float(v) for k, v in re.findall(d_loss, theirs)}
        assert_losses_match(ours_d, theirs_d, f"{name} {dtype} (discriminator)", rtol,
                            ties=f32)
        if dtype == "float64":  # argmax counts and printed digits: only where no ulp decides
            for pattern in (r"train accuracy .*", r"valid loss .*"):
                assert re.findall(pattern, ours) == re.findall(pattern, theirs)

