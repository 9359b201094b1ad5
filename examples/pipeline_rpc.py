"""Pipeline parallelism over RPC: LeNet split in two stages on two workers, distributed autograd.

Launch::

    mpiexec -n 3 python examples/pipeline_rpc.py                    # one epoch
    mpiexec -n 3 python examples/pipeline_rpc.py --check            # and the single process
    mpiexec -n 3 python examples/pipeline_rpc.py --chunks 4         # 4 micro-batches in flight
    mpiexec -n 3 python examples/pipeline_rpc.py --max-steps 20 --check --log-every 1

Rank 0 ("trainer") drives; LeNet's convolutional part (conv1, conv2 with their ReLUs and
pooling) lives on "worker1" and its fully connected part (fc1, fc2, fc3, log-softmax) on
"worker2" (on two ranks: the convolutional part on the trainer itself). Each stage is an object
its rank creates on the trainer's ``rpc.remote`` call, from the trainer's initial weights.

A step splits the batch into ``--chunks`` micro-batches (default 1: the whole batch) and sends
them all to the first stage at once (``rpc_async``); as each comes back it goes on to the
second stage, so the first stage works on micro-batch i + 1 while the second works on
micro-batch i. Activations travel through the trainer (stage 1 -> trainer -> stage 2), because
distributed autograd follows the tensors of ``rpc_sync``/``rpc_async`` calls and their results.
The trainer joins the outputs, computes the loss, and inside
``with dist_autograd.context() as context_id`` runs ``dist_autograd.backward(context_id,
[loss])``: the gradient flows back through both stages on their own ranks.
``DistributedOptimizer(SGD, parameter RRefs)`` then steps each stage's parameters where they
live (``step(context_id)``).

The trainer prints a header, ``step N: loss L`` every ``--log-every`` steps, and the held-out
accuracy of the trained model at the end. ``--check`` also trains the same LeNet in the
trainer's process alone, from the same initial weights on the same batches, prints its loss
beside the pipeline's and ends with the largest relative difference of the per-step losses::

    step 1: loss 2.28170514, single process 2.28170514
    ...
    max relative difference of the 20 per-step losses: 0.0e+00 (tolerance 1e-05): ok

and exits with code 1 if it is above ``--tolerance``. With one micro-batch (the default) the
pipeline does the single process's arithmetic exactly: the difference is 0, however long the
run (measured over 375 steps). With several, each stage sums the micro-batches' weight
gradients, in the order they arrive, where the single process computes them in one product;
the float32 results differ in their last bits (about 1e-7), and training, like any two runs
that differ in their last bits, amplifies that: with ``--chunks 4`` the losses agreed to
1.1e-7 over 25 steps (3 runs), but over 125 steps the largest difference ranged from 1.1e-6
to 8e-2 (7 runs, 5 within 1e-5). Compare micro-batched runs over a few dozen steps.

Data: the flags and files of ``examples/train.py`` (``--data-dir``, default
``$MPITENSOR_DATA_DIR`` or ``data/mnist``; ``--dataset auto|mnist|digits``, ``--no-download``,
``--train-size``, ``--val-size``), read by the trainer alone with train.py's loader.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mpitensor as mt
import mpitensor.distributed.autograd as dist_autograd
import mpitensor.distributed.rpc as rpc
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor import nn
from mpitensor.data import DataLoader, DistributedSampler
from mpitensor.distributed.launch import launcher_rank
from mpitensor.distributed.optim import DistributedOptimizer
from mpitensor.models import LeNet
from mpitensor.optim import SGD

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train.py, beside this file
from train import (  # noqa: E402 - after the path it is found on
    UserError,
    _float_in,
    _int_at_least,
    _Parser,
    load_blas_users_first,
    load_data,
)

PROG = "pipeline_rpc.py"
TRAINER = "trainer"
EVAL_BATCH = 500


def build_parser() -> argparse.ArgumentParser:
    """The command line of pipeline_rpc.py (see the module docstring)."""
    p = _Parser(prog=PROG, description="Train LeNet split in two pipeline stages on two RPC "
                "workers with distributed autograd (launch with `mpiexec -n 3 python "
                "examples/pipeline_rpc.py`).")
    p.add_argument("--epochs", type=_int_at_least(1), default=1,
                   help="number of passes over the training data (default 1)")
    p.add_argument("--max-steps", type=_int_at_least(1), default=None,
                   help="stop after this many steps in total (for quick runs)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=64,
                   help="samples per step (default 64)")
    p.add_argument("--chunks", type=_int_at_least(1), default=1,
                   help="micro-batches per step, in flight together (default 1, at most 8); "
                        "with more than 1 the gradients are summed in another order than in "
                        "one process, and --check holds for a few dozen steps, not an epoch")
    p.add_argument("--lr", type=_float_in(0.0, 1e6, low_open=True), default=0.03,
                   help="learning rate of SGD (default 0.03)")
    p.add_argument("--momentum", type=_float_in(0.0, 1.0), default=0.9,
                   help="SGD momentum (default 0.9)")
    p.add_argument("--seed", type=_int_at_least(0), default=0,
                   help="seed of the initial weights and of the shuffling (default 0)")
    p.add_argument("--log-every", type=_int_at_least(1), default=10, metavar="STEPS",
                   help="print the loss every STEPS steps (default 10)")
    p.add_argument("--check", action="store_true",
                   help="also train the same model in one process from the same weights on the "
                        "same batches; print both losses and their largest relative difference")
    p.add_argument("--tolerance", type=_float_in(0.0, 1.0, low_open=True), default=1e-5,
                   help="--check fails (exit code 1) above this relative difference "
                        "(default 1e-5)")
    p.add_argument("--data-dir", default=None,
                   help="directory of the MNIST IDX files (default $MPITENSOR_DATA_DIR or "
                        "data/mnist)")
    p.add_argument("--dataset", choices=("auto", "mnist", "digits"), default="auto",
                   help="auto: MNIST where present or downloadable, else Digits (default)")
    p.add_argument("--no-download", action="store_true",
                   help="never download MNIST; use only files already in --data-dir")
    p.add_argument("--train-size", type=_int_at_least(1), default=None,
                   help="use only this many training samples (a fixed random subset)")
    p.add_argument("--val-size", type=_int_at_least(1), default=None,
                   help="held-out samples (as train.py's --val-size)")
    return p


# ------------------------------------------------------------------------------ the stages
#: the layers of each stage, by their names in LeNet
HALVES = (("conv1", "conv2"), ("fc1", "fc2", "fc3"))


def split_lenet(net: LeNet) -> Tuple[nn.Module, nn.Module]:
    """LeNet's two halves, sharing its layers: (convolutional part, fully connected part).

    Applied one after the other they run the operations of ``LeNet.forward``: conv1, ReLU,
    max-pool 2, conv2, ReLU, max-pool 2, flatten | fc1, ReLU, fc2, ReLU, fc3, log-softmax.
    """
    convs = nn.Sequential(net.conv1, nn.ReLU(), nn.MaxPool2d(2),
                          net.conv2, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(1))
    fcs = nn.Sequential(net.fc1, nn.ReLU(), net.fc2, nn.ReLU(), net.fc3, nn.LogSoftmax(dim=1))
    return convs, fcs


class Stage:
    """Lives on a stage's rank: one half of LeNet, running one micro-batch at a time.

    Args:
        half: 0 for the convolutional half, 1 for the fully connected half.
        state: the whole LeNet's ``state_dict`` (the trainer's initial weights).
    """

    def __init__(self, half: int, state: Dict[str, Any]) -> None:
        self.net = LeNet()
        self.net.load_state_dict(state)
        self.half = half
        self.module = split_lenet(self.net)[half]
        # one micro-batch at a time, as one device would run them; the others queue here
        self._lock = threading.Lock()

    def forward(self, x: mt.Tensor) -> mt.Tensor:
        """This stage's output for the micro-batch ``x`` (called inside the trainer's context)."""
        with self._lock:
            return self.module(x)

    def parameter_rrefs(self) -> List[rpc.RRef]:
        """An RRef to each parameter, for ``DistributedOptimizer``."""
        return [rpc.RRef(p) for p in self.module.parameters()]

    def state_dict(self) -> Dict[str, np.ndarray]:
        """This half's weights as NumPy arrays, by their names in LeNet (``fc1.weight``, ...)."""
        return {k: v.detach().numpy().copy() for k, v in self.net.state_dict().items()
                if k.split(".")[0] in HALVES[self.half]}


class PipelinedLeNet:
    """The trainer's handle on the two stages: ``model(x)`` runs the pipeline.

    Args:
        owners: the worker names of the two stages.
        state: the initial weights (a LeNet ``state_dict``), sent to both.
        chunks: micro-batches per call.
    """

    def __init__(self, owners: Sequence[str], state: Dict[str, Any], chunks: int) -> None:
        self.owners = list(owners)
        self.stages = [rpc.remote(owner, Stage, args=(half, state))
                       for half, owner in enumerate(self.owners)]
        self.chunks = chunks

    def __call__(self, x: mt.Tensor) -> mt.Tensor:
        first = [self.stages[0].rpc_async().forward(part) for part in x.chunk(self.chunks)]
        # each activation goes on to the second stage as soon as the first stage returns it
        second = [self.stages[1].rpc_async().forward(f.wait()) for f in first]
        return mt.cat([f.wait() for f in second])

    def parameter_rrefs(self) -> List[rpc.RRef]:
        """RRefs to every parameter of both stages."""
        return [p for stage in self.stages for p in stage.rpc_sync().parameter_rrefs()]

    def state_dict(self) -> Dict[str, np.ndarray]:
        """The whole model's current weights, gathered from the stages (LeNet's names)."""
        state: Dict[str, np.ndarray] = {}
        for stage in self.stages:
            state.update(stage.rpc_sync().state_dict())
        return state


# ------------------------------------------------------------------------------ training
def batches(dataset: Any, args: argparse.Namespace) -> List[Tuple[mt.Tensor, mt.Tensor]]:
    """The run's batches, in order: ``--epochs`` shuffled passes, cut at ``--max-steps``."""
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    out: List[Tuple[mt.Tensor, mt.Tensor]] = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if args.max_steps is not None and len(out) == args.max_steps:
                return out
            out.append((x, y))
    return out


def train_pipeline(model: PipelinedLeNet, data: Sequence[Tuple[mt.Tensor, mt.Tensor]],
                   args: argparse.Namespace, reference: Optional[List[float]]) -> List[float]:
    """Train through the pipeline; print every ``--log-every`` steps; return the losses."""
    optimizer = DistributedOptimizer(SGD, model.parameter_rrefs(), lr=args.lr,
                                     momentum=args.momentum)
    losses: List[float] = []
    for step, (x, y) in enumerate(data, 1):
        with dist_autograd.context() as context_id:
            loss = F.nll_loss(model(x), y)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
        losses.append(float(loss.item()))
        if step % args.log_every == 0 or step == len(data):
            line = f"step {step}: loss {losses[-1]:.8f}"
            if reference is not None:
                line += f", single process {reference[step - 1]:.8f}"
            print(line)
    return losses


def train_single(net: LeNet, data: Sequence[Tuple[mt.Tensor, mt.Tensor]],
                 args: argparse.Namespace) -> List[float]:
    """The reference: the same steps on an ordinary LeNet in this process; the losses."""
    optimizer = SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    losses = []
    for x, y in data:
        optimizer.zero_grad()
        loss = F.nll_loss(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def accuracy(net: LeNet, dataset: Any) -> Tuple[int, int]:
    """(correct, total) of ``net`` on ``dataset``."""
    correct, total = 0, 0
    net.eval()
    with mt.no_grad():
        for x, y in DataLoader(dataset, batch_size=EVAL_BATCH):
            correct += int((net(x).argmax(dim=1) == y).sum().item())
            total += int(y.shape[0])
    return correct, total


def max_relative_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """max |a_i - b_i| / |b_i| (0 where both are 0)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), np.finfo(np.float64).tiny)))


def drive(args: argparse.Namespace, owners: Sequence[str]) -> int:
    """The trainer: build both stages, train (and the reference with ``--check``), report."""
    data = load_data(args, rank=0)
    mt.manual_seed(args.seed)
    net = LeNet()
    initial = {k: v.detach().clone() for k, v in net.state_dict().items()}
    steps = batches(data["train"], args)
    model = PipelinedLeNet(owners, initial, args.chunks)
    print(f"pipeline: LeNet's conv1-conv2 on {owners[0]}, fc1-fc3 on {owners[1]}, driven by "
          f"{TRAINER}; {data['description']}; batch {args.batch_size} in {args.chunks} "
          f"micro-batch(es), {len(steps)} step(s), lr {args.lr}, momentum {args.momentum}, "
          f"seed {args.seed}")
    reference = None
    if args.check:  # first, so that each step's line can show both losses
        t0 = time.perf_counter()
        reference = train_single(net, steps, args)
        single_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    losses = train_pipeline(model, steps, args, reference)
    pipeline_s = time.perf_counter() - t0
    samples = sum(int(y.shape[0]) for _, y in steps)
    trained = LeNet()
    trained.load_state_dict({k: mt.from_numpy(v) for k, v in model.state_dict().items()})
    correct, total = accuracy(trained, data["val"])
    print(f"held-out accuracy {100 * correct / total:.2f}% ({correct}/{total}) after "
          f"{len(steps)} step(s); pipeline {samples / pipeline_s:,.0f} samples/s")
    if reference is None:
        return 0
    diff = max_relative_difference(losses, reference)
    weights = max(float(np.max(np.abs(trained.state_dict()[k].numpy() - v.numpy())))
                  for k, v in net.state_dict().items())
    ok = diff <= args.tolerance
    print(f"single process {samples / single_s:,.0f} samples/s; largest weight difference "
          f"after training {weights:.1e}")
    print(f"max relative difference of the {len(losses)} per-step losses: {diff:.1e} "
          f"(tolerance {args.tolerance:g}): {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the command line, start RPC, drive (rank 0) or serve a stage; the exit code."""
    args = build_parser().parse_args(argv)
    if args.chunks > 8:
        # every micro-batch in flight holds a worker thread on each rank during backward
        build_parser().error(f"argument --chunks: at most 8, got {args.chunks}")
    sys.stdout.reconfigure(line_buffering=True)
    rank = launcher_rank()
    load_blas_users_first(args)  # before init_rpc limits the BLAS pools to this rank's share
    rpc.init_rpc(TRAINER if rank == 0 else f"worker{rank}")
    from mpi4py import MPI  # initialized by init_rpc

    world = MPI.COMM_WORLD.Get_size()
    status = 0
    try:
        if rank == 0:
            if world < 2:
                sys.stderr.write(f"{PROG} needs at least 2 ranks, got {world}: run "
                                 f"`mpiexec -n 3 python examples/{PROG}`\n")
                status = 2
            else:
                owners = ["worker1", "worker2"] if world >= 3 else [TRAINER, "worker1"]
                try:
                    status = drive(args, owners)
                except UserError as exc:
                    sys.stderr.write(f"{PROG}: error: {exc}\n")
                    status = 1
        # the other ranks only serve: shutdown() returns once the trainer is done with them
    finally:
        rpc.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
