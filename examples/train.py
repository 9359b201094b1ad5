"""Train LeNet-5 on MNIST, data-parallel over MPI ranks, resumably, on CPU or GPU.

The PyTorch recipe (``DistributedSampler`` + ``DistributedDataParallel`` + SGD with momentum and
a step learning-rate decay) on mpitensor::

    mpiexec -n 4 python examples/train.py                    # 4 ranks, MNIST or Digits
    python examples/train.py --epochs 1                      # a single process is 1 rank
    mpiexec -n 4 python examples/train.py --resume           # continue from checkpoints/last.mt
    mpiexec -n 2 python examples/train.py --device cuda      # CuPy tensors, one GPU per rank

Each rank trains on its own shard of every epoch (``--batch-size`` samples per rank and step,
so the global batch is ``batch-size x ranks``); gradients are averaged during ``backward()``
by DDP's bucketed all-reduces. Rank 0 shows a progress bar per epoch (on a terminal), then
one line per epoch::

    epoch 1/5: train loss 0.9822, held-out accuracy 92.15% (1843/2000), 6,296 samples/s

and at the end ``final held-out accuracy ...`` and a PNG of the loss and accuracy curves.

Data (``--dataset``): ``mnist`` reads the IDX files in ``--data-dir`` (default
``$MPITENSOR_DATA_DIR`` or ``data/mnist``), downloading them when they are missing (unless
``--no-download``). With the training files there, it trains on the 60,000 training images and
holds out the 10,000 test images; with only the test files (``t10k-*``), it splits those
10,000 into 8,000 for training and 2,000 held out (``--val-size``). ``digits`` uses
scikit-learn's bundled 8x8 digits scaled to 28x28 (fully offline). ``auto`` (default) is
``mnist`` where its files are present or downloadable, else ``digits`` with one warning line.

Checkpoints (``--checkpoint-dir``, default ``checkpoints``): rank 0 writes ``last.mt``
atomically every ``--checkpoint-every`` steps and at the end of every epoch (where it also
keeps ``epochNNN.mt``). A checkpoint holds the model, optimizer and LR-scheduler state, the
epoch, the sampler's position inside the epoch, every rank's RNG states (mpitensor, NumPy,
Python) and the settings that decide the result (world size, batch size, seed, data). With
``--resume`` a run killed at any point continues from the last checkpoint and ends with
exactly the parameters of an uninterrupted run. Resumed on another number of ranks (an elastic
restart that lost or gained hosts, or another ``mpiexec -n``), it deals the rest of the epoch
afresh to the ranks it has (each remaining sample once), keeps the global batch (unless
``--batch-size`` is given) and says that the result is no longer bit-identical. Restarted
by ``mpitensor-run --max-restarts N`` (``TORCHELASTIC_RESTART_COUNT`` above 0), it resumes from
``--checkpoint-dir/last.mt`` by itself when that file exists, so ``mpitensor-run
--max-restarts 2 --nproc-per-node 4 examples/train.py`` survives a rank that dies, and with
``--hostfile FILE --nnodes MIN:MAX`` a host that is lost.

Errors in the command line exit with code 2 and one line on stderr (printed by rank 0 only).
Errors found while running (missing or corrupt data, a corrupt checkpoint or one from another
model or data, no GPU) are agreed on by all ranks: rank 0 prints one line naming the file or
cause and what to do, and every rank exits with code 1; nothing is written then. An
unexpected exception on one rank prints its traceback (each line prefixed ``[rank N]``) and
aborts the whole job (``MPI_Abort``). A save interrupted by a kill leaves the previous
``last.mt`` intact; the next run removes the partial temporary file.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

from mpitensor.distributed.launch import launcher_rank  # importing mpitensor starts no MPI

PROG = "train.py"
CHECKPOINT_FORMAT = "mpitensor-train-checkpoint"
CHECKPOINT_VERSION = 1
LAST = "last.mt"
DEFAULT_DATA_DIR = "data/mnist"
#: the held-out part of a pool that is split (only t10k present, or Digits' own split aside)
DEFAULT_VAL_FRACTION = 0.2
SPLIT_SEED = 0  # the train/held-out split of a pool does not depend on --seed
EVAL_BATCH = 500
GLOBAL_BATCH = 64  # the default --batch-size is this divided by the number of ranks


# ------------------------------------------------------------------------------ command line
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2) printed by rank 0 only."""

    def error(self, message: str) -> NoReturn:
        if launcher_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)

    def _print_message(self, message: str, file: Any = None) -> None:
        if launcher_rank() == 0:  # --help: once, not once per rank
            super()._print_message(message, file)


def _int_at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _float_in(low: float, high: float, low_open: bool = False) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and (value > low if low_open else value >= low)
                and value <= high):
            raise argparse.ArgumentTypeError(
                f"must be in {'(' if low_open else '['}{low}, {high}], got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command line of train.py (see the module docstring)."""
    p = _Parser(prog=PROG, description="Train LeNet-5 on MNIST with DistributedDataParallel "
                "(launch with `mpiexec -n N python examples/train.py`).")
    p.add_argument("--epochs", type=_int_at_least(1), default=5,
                   help="total number of epochs, counting those of a resumed run (default 5)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=None,
                   help="samples per rank and step; the global batch is this x ranks "
                        f"(default {GLOBAL_BATCH} // ranks: a global batch of {GLOBAL_BATCH}, "
                        "which the default --lr suits)")
    p.add_argument("--lr", type=_float_in(0.0, 1e6, low_open=True), default=0.03,
                   help="learning rate of SGD (default 0.03)")
    p.add_argument("--momentum", type=_float_in(0.0, 1.0), default=0.9,
                   help="SGD momentum (default 0.9)")
    p.add_argument("--gamma", type=_float_in(0.0, 1.0, low_open=True), default=0.6,
                   help="the learning rate is multiplied by this after every epoch "
                        "(StepLR, step_size=1; default 0.6; 1 keeps it constant)")
    p.add_argument("--seed", type=_int_at_least(0), default=0,
                   help="seed of initialisation and shuffling (default 0); a run is "
                        "deterministic given the seed and the number of ranks")
    p.add_argument("--data-dir", default=None,
                   help=f"directory of the MNIST IDX files (default $MPITENSOR_DATA_DIR or "
                        f"{DEFAULT_DATA_DIR})")
    p.add_argument("--dataset", choices=("auto", "mnist", "digits"), default="auto",
                   help="auto: MNIST where present or downloadable, else Digits (default)")
    p.add_argument("--no-download", action="store_true",
                   help="never download MNIST; use only files already in --data-dir")
    p.add_argument("--train-size", type=_int_at_least(1), default=None,
                   help="use only this many training samples (a fixed random subset)")
    p.add_argument("--val-size", type=_int_at_least(1), default=None,
                   help="held-out samples: the size of the part split off when the data has "
                        "no separate test set (default 20%%: 2,000 of MNIST's t10k), else a "
                        "cap on the test set")
    p.add_argument("--checkpoint-dir", default="checkpoints",
                   help="where rank 0 writes last.mt, epochNNN.mt and curves.png "
                        "(default checkpoints)")
    p.add_argument("--checkpoint-every", type=_int_at_least(0), default=200, metavar="STEPS",
                   help="also write last.mt every STEPS optimizer steps inside an epoch "
                        "(default 200; 0: only at the end of epochs)")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="PATH",
                   help="continue from a checkpoint (default: --checkpoint-dir/last.mt)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (NumPy) or cuda (CuPy, one GPU per rank; default cpu)")
    p.add_argument("--max-steps", type=_int_at_least(1), default=None,
                   help="stop after this many optimizer steps in total (for quick runs)")
    p.add_argument("--bucket-cap-mb", type=_float_in(0.0, 1e6), default=25.0,
                   help="DDP bucket size in MiB (default 25; 0: one bucket per parameter)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="where to write the PNG of the curves (default "
                        "--checkpoint-dir/curves.png)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    return p


# ------------------------------------------------------------------------------ errors
class UserError(Exception):
    """A problem every rank detects alike; rank 0 reports it in one line, exit code 1.

    ``everywhere`` is False for one that this rank found alone, where the ranks could not
    compare yet (torchrun's processes before ``init_process_group``): that rank reports it.
    """

    def __init__(self, message: str, everywhere: bool = True) -> None:
        super().__init__(message)
        self.everywhere = everywhere


def _agreed(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on every rank; a UserError on any rank is raised on every rank.

    Each rank reads its data itself (and on a cluster without a shared filesystem, its own
    copy) and checks its own GPU, so one rank may fail where others succeed; without agreeing,
    those others would go on and wait for it in their first collective.
    """
    result, err = None, None
    try:
        result = fn(*args)
    except UserError as exc:
        err = str(exc)
    errors = _errors_of_all_ranks(err)
    bad = [r for r, e in enumerate(errors) if e is not None]
    if bad:
        first = errors[bad[0]]
        if len(bad) < len(errors):
            first = f"{first} (on rank(s) {bad} only; the other ranks succeeded)"
        raise UserError(first, everywhere=len(errors) == _world_now())
    return result


def _mpi_launched() -> bool:
    """Whether an MPI launcher (mpiexec, mpitensor-run, srun) started this process, so that
    MPI's world is the job already before ``init_process_group``."""
    if any(os.environ.get(v, "").strip().isdigit() for v in
           ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")):
        return True
    # a batch script's SLURM_PROCID is inherited by what it starts; torchrun's workers say so
    return (os.environ.get("SLURM_PROCID", "").strip().isdigit()
            and "TORCHELASTIC_RUN_ID" not in os.environ)


def _errors_of_all_ranks(err: Optional[str]) -> List[Optional[str]]:
    """Every rank's error (None where it had none), by rank, as far as ranks can meet yet."""
    import mpitensor.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() == 1:
            return [err]
        errors: List[Optional[str]] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, err)
        return errors
    if not _mpi_launched():
        # torchrun or a plain `python`: these processes become one MPI job only inside
        # init_process_group, and importing mpi4py.MPI before it would make each of them an
        # MPI job of its own; each checks alone (torchrun's agent ends the others if one fails)
        return [err]
    from mpi4py import MPI  # an MPI launcher's world: the job, also before the process group

    if MPI.COMM_WORLD.Get_size() == 1:
        return [err]
    return MPI.COMM_WORLD.allgather(err)


def _first_failure(text: str) -> str:
    """One line from a download error: what failed, where, and the first attempt's error.

    The error lists every attempt on lines of their own (``    URL: error``) under a head
    line that ends in a colon; the head alone would say nothing of why.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    head = lines[0].rstrip(":")
    attempts = [line for line in text.splitlines() if line.startswith("    ")]
    if not attempts:
        return head
    more = f"; {len(attempts) - 1} more attempt(s) failed" if len(attempts) > 1 else ""
    return f"{head}: {attempts[0].strip()}{more}"


#: the temporary files of interrupted checkpoint saves (``mpitensor.save``'s naming)
_PARTIAL = re.compile(r"^\.(last|epoch\d{3,})\.mt\.[A-Za-z0-9_]+\.tmp$")


def remove_partial_checkpoints(ckpt_dir: Path) -> List[Path]:
    """Delete what a killed save of ``last.mt`` or ``epochNNN.mt`` left in ``ckpt_dir``.

    ``mpitensor.save`` writes ``.<name>.<random>.tmp`` and renames it over ``<name>`` only
    when complete, so a kill mid-save leaves the old checkpoint intact and this partial file
    behind; it is never read, only wasted space (as large as a checkpoint).

    Returns:
        The files removed.
    """
    removed = []
    if ckpt_dir.is_dir():
        for entry in sorted(ckpt_dir.iterdir()):
            if _PARTIAL.match(entry.name) and entry.is_file():
                try:
                    entry.unlink()
                    removed.append(entry)
                except OSError:
                    pass  # another process's, or already gone: harmless either way
    return removed


# ------------------------------------------------------------------------------ data
def _split_pool(n: int, val_size: Optional[int], where: str) -> Tuple[Any, Any]:
    """Indices (train, held-out) of a pool of ``n`` samples, by a fixed permutation."""
    import numpy as np

    n_val = val_size if val_size is not None else int(round(DEFAULT_VAL_FRACTION * n))
    if not 0 < n_val < n:
        raise UserError(f"--val-size {n_val} leaves no training samples in {where} "
                        f"({n} samples); choose a value below {n}")
    perm = np.random.default_rng(SPLIT_SEED).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def _cap(indices: Any, size: Optional[int]) -> Any:
    """The first ``size`` of a fixed permutation of ``indices`` (all of them when None)."""
    import numpy as np

    if size is None or size >= len(indices):
        return indices
    perm = np.random.default_rng(SPLIT_SEED + 1).permutation(len(indices))
    return np.sort(indices[perm[:size]])


def _mnist_files(root: Path) -> Dict[str, bool]:
    """Which MNIST splits have both their files in ``root`` (gzip or raw, torchvision layout)."""
    def present(base: str) -> bool:
        return any((folder / name).is_file() for folder in (root, root / "MNIST" / "raw")
                   for name in (base + ".gz", base))

    return {split: present(f"{split}-images-idx3-ubyte") and present(f"{split}-labels-idx1-ubyte")
            for split in ("train", "t10k")}


def load_blas_users_first(args: argparse.Namespace) -> None:
    """Import scikit-learn (for Digits) now, where this run may train on Digits.

    Call it before ``init_process_group`` (or ``init_rpc``): that call limits the BLAS pools
    loaded by then to this rank's share of the cores, and scikit-learn brings SciPy's own
    OpenBLAS, which a later import would leave at a thread per core. mpitensor's layers split
    their work by the largest pool, so that rank ran two-way splits beside the others' one-way
    ones: the cores oversubscribed, and sums taken in another order (the pipeline example's
    "bit for bit" check was off by 7e-8 on Digits; docs/rpc.md).
    """
    root = Path(args.data_dir or os.environ.get("MPITENSOR_DATA_DIR") or DEFAULT_DATA_DIR)
    if args.dataset == "mnist" or (args.dataset == "auto" and any(_mnist_files(root).values())):
        return
    try:
        import sklearn.datasets  # noqa: F401 - loaded for its BLAS, before the thread budget
    except ImportError:
        pass  # load_data says what is missing, on every rank alike


def load_data(args: argparse.Namespace, rank: int) -> Dict[str, Any]:
    """Build the training and held-out TensorDatasets; every rank reads the same data.

    Returns:
        dict with ``train``, ``val`` (TensorDatasets), ``name`` and ``description``.

    Raises:
        UserError: MNIST asked for but neither present nor downloadable, bad sizes.
    """
    import mpitensor as mt
    from mpitensor.data import DatasetError, TensorDataset
    from mpitensor.data.datasets import MNIST, Digits

    root = Path(args.data_dir or os.environ.get("MPITENSOR_DATA_DIR") or DEFAULT_DATA_DIR)
    name, desc = "", ""
    train_x = train_y = val_x = val_y = None
    if args.dataset in ("auto", "mnist"):
        have = _mnist_files(root)
        reason = ""
        if not (have["train"] or have["t10k"]):
            if args.no_download:
                reason = f"no MNIST files in {root} (and --no-download)"
            else:
                try:
                    MNIST(root, train=False, download=True, timeout=30.0)  # rank 0 fetches
                    have = _mnist_files(root)
                except DatasetError as exc:
                    reason = _first_failure(str(exc))
        if have["train"] or have["t10k"]:
            try:
                test = MNIST(root, train=False) if have["t10k"] else None
                train = MNIST(root, train=True) if have["train"] else None
            except DatasetError as exc:
                raise UserError(f"MNIST in {root} is unusable: {exc}") from None
            name = "MNIST"
            if train is not None:
                tx, ty = train.arrays()
                tri = _cap(_arange(len(ty)), args.train_size)
                train_x, train_y = tx[tri], ty[tri]
                desc = f"MNIST train ({len(tri):,})"
                if test is not None:
                    vx, vy = test.arrays()
                    vai = _cap(_arange(len(vy)), args.val_size)
                    val_x, val_y = vx[vai], vy[vai]
                    desc += f", held out: MNIST t10k ({len(vai):,})"
                else:  # only the training files: split them
                    tri, vai = _split_pool(len(ty), args.val_size, f"MNIST train in {root}")
                    tri = _cap(tri, args.train_size)
                    train_x, train_y, val_x, val_y = tx[tri], ty[tri], tx[vai], ty[vai]
                    desc = (f"MNIST train split {len(tri):,} train / {len(vai):,} held out")
            else:
                tx, ty = test.arrays()
                tri, vai = _split_pool(len(ty), args.val_size, f"MNIST t10k in {root}")
                tri = _cap(tri, args.train_size)
                train_x, train_y, val_x, val_y = tx[tri], ty[tri], tx[vai], ty[vai]
                desc = f"MNIST t10k split {len(tri):,} train / {len(vai):,} held out"
        elif args.dataset == "mnist":
            raise UserError(f"--dataset mnist: {reason}; place the four MNIST files (or the two "
                            f"t10k-* files) in {root.resolve()}, or use --dataset digits")
        elif rank == 0:
            sys.stderr.write(f"{PROG}: warning: MNIST unavailable ({reason}); training on "
                             "scikit-learn's Digits instead (--dataset digits to silence this, "
                             "--dataset mnist to make it an error)\n")
            sys.stderr.flush()
    if not name:
        try:
            train_ds, test_ds = Digits(train=True), Digits(train=False)
        except ImportError as exc:
            raise UserError(f"--dataset digits needs scikit-learn ({exc})") from None
        name = "Digits"
        tx, ty = train_ds.arrays()
        vx, vy = test_ds.arrays()
        tri = _cap(_arange(len(ty)), args.train_size)
        vai = _cap(_arange(len(vy)), args.val_size)
        train_x, train_y, val_x, val_y = tx[tri], ty[tri], vx[vai], vy[vai]
        desc = f"Digits (scikit-learn) {len(tri):,} train / {len(vai):,} held out"
    return {
        "name": name,
        "description": desc,
        "train": TensorDataset(mt.from_numpy(train_x), mt.from_numpy(train_y)),
        "val": TensorDataset(mt.from_numpy(val_x), mt.from_numpy(val_y)),
    }


def _arange(n: int) -> Any:
    import numpy as np

    return np.arange(n)


# ------------------------------------------------------------------------------ checkpoints
def _rng_states() -> Dict[str, Any]:
    import numpy as np

    import mpitensor as mt

    return {"mpitensor": mt.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate()}


def _set_rng_states(state: Dict[str, Any]) -> None:
    import numpy as np

    import mpitensor as mt

    mt.set_rng_state(state["mpitensor"])
    np.random.set_state(tuple(state["numpy"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _config(args: argparse.Namespace, data: Dict[str, Any], world: int) -> Dict[str, Any]:
    """The settings a resumed run must share with the run that wrote the checkpoint."""
    return {"world_size": world, "batch_size": args.batch_size, "seed": args.seed,
            "dataset": data["name"], "train_samples": len(data["train"]),
            "val_samples": len(data["val"])}


def _flags(key: str) -> str:
    return {"world_size": "ranks (mpiexec -n)", "batch_size": "--batch-size", "seed": "--seed",
            "dataset": "dataset", "train_samples": "training samples",
            "val_samples": "held-out samples"}[key]


def _few(items: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _other_checkpoints(path: Path) -> str:
    """A hint naming the newest other checkpoint next to ``path`` (epochNNN.mt), if any."""
    others = sorted(p.name for p in path.parent.glob("epoch*.mt") if p != path) \
        if path.parent.is_dir() else []
    if not others:
        return ""
    return f" (the newest other checkpoint there is {path.parent / others[-1]})"


def validate_checkpoint(ckpt: Any, path: Path, model: Any, config: Dict[str, Any]) -> None:
    """Raise UserError naming ``path`` when ``ckpt`` cannot continue this run.

    The model, seed and data must be the run's own. The number of ranks may differ (an elastic
    restart on fewer or more hosts): then the batch size is not compared either, and the rest
    of the epoch is resharded."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{path} is not a train.py checkpoint; pass a file written by "
                        f"train.py (--resume PATH) or start without --resume")
    if ckpt.get("version") != CHECKPOINT_VERSION:
        raise UserError(f"{path} has checkpoint version {ckpt.get('version')!r}, this "
                        f"train.py reads version {CHECKPOINT_VERSION}")
    saved = ckpt.get("model_state", {})
    mine = model.state_dict()
    name = type(model).__name__
    diffs = []
    if ckpt.get("model_name") != name:
        diffs.append(f"it is a {ckpt.get('model_name')!r}")
    missing, unexpected = sorted(set(mine) - set(saved)), sorted(set(saved) - set(mine))
    if missing:
        diffs.append(f"it lacks {_few(missing)}")
    if unexpected:
        diffs.append(f"it has {_few(unexpected)}, which this model does not")
    shapes = [f"{k} {tuple(saved[k].shape)} instead of {tuple(v.shape)}"
              for k, v in mine.items() if k in saved and tuple(saved[k].shape) != tuple(v.shape)]
    if shapes:
        diffs.append(f"shapes differ: {_few(shapes)}")
    if diffs:
        raise UserError(
            f"{path} holds a different model than this run's {name} ({'; '.join(diffs)}); "
            f"resume from a checkpoint of the same model or start without --resume")
    old = ckpt.get("config", {})
    saved_world, saved_batch = old.get("world_size"), old.get("batch_size")
    if not (type(saved_world) is int and saved_world >= 1 and type(saved_batch) is int
            and saved_batch >= 1 and len(ckpt.get("ranks") or ()) == saved_world):
        raise UserError(f"{path} does not record the number of ranks and the batch size that "
                        f"wrote it consistently; pass a checkpoint written by train.py or start "
                        f"without --resume")
    # at another number of ranks the rest of the epoch is resharded (see Training.resume)
    resharded = saved_world != config["world_size"]
    for key, value in config.items():
        if resharded and key in ("world_size", "batch_size"):
            continue
        if old.get(key) != value:
            raise UserError(
                f"{path} was written with {_flags(key)} = {old.get(key)!r}, this run has "
                f"{value!r}; resume with the same setting (an exact resume needs it) or "
                f"start afresh with another --checkpoint-dir")


# ------------------------------------------------------------------------------ training
def _progress(total: int, initial: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", leave=False,
                file=sys.stderr, dynamic_ncols=True)


def _select_device(args: argparse.Namespace) -> Tuple[str, str]:
    """(device string, process-group backend) for ``--device``; checks CuPy and the GPU."""
    if args.device == "cpu":
        return "cpu", "mpi"
    from mpitensor import backend
    from mpitensor.distributed import is_nccl_available

    reason = backend.cupy_unavailable_reason()
    if reason:
        raise UserError(f"--device cuda needs CuPy and a CUDA GPU: {reason}; or use "
                        "--device cpu")
    cp = backend.get_cupy()
    if _mpi_launched():
        from mpi4py import MPI

        node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
        local, per_node = node.Get_rank(), node.Get_size()
        node.Free()
    else:  # torchrun's variables (before init_process_group, MPI must not start here)
        local = int(os.environ.get("LOCAL_RANK", "0") or 0)
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    gpus = cp.cuda.runtime.getDeviceCount()
    index = local % gpus
    cp.cuda.Device(index).use()
    # NCCL refuses two ranks on one GPU; MPI (CUDA-aware or host-staged) does not
    return f"cuda:{index}", "nccl" if is_nccl_available() and per_node <= gpus else "mpi"


def evaluate(model: Any, loader: Any, device: str) -> Tuple[int, int]:
    """(correct, total) over the whole held-out set: each rank its own shard, then all_reduce."""
    import numpy as np

    import mpitensor as mt
    import mpitensor.distributed as dist

    model.eval()
    counts = np.zeros(2, dtype=np.int64)
    with mt.no_grad():
        for x, y in loader:
            if device != "cpu":
                x, y = x.to(device), y.to(device)
            pred = model(x).argmax(dim=1)
            counts[0] += int((pred == y).sum().item())
            counts[1] += int(y.shape[0])
    model.train()
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return int(counts[0]), int(counts[1])


def plot_curves(history: Dict[str, Any], path: Path, title: str) -> None:
    """Write the training loss (per step and per epoch) and held-out accuracy to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    import numpy as np

    steps = np.asarray(history["step_loss"], dtype=np.float64)
    if len(steps):
        spe = history["steps_per_epoch"]
        xs = np.arange(1, len(steps) + 1) / spe
        ax1.plot(xs, steps, color="tab:blue", alpha=0.15, lw=0.6, label="rank 0 batch loss")
        window = max(1, min(len(steps), spe // 10))
        smooth = np.convolve(steps, np.ones(window) / window, mode="valid")
        ax1.plot(xs[window - 1:], smooth, color="tab:blue", lw=1.2,
                 label=f"rank 0, mean of {window} steps")
    ep = list(range(1, len(history["train_loss"]) + 1))
    ax1.plot(ep, history["train_loss"], "o-", color="tab:orange",
             label="epoch mean (all ranks)")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss (NLL)")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(ep, [100 * a for a in history["accuracy"]], "o-", color="tab:green")
    ax2.set_xlabel("epoch")
    ax2.set_xticks(ep)
    ax2.set_ylabel("held-out accuracy (%)")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


class Training:
    """One training run: the process group, data, model, optimizer and their progress.

    :func:`train` reads as the run's steps; each method here is one of them. Every rank runs
    every step (checkpoints and the report are written by rank 0).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        """Join the process group, load the data, build the model, optimizer and loaders."""
        import numpy as np

        import mpitensor as mt
        import mpitensor.distributed as dist
        from mpitensor.data import DataLoader, DistributedEvalSampler, DistributedSampler
        from mpitensor.models import LeNet
        from mpitensor.optim import SGD
        from mpitensor.optim.lr_scheduler import StepLR

        self.args = args
        self.device, backend = _agreed(_select_device, args)
        load_blas_users_first(args)
        dist.init_process_group(backend=backend)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.batch_given = args.batch_size is not None
        if args.batch_size is None:
            args.batch_size = max(1, GLOBAL_BATCH // self.world)
        self.data = _agreed(load_data, args, self.rank)
        train_ds, val_ds = self.data["train"], self.data["val"]
        self.config = _config(args, self.data, self.world)
        mt.manual_seed(args.seed)
        np.random.seed(args.seed)
        random.seed(args.seed)
        self.model = LeNet()
        if self.device != "cpu":
            self.model.to(self.device)
        self.optimizer = SGD(self.model.parameters(), lr=args.lr, momentum=args.momentum)
        self.scheduler = StepLR(self.optimizer, step_size=1, gamma=args.gamma)
        self.sampler = DistributedSampler(train_ds, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=args.seed)
        self.loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=self.sampler)
        self.val_loader = DataLoader(val_ds, batch_size=EVAL_BATCH,
                                     sampler=DistributedEvalSampler(val_ds,
                                                                    num_replicas=self.world,
                                                                    rank=self.rank))
        self.steps_per_epoch = len(self.loader)
        self.ckpt_dir = Path(args.checkpoint_dir)
        self.history: Dict[str, Any] = {"train_loss": [], "accuracy": [], "samples_per_s": [],
                                        "step_loss": [], "steps_per_epoch": self.steps_per_epoch}
        self.start_epoch, self.global_step = 0, 0
        self.loss_sum, self.loss_count = 0.0, 0  # this rank's, over the current epoch
        self.resumed = ""
        self.ddp: Any = None
        self.last_eval: Optional[Tuple[int, int, int]] = None  # (global step, correct, total)

    # ---------------------------------------------------------------- resume
    def resume(self) -> None:
        """Restore everything from ``--resume``'s checkpoint (refused with a UserError)."""
        from mpitensor.checkpoint import CheckpointError, load_on_all_ranks

        args = self.args
        path = Path(args.resume) if args.resume else self.ckpt_dir / LAST
        try:
            ckpt = load_on_all_ranks(path, map_location=self.device, read_on_rank0=True)
        except CheckpointError as exc:
            missing = "FileNotFoundError" in str(exc) or "No such file" in str(exc)
            detail = str(exc).splitlines()[0]
            detail = detail.replace(f"cannot load checkpoint {path} ", "", 1)
            raise UserError(
                f"cannot resume from {path}: "
                + ("no such file; run without --resume to start, or pass --resume PATH"
                   if missing else
                   f"{detail}; pass an intact checkpoint with --resume PATH"
                   f"{_other_checkpoints(path)} or start without --resume")) from None
        validate_checkpoint(ckpt, path, self.model, self.config)
        saved = ckpt["config"]
        saved_world, saved_batch = saved["world_size"], saved["batch_size"]
        # the steps of an epoch of the saving run (the sampler's padded shard, in batches)
        saved_steps = math.ceil(math.ceil(len(self.data["train"]) / saved_world) / saved_batch)
        if saved_world != self.world:
            self._rebatch(saved_world * saved_batch)
        self._restore(ckpt)
        where = (f"epoch {self.start_epoch + 1}, step {int(ckpt['step_in_epoch'])} of "
                 f"{saved_steps}"
                 if ckpt["step_in_epoch"] else f"the end of epoch {self.start_epoch}")
        self.resumed = f"resumed from {path} at {where} (global step {self.global_step})"
        if saved_world != self.world:
            left = self.sampler.remaining() if ckpt["step_in_epoch"] else 0
            self.resumed += (
                f"; it was written by {saved_world} rank(s), this run has {self.world}: "
                + (f"the {self._left_in_epoch(left):,} samples left in the epoch are dealt "
                   "afresh to these ranks, " if left else "")
                + f"global batch {self.world * args.batch_size} ({args.batch_size} per rank"
                + (", --batch-size" if self.batch_given else "") + "); the result is not "
                "bit-identical to a run without the change")
        old_args = ckpt.get("args", {})
        kept = [f"--{k} {old_args[k]}" for k in ("lr", "momentum", "gamma")
                if k in old_args and old_args[k] != getattr(args, k)]
        if kept:  # the optimizer's and scheduler's states carry them, as in torch
            self.resumed += f"; the checkpoint's {', '.join(kept)} apply"

    def _rebatch(self, saved_global_batch: int) -> None:
        """At another number of ranks: keep the global batch (unless --batch-size was given)."""
        from mpitensor.data import DataLoader

        args = self.args
        if not self.batch_given:
            args.batch_size = max(1, saved_global_batch // self.world)
            self.config["batch_size"] = args.batch_size
            self.loader = DataLoader(self.data["train"], batch_size=args.batch_size,
                                     sampler=self.sampler)
            self.steps_per_epoch = self.history["steps_per_epoch"] = len(self.loader)

    def _left_in_epoch(self, mine: int) -> int:
        """The samples left in the epoch over all ranks, from this rank's count."""
        import numpy as np

        import mpitensor.distributed as dist

        total = np.array([mine], dtype=np.int64)
        if self.world > 1:
            dist.all_reduce(total)
        return int(total[0])

    def _restore(self, ckpt: Dict[str, Any]) -> None:
        self.model.load_state_dict(ckpt["model_state"])
        self.optimizer.load_state_dict(ckpt["optimizer_state"])
        self.scheduler.load_state_dict(ckpt["scheduler_state"])
        self.sampler.load_state_dict(ckpt["sampler_state"])
        self.start_epoch, self.global_step = int(ckpt["epoch"]), int(ckpt["global_step"])
        ranks = ckpt["ranks"]
        if len(ranks) == self.world:
            mine = ranks[self.rank]
            _set_rng_states(mine["rng"])
            self.loss_sum, self.loss_count = float(mine["loss_sum"]), int(mine["loss_count"])
        else:
            # resharded: a rank that existed keeps its random streams (the others keep the
            # seeded ones), and rank 0 carries the epoch's loss so far, so the epoch's mean
            # train loss still counts every step
            if self.rank < len(ranks):
                _set_rng_states(ranks[self.rank]["rng"])
            if self.rank == 0:
                self.loss_sum = float(sum(float(r["loss_sum"]) for r in ranks))
                self.loss_count = int(sum(int(r["loss_count"]) for r in ranks))
        saved = ckpt["history"]
        self.history.update({k: [float(v) for v in saved[k]]
                             for k in ("train_loss", "accuracy", "samples_per_s", "step_loss")})

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        """Wrap the model in DDP, print the header, clear what an interrupted save left."""
        from mpitensor.nn.parallel import DistributedDataParallel as DDP

        args = self.args
        self.ddp = DDP(self.model, bucket_cap_mb=args.bucket_cap_mb)
        if self.rank != 0:
            return
        print(f"training LeNet on {self.data['description']}: {self.world} rank(s) x batch "
              f"{args.batch_size} = global batch {self.world * args.batch_size}, "
              f"{args.epochs} epoch(s), {self.steps_per_epoch} steps each, lr {args.lr} "
              f"(x{args.gamma}/epoch), momentum {args.momentum}, seed {args.seed}, "
              f"{self.device}", flush=True)
        if self.resumed:
            print(self.resumed, flush=True)
        # after --resume was checked: a refused run changes nothing on disk
        partial = remove_partial_checkpoints(self.ckpt_dir)
        if partial:
            print(f"removed {len(partial)} partial checkpoint file(s) left in {self.ckpt_dir} "
                  f"by an interrupted save: {', '.join(p.name for p in partial)}", flush=True)

    # ---------------------------------------------------------------- checkpoints
    def save(self, epoch: int, step_in_epoch: int, end_of_epoch: bool) -> None:
        """Every rank calls it: gather per-rank state, rank 0 writes (atomically)."""
        import mpitensor.distributed as dist
        from mpitensor.checkpoint import save_on_rank0

        mine = {"rng": _rng_states(), "loss_sum": self.loss_sum, "loss_count": self.loss_count}
        ranks: Optional[List[Any]] = [None] * self.world if self.rank == 0 else None
        dist.gather_object(mine, ranks, dst=0)
        ckpt = self._checkpoint(epoch, step_in_epoch, ranks) if self.rank == 0 else None
        if self.rank == 0:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        if end_of_epoch:
            save_on_rank0(ckpt, self.ckpt_dir / f"epoch{epoch:03d}.mt")
        save_on_rank0(ckpt, self.ckpt_dir / LAST)

    def _checkpoint(self, epoch: int, step_in_epoch: int, ranks: Any) -> Dict[str, Any]:
        import numpy as np

        h = self.history
        return {
            "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
            "model_name": type(self.model).__name__,
            "model_state": self.model.state_dict(),
            "optimizer_state": self.optimizer.state_dict(),
            "scheduler_state": self.scheduler.state_dict(),
            "sampler_state": self.sampler.state_dict(),
            "epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": self.global_step,
            "config": self.config, "ranks": ranks,
            "history": {"train_loss": list(h["train_loss"]), "accuracy": list(h["accuracy"]),
                        "samples_per_s": list(h["samples_per_s"]),
                        "step_loss": np.asarray(h["step_loss"], dtype=np.float64)},
            "args": dict(vars(self.args)),
        }

    # ---------------------------------------------------------------- training
    def at_max_steps(self) -> bool:
        return self.args.max_steps is not None and self.global_step >= self.args.max_steps

    def fit(self) -> None:
        """Train the remaining epochs, or up to ``--max-steps`` (which saves where it stops)."""
        # a resumed run may already be at --max-steps: then it only evaluates
        if self.at_max_steps():
            return
        for epoch in range(self.start_epoch, self.args.epochs):
            step, samples, elapsed = self.train_epoch(epoch)
            if step < self.steps_per_epoch:  # stopped by --max-steps inside the epoch
                self.save(epoch, step, end_of_epoch=False)
                return
            self.end_epoch(epoch, samples, elapsed)
            if self.at_max_steps():
                return

    def train_epoch(self, epoch: int) -> Tuple[int, int, float]:
        """One epoch from the sampler's position; returns (steps done, samples, seconds)."""
        import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling

        args = self.args
        self.sampler.set_epoch(epoch)  # keeps a resumed position only for its own epoch
        # the steps already done in this epoch: all of them but those the sampler has left
        # (a resumed epoch, possibly resharded from another number of ranks)
        step = max(0, self.steps_per_epoch - math.ceil(self.sampler.remaining() / args.batch_size))
        if step == 0:
            self.loss_sum, self.loss_count = 0.0, 0
        show = self.rank == 0 and not args.no_progress and sys.stderr.isatty()
        bar = _progress(self.steps_per_epoch, step, f"epoch {epoch + 1}/{args.epochs}", show)
        self.ddp.train()
        samples, t0 = 0, time.perf_counter()
        for x, y in self.loader:
            if self.device != "cpu":
                x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            loss = F.nll_loss(self.ddp(x), y)
            loss.backward()
            self.optimizer.step()
            value, n = float(loss.item()), int(y.shape[0])
            self.loss_sum += value * n
            self.loss_count += n
            samples += n * self.world
            step += 1
            self.global_step += 1
            if self.rank == 0:
                self.history["step_loss"].append(value)
            if bar is not None:
                bar.update(1)
                if step % 10 == 0:
                    bar.set_postfix(loss=f"{value:.4f}")
            if self.at_max_steps() and step < self.steps_per_epoch:
                break
            if args.checkpoint_every and step % args.checkpoint_every == 0 \
                    and step < self.steps_per_epoch:
                elapsed = time.perf_counter() - t0
                self.save(epoch, step, end_of_epoch=False)
                t0 = time.perf_counter() - elapsed  # writing checkpoints is not training time
        elapsed = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        return step, samples, elapsed

    def end_epoch(self, epoch: int, samples: int, elapsed: float) -> None:
        """Average the loss over all ranks, evaluate, step the schedule, report, save."""
        import numpy as np

        import mpitensor.distributed as dist

        totals = np.array([self.loss_sum, self.loss_count], dtype=np.float64)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        train_loss = totals[0] / max(totals[1], 1.0)
        correct, total = evaluate(self.model, self.val_loader, self.device)
        self.last_eval = (self.global_step, correct, total)
        accuracy = correct / max(total, 1)
        rate = samples / elapsed if elapsed > 0 else 0.0
        self.history["train_loss"].append(float(train_loss))
        self.history["accuracy"].append(accuracy)
        self.history["samples_per_s"].append(rate)
        self.scheduler.step()
        if self.rank == 0:
            print(f"epoch {epoch + 1}/{self.args.epochs}: train loss {train_loss:.4f}, "
                  f"held-out accuracy {100 * accuracy:.2f}% ({correct}/{total}), "
                  f"{rate:,.0f} samples/s", flush=True)
        self.loss_sum, self.loss_count = 0.0, 0
        self.save(epoch + 1, 0, end_of_epoch=True)

    # ---------------------------------------------------------------- the end
    def report(self) -> None:
        """The final accuracy (evaluated again if the model changed since) and the curves."""
        if self.last_eval is None or self.last_eval[0] != self.global_step:
            self.last_eval = (self.global_step,
                              *evaluate(self.model, self.val_loader, self.device))
        _, correct, total = self.last_eval
        if self.rank != 0:
            return
        h = self.history
        line = (f"final held-out accuracy {100 * correct / max(total, 1):.2f}% "
                f"({correct}/{total}) after {len(h['train_loss'])} epoch(s), "
                f"{self.global_step} steps on {self.world} rank(s), {self.data['name']}")
        if not self.args.no_plot and h["train_loss"]:
            plot = Path(self.args.plot) if self.args.plot else self.ckpt_dir / "curves.png"
            plot_curves(h, plot, f"LeNet on {self.data['description']}, {self.world} rank(s)")
            line += f"; curves: {plot}"
        print(line, flush=True)


def _elastic_restart(run: "Training") -> bool:
    """True when this is a restart (``mpitensor-run --max-restarts N`` or torchrun set
    ``TORCHELASTIC_RESTART_COUNT`` above 0) and rank 0 finds ``--checkpoint-dir/last.mt``: the
    run then resumes from it, as if ``--resume`` had been given. Decided by rank 0, for all."""
    import mpitensor.distributed as dist

    try:
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        restarts = 0
    if restarts <= 0:
        return False
    found = [run.rank == 0 and (run.ckpt_dir / LAST).is_file()]
    if run.world > 1:
        dist.broadcast_object_list(found, src=0)
    return bool(found[0])


def train(args: argparse.Namespace) -> None:
    """Set up, resume if asked, train, report: the run's steps, in order."""
    import mpitensor.distributed as dist

    run = Training(args)
    if args.resume is None and _elastic_restart(run):
        args.resume = ""  # --checkpoint-dir/last.mt
    if args.resume is not None:
        run.resume()
    run.start()
    run.fit()
    run.report()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------ entry point
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the command line, train; return the exit code."""
    args = build_parser().parse_args(argv)
    # one write per line, so lines of different ranks never mix
    sys.stdout.reconfigure(line_buffering=True)
    try:
        train(args)
    except UserError as exc:  # raised alike on every rank (agreed): a clean exit everywhere
        # one line for the job, as argparse's errors: rank 0 says what every rank found
        if exc.everywhere:
            if _rank_now() == 0:
                sys.stderr.write(f"{PROG}: error: {exc}\n")
        else:  # found by this rank alone
            sys.stderr.write(f"{_rank_prefix()}{PROG}: error: {exc}\n")
        sys.stderr.flush()
        return 1
    except BaseException as exc:  # one rank's failure must not leave the others waiting
        _report_unhandled(exc)
        if _world_now() > 1:
            import mpitensor.distributed as dist

            # ends every rank once the launcher has the traceback (returns if MPI is not up)
            dist.abort_job(1)
        return 1
    return 0


def _rank_now() -> int:
    """This process's rank: the process group's, MPI's, the launcher's or torchrun's (0)."""
    group = _group_now()
    if group is not None:
        return group[0]
    value = launcher_rank(None)
    if value is not None:
        return value
    value_text = os.environ.get("RANK", "").strip()  # torchrun, before init_process_group
    return int(value_text) if value_text.isdigit() else 0


def _world_now() -> int:
    """The number of ranks of this job (1 without a launcher)."""
    group = _group_now()
    if group is not None:
        return group[1]
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS",
                "WORLD_SIZE"):
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return 1


def _group_now() -> Optional[Tuple[int, int]]:
    """(rank, world size) of the default process group or of MPI's world, once either is up."""
    dist = sys.modules.get("mpitensor.distributed")
    if dist is not None and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "mpi4py.MPI" in sys.modules and _mpi_launched():
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return None


def _rank_prefix() -> str:
    """``"[rank N] "`` in a job of several ranks (the abort handler's prefix), else ``""``."""
    return f"[rank {_rank_now()}] " if _world_now() > 1 else ""


def _report_unhandled(exc: BaseException) -> None:
    """Print the traceback, every line prefixed with the rank in a multi-rank job."""
    import traceback

    prefix = _rank_prefix()
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    if prefix:
        lines = ["unhandled exception; aborting the MPI job (MPI_Abort)\n", *lines]
    text = "".join(prefix + line + "\n" for chunk in lines
                   for line in chunk.rstrip("\n").split("\n"))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not stop the abort
            pass
    sys.stderr.write(text)
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
