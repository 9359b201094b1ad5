"""The README's training command as a user types it, at 1, 2 and 4 ranks, against hand-set threads.

Used by ``train_throughput.py --as-typed`` (and its full run). Each configuration runs
``mpiexec -n N python examples/train.py --data-dir D --epochs E --batch-size B`` in a fresh
temporary directory (checkpoints and the PNG go there, as for a user), with:

* ``as typed``: no thread variable at all (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``MKL_NUM_THREADS``, ``MPITENSOR_NUM_THREADS`` removed): what a new user gets;
* ``T thread(s)``: the three variables set to T, for T = 1 .. the usable cores: the hand-set
  configurations an expert would try.

The figure of one run is the mean of its epochs' ``samples/s`` as train.py prints them (rank 0,
all ranks' samples). Repetitions alternate the configurations so that load which comes and goes
hits all of them; the median repetition is reported. Scaling is samples/s at N ranks divided by
samples/s at one rank, both as typed.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "MPITENSOR_NUM_THREADS")
EPOCH_LINE = re.compile(r"^epoch \d+/\d+: .* ([\d,]+) samples/s$")
AS_TYPED = "as typed"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configurations() -> Dict[str, Optional[int]]:
    """Name -> threads per rank (None: as typed)."""
    out: Dict[str, Optional[int]] = {AS_TYPED: None}
    for t in range(1, usable_cores() + 1):
        out[f"{t} thread{'s' if t > 1 else ''}"] = t
    return out


def _env(threads: Optional[int]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    if threads is not None:
        for var in THREAD_VARS[:3]:
            env[var] = str(threads)
    return env


def command(mpiexec: str, ranks: int, data_dir: Optional[str], epochs: int, batch: int,
            extra: Sequence[str] = ()) -> List[str]:
    """The README's command with the data directory, epochs and batch size set.

    ``extra`` flags are for smoke runs only (``--train-size``): the figures of a real run
    come from the command with nothing else changed.
    """
    cmd = [mpiexec, "-n", str(ranks), sys.executable, str(TRAIN)]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    return cmd + ["--epochs", str(epochs), "--batch-size", str(batch), *extra]


def run_once(cmd: Sequence[str], threads: Optional[int], timeout: float) -> Dict[str, Any]:
    """Run one training job; return its epochs' samples/s and the dataset line."""
    with tempfile.TemporaryDirectory(prefix="mt-as-typed-") as tmp:
        proc = subprocess.run(list(cmd), cwd=tmp, env=_env(threads), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"train_throughput.py: {' '.join(cmd)} exited with code "
                         f"{proc.returncode}:\n{proc.stderr[-3000:]}")
    rates = [float(m.group(1).replace(",", "")) for m in
             (EPOCH_LINE.match(ln.strip()) for ln in proc.stdout.splitlines()) if m]
    if not rates:
        raise SystemExit(f"train_throughput.py: no epoch line in the output of "
                         f"{' '.join(cmd)}:\n{proc.stdout[-2000:]}")
    header = next((ln for ln in proc.stdout.splitlines() if ln.startswith("training ")), "")
    return {"epochs": rates, "mean": statistics.fmean(rates), "header": header}


def measure(mpiexec: str, ranks: Sequence[int], data_dir: Optional[str], epochs: int,
            batch: int, reps: int, timeout: float, extra: Sequence[str] = ()) -> Dict[str, Any]:
    """Every configuration at every rank count, ``reps`` times, alternating."""
    configs = configurations()
    runs: Dict[str, Dict[str, List[float]]] = {str(n): {c: [] for c in configs} for n in ranks}
    header = ""
    for _ in range(reps):
        for n in ranks:
            for name, threads in configs.items():
                got = run_once(command(mpiexec, n, data_dir, epochs, batch, extra), threads,
                               timeout)
                runs[str(n)][name].append(got["mean"])
                header = header or got["header"]
    return {"ranks": list(ranks), "configs": list(configs), "batch": batch, "epochs": epochs,
            "reps": reps, "cores": usable_cores(), "data_dir": data_dir, "header": header,
            "command": "mpiexec -n N python examples/train.py"
                       + (f" --data-dir {data_dir}" if data_dir else "")
                       + f" --epochs {epochs} --batch-size {batch}"
                       + "".join(f" {e}" for e in extra),
            "samples_per_s": runs}


def table(res: Dict[str, Any]) -> str:
    """Markdown: samples/s per configuration, as typed against the best hand-set one, scaling."""
    configs = res["configs"]
    hand = [c for c in configs if c != AS_TYPED]
    med = {n: {c: statistics.median(v) for c, v in row.items()}
           for n, row in res["samples_per_s"].items()}
    one = med.get("1", {})
    head = ("| ranks | " + " | ".join(f"{c} samples/s" for c in configs)
            + " | as typed / best hand-set | scaling as typed (vs 1 rank) | scaling, best |")
    lines = [head, "|" + "---:|" * (len(configs) + 4)]
    for n, row in med.items():
        best = max(hand, key=lambda c: row[c])
        scale = row[AS_TYPED] / one[AS_TYPED] if one else float("nan")
        best_one = max(one[c] for c in hand) if one else float("nan")
        lines.append(f"| {n} | " + " | ".join(f"{row[c]:,.0f}" for c in configs)
                     + f" | {row[AS_TYPED] / row[best]:.2f} ({best}) | {scale:.2f} | "
                     f"{row[best] / best_one:.2f} |")
    return "\n".join(lines)
