"""Run ``examples/train.py`` with one fault injected; the fault tests launch this on N ranks.

Usage (the arguments after the script are train.py's own)::

    MT_FAULT=raise:1:5 mpiexec -n 2 python tests/fault_scripts/train_fault.py --dataset digits ...

Every rank first prints ``pid <rank> <pid>`` on stdout. ``MT_FAULT`` picks the fault:

- ``raise:R:S`` -- rank R raises ``RuntimeError`` right after its S-th optimizer step, printing
  ``raising <time.time()>`` on stdout just before the raise (the test times the job's exit from it).
- ``slow:S`` -- every optimizer step sleeps S seconds and each rank prints ``step <rank> <n>``
  after its n-th step, so a test can SIGKILL a rank in the middle of training.
- ``pause-save:N`` -- rank 0's N-th write of ``last.mt`` stops half-way: half of the file's bytes
  are written (and fsynced) to the temporary file, ``paused <time.time()>`` is printed, and the
  rank sleeps, so a test can kill the job while a checkpoint is being written.
- ``no-sklearn:R`` -- on rank R only, loading scikit-learn's Digits fails as if scikit-learn
  were missing there (one host of a cluster set up differently).

Nothing else changes: the run is train.py's ``__main__`` (its error handling included).
"""

from __future__ import annotations

import io
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def _rank() -> int:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _patch_step(after: Any) -> None:
    """Call ``after(n)`` after every optimizer step n (1-based) of this rank."""
    from mpitensor.optim import SGD

    original = SGD.step
    count = [0]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        count[0] += 1
        after(count[0])
        return out

    SGD.step = step  # type: ignore[method-assign]


def _inject(fault: str, rank: int) -> None:
    kind, _, arg = fault.partition(":")
    if kind == "raise":
        who, at = (int(v) for v in arg.split(":"))

        def after(n: int) -> None:
            if rank == who and n == at:
                _say(f"raising {time.time():.6f}")
                raise RuntimeError(f"injected fault on rank {rank} at step {n}")

        _patch_step(after)
    elif kind == "slow":
        pause = float(arg)

        def after(n: int) -> None:
            _say(f"step {rank} {n}")
            time.sleep(pause)

        _patch_step(after)
    elif kind == "pause-save":
        import mpitensor.checkpoint as ckpt

        which = int(arg)
        original_save, original_write = ckpt.save, ckpt._write
        state = {"target": "", "last_writes": 0}

        def save(obj: Any, f: Any, **kwargs: Any) -> None:
            state["target"] = os.fspath(f) if isinstance(f, (str, os.PathLike)) else ""
            try:
                original_save(obj, f, **kwargs)
            finally:
                state["target"] = ""

        def write(fh: Any, head: bytes, arrays: Any) -> None:
            if os.path.basename(state["target"]) == "last.mt":
                state["last_writes"] += 1
                if state["last_writes"] == which:
                    whole = io.BytesIO()
                    original_write(whole, head, arrays)
                    data = whole.getvalue()
                    fh.write(data[:len(data) // 2])
                    fh.flush()
                    os.fsync(fh.fileno())
                    _say(f"paused {time.time():.6f}")
                    time.sleep(600)  # the test kills the job here
            original_write(fh, head, arrays)

        ckpt.save = save
        ckpt._write = write
    elif kind == "no-sklearn":
        import mpitensor.data.datasets as datasets

        who = int(arg)
        real = datasets.Digits

        def digits(*args: Any, **kwargs: Any) -> Any:
            if rank == who:
                raise ImportError("No module named 'sklearn' (injected)")
            return real(*args, **kwargs)

        datasets.Digits = digits
    elif kind:
        raise SystemExit(f"train_fault.py: unknown MT_FAULT {fault!r}")


def main() -> None:
    rank = _rank()
    _say(f"pid {rank} {os.getpid()}")
    _inject(os.environ.get("MT_FAULT", ""), rank)
    sys.argv = [str(TRAIN), *sys.argv[1:]]
    sys.path.insert(0, str(TRAIN.parent))
    runpy.run_path(str(TRAIN), run_name="__main__")


if __name__ == "__main__":
    main()
