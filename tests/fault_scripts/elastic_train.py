"""A small snapshotting training program for ``mpitensor-run --max-restarts`` (test_elastic).

Usage::

    mpitensor-run --max-restarts 1 --nproc-per-node 2 tests/fault_scripts/elastic_train.py \\
        --ckpt-dir DIR --out-dir OUT [--fault kill|exit|raise] [--fault-rank R] [--fault-step S]
        [--fault-always]

A two-layer network is trained with ``DistributedDataParallel``, a shuffling
``DistributedSampler`` and SGD with momentum on a fixed synthetic regression set, for a few
epochs of a few steps each. After every step all ranks take part in writing one checkpoint
(``save_on_rank0``: model, optimizer with its momentum buffers, sampler position, epoch and
step) to ``DIR/last.mt``; at start, when that file exists, every rank loads it
(``load_on_all_ranks``) and continues from there, mid-epoch included, as a torchrun program
that snapshots does.

``--fault`` makes rank R end itself in the middle of step S (counted over the whole run,
1-based), after the forward pass and before the backward one, so the other ranks wait for it in
the gradient all-reduce and the newest checkpoint is that of step S - 1: ``kill`` sends itself
SIGKILL, ``exit`` calls ``os._exit(1)``, ``raise`` raises ``RuntimeError``. Only on the first
attempt (``TORCHELASTIC_RESTART_COUNT=0``), unless ``--fault-always``.

On stdout each rank prints ``attempt RANK COUNT MAX`` (``TORCHELASTIC_RESTART_COUNT`` and
``TORCHELASTIC_MAX_RESTARTS`` as it found them) first, ``resumed RANK GLOBAL_STEP`` after a
resume, and at the end writes its final parameters to ``OUT/final.RANK.npz``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict

import numpy as np

EPOCHS = 3
SAMPLES = 48
BATCH = 4  # per rank and step


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")  # one write per line: hydra's forwarding keeps it whole
    sys.stdout.flush()


def _fault(kind: str) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "exit":
        os._exit(1)
    raise RuntimeError("injected fault")


def _dataset() -> Any:
    import mpitensor as mt
    from mpitensor.data import TensorDataset

    rng = np.random.default_rng(1234)  # the same data on every rank and every attempt
    x = rng.standard_normal((SAMPLES, 4)).astype(np.float32)
    y = (np.sin(x.sum(axis=1, keepdims=True)) + 0.1 * x[:, :1]).astype(np.float32)
    return TensorDataset(mt.tensor(x), mt.tensor(y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--fault", choices=("kill", "exit", "raise"))
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=9)
    parser.add_argument("--fault-always", action="store_true")
    args = parser.parse_args()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    import mpitensor as mt
    import mpitensor.distributed as dist
    import mpitensor.nn as nn
    from mpitensor.checkpoint import load_on_all_ranks, save_on_rank0
    from mpitensor.data import DataLoader, DistributedSampler
    from mpitensor.nn.parallel import DistributedDataParallel as DDP
    from mpitensor.optim import SGD

    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    _say(f"attempt {rank} {restart} {os.environ['TORCHELASTIC_MAX_RESTARTS']}")

    mt.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = _dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    ckpt = Path(args.ckpt_dir) / "last.mt"
    start_epoch, global_step = 0, 0
    if ckpt.exists():  # written on rank 0 only, after every step: a shared directory here
        state = load_on_all_ranks(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])
        start_epoch, global_step = int(state["epoch"]), int(state["global_step"])
        _say(f"resumed {rank} {global_step}")
    ddp = DDP(model)
    loss_fn = nn.MSELoss()

    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)  # keeps a loaded position for its own epoch only
        for x, y in loader:
            global_step += 1
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            if (args.fault and rank == args.fault_rank and global_step == args.fault_step
                    and (restart == 0 or args.fault_always)):
                _fault(args.fault)
            loss.backward()
            optimizer.step()
            snapshot: Dict[str, Any] = {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "sampler": sampler.state_dict(), "epoch": epoch, "global_step": global_step}
            save_on_rank0(snapshot, ckpt)

    out = Path(args.out_dir)
    np.savez(out / f"final.{rank}.npz",
             **{name: p.detach().numpy() for name, p in model.state_dict().items()},
             global_step=np.array(global_step))
    _say(f"done {rank} {global_step}")


if __name__ == "__main__":
    main()
