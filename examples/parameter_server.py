"""A parameter server over RPC: rank 0 holds LeNet's parameters, the other ranks train them.

Launch (one server and two workers)::

    mpiexec -n 3 python examples/parameter_server.py                 # synchronous (default)
    mpiexec -n 3 python examples/parameter_server.py --mode async    # each push applied alone
    mpiexec -n 3 python examples/parameter_server.py --epochs 1 --max-steps 20   # a quick run

Rank 0 ("ps") owns the model and an SGD optimizer (momentum, and the learning rate multiplied
by ``--gamma`` after every epoch, as in ``examples/train.py``); it drives the epochs and
evaluates on the held-out set after each. Every other rank ("worker1", ...) keeps a replica of
LeNet and its shard of the training data (a ``DistributedSampler`` over the workers). Each
step a worker copies the parameters it last received into its replica, computes the gradient
of one batch, and pushes it to the server with ``rpc_sync``; the push answers with the
parameters after the update, so a step costs one round trip (a worker fetches the parameters
explicitly only at the start of an epoch).

``--mode sync``: the server waits for one gradient from every worker, averages them and steps
once (a ``functions.async_execution`` method: the pushes wait on a future, not on a thread).
With the same seed, batch size per worker and learning rate, this is the computation of
``mpiexec -n W python examples/train.py`` (DDP on W ranks): same initial weights, same shards,
same averaged gradients, so the same losses and accuracy. ``--mode async``: the server applies
each gradient as it arrives, and a worker's next gradient is computed on parameters that may
have moved meanwhile (stale by W - 1 updates as a rule, more where a worker falls behind);
there are W times as many updates, of W times smaller batches, so the default learning rate is
divided by W (at train.py's 0.03 the accuracy after 5 epochs scattered from 93 % to 98 % between
runs; at 0.015, 96.5-97.4 %).
Stale gradients act as extra momentum (an update keeps pushing the way the parameters went
before it), so async mode's default momentum is 0.7, not 0.9: at 0.9 the first epochs turned
out very differently from run to run (12 runs of 2 x 31 updates: held-out accuracy 15-67 %
after the first epoch, and about one run in eight stayed near chance for two epochs); at 0.7
56 runs of 100 steps each ended at 84-88 %, held-out loss 0.45-0.50 (and one CI run at 70 %).
The order of the pushes, and so an async run's result, changes from run to run.

The server prints a header, the held-out loss and accuracy before training, one line per
epoch and a final line (the workers print nothing)::

    initial held-out loss 2.3088, accuracy 9.30% (186/2000)
    epoch 1/5: train loss 0.9812, held-out loss 0.2621, accuracy 92.00% (1840/2000), ...
    ...
    final held-out accuracy 97.15% (1943/2000) after 5 epoch(s), 625 updates from 2 worker(s), ...

Data: the same flags and files as ``examples/train.py`` (``--data-dir``, default
``$MPITENSOR_DATA_DIR`` or ``data/mnist``; ``--dataset auto|mnist|digits``; ``--no-download``;
``--train-size``; ``--val-size``), read by train.py's own loader, so both programs train on the
same samples and hold out the same ones. The server reads the data first (and downloads it if
asked); the workers then read the files it found.

Exit codes: 2 for a bad command line or fewer than 2 ranks (one line on rank 0's stderr), 1 for
unusable data (one line) or an error on any rank (the server prints the traceback; a worker's
error is raised on the server with the worker's traceback).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mpitensor as mt
import mpitensor.distributed.rpc as rpc
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.data import DataLoader, DistributedSampler
from mpitensor.distributed.launch import launcher_rank
from mpitensor.models import LeNet
from mpitensor.optim import SGD
from mpitensor.optim.lr_scheduler import StepLR

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train.py, beside this file
from train import (  # noqa: E402 - after the path it is found on
    GLOBAL_BATCH,
    UserError,
    _float_in,
    _int_at_least,
    _Parser,
    load_blas_users_first,
    load_data,
)

PROG = "parameter_server.py"
SERVER = "ps"
EVAL_BATCH = 500
LR = 0.03  # train.py's default, for its default global batch of 64
MOMENTUM = 0.9  # train.py's default
ASYNC_MOMENTUM = 0.7


def build_parser() -> argparse.ArgumentParser:
    """The command line of parameter_server.py (see the module docstring)."""
    p = _Parser(prog=PROG, description="Train LeNet on MNIST with a parameter server over RPC "
                "(launch with `mpiexec -n 3 python examples/parameter_server.py`: rank 0 "
                "serves, the other ranks compute gradients).")
    p.add_argument("--mode", choices=("sync", "async"), default="sync",
                   help="sync: average one gradient per worker, then step (default); async: "
                        "step with each gradient as it arrives")
    p.add_argument("--epochs", type=_int_at_least(1), default=5,
                   help="number of passes over the training data (default 5)")
    p.add_argument("--max-steps", type=_int_at_least(1), default=None,
                   help="stop after this many steps of each worker in total (for quick runs)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=None,
                   help=f"samples per worker and step (default {GLOBAL_BATCH} // workers, as "
                        "train.py's default for that many ranks)")
    p.add_argument("--lr", type=_float_in(0.0, 1e6, low_open=True), default=None,
                   help=f"learning rate of the server's SGD (default {LR} in sync mode, "
                        f"{LR} / workers in async mode, whose updates have 1/workers of the "
                        "samples)")
    p.add_argument("--momentum", type=_float_in(0.0, 1.0), default=None,
                   help=f"SGD momentum (default {MOMENTUM} in sync mode, {ASYNC_MOMENTUM} in "
                        "async mode, whose stale gradients add momentum of their own)")
    p.add_argument("--gamma", type=_float_in(0.0, 1.0, low_open=True), default=0.6,
                   help="the learning rate is multiplied by this after every epoch (default 0.6)")
    p.add_argument("--seed", type=_int_at_least(0), default=0,
                   help="seed of the initial weights and of the shuffling (default 0)")
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


# ------------------------------------------------------------------------------ the server
class ParameterServer:
    """Lives on rank 0: the model, its optimizer, and the gradients pushed by the workers.

    Args:
        model: the model whose parameters are served (LeNet here).
        optimizer: a local optimizer over ``model``'s parameters.
        workers: how many workers push gradients.
        sync: average one gradient per worker before each step (else step on every push).
    """

    def __init__(self, model: Any, optimizer: Any, workers: int, sync: bool) -> None:
        self.model = model
        self.params = list(model.parameters())
        self.optimizer = optimizer
        self.workers = workers
        self.sync = sync
        self.updates = 0
        self._lock = threading.Lock()
        self._pushed: Dict[int, List[np.ndarray]] = {}  # worker index -> gradients, this round
        self._round = rpc.Future()  # completed with the new parameters when the round ends
        self._failed: Optional[BaseException] = None

    def _values(self) -> List[np.ndarray]:
        # copies: the reply is pickled after the lock is released, and an async push from
        # another worker may step the parameters meanwhile
        return [p.detach().numpy().copy() for p in self.params]

    def _step(self, grads: Sequence[np.ndarray]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = mt.from_numpy(g)
        self.optimizer.step()
        self.updates += 1

    def fetch(self) -> List[np.ndarray]:
        """The current parameters, as NumPy arrays in ``model.parameters()`` order."""
        with self._lock:
            return self._values()

    @rpc.functions.async_execution
    def push(self, index: int, grads: List[np.ndarray]) -> rpc.Future:
        """Take worker ``index``'s gradients; answer with the parameters after the update.

        In sync mode the answer waits until every worker has pushed for this round; the
        gradients are summed in worker order, so a run is deterministic given its seed.

        Raises:
            RuntimeError: a worker has failed (see :meth:`fail`), so the round cannot end.
        """
        done = rpc.Future()
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if not self.sync:
                self._step(grads)
                done.set_result(self._values())
                return done
            if index in self._pushed:
                raise RuntimeError(f"worker index {index} pushed twice in one round")
            self._pushed[index] = grads
            if len(self._pushed) < self.workers:
                return self._round
            mean = [sum(self._pushed[i][k] for i in range(self.workers)) / self.workers
                    for k in range(len(self.params))]
            self._step(mean)
            done, self._round, self._pushed = self._round, rpc.Future(), {}
            values = self._values()
        done.set_result(values)  # outside the lock: completing it sends the waiting replies
        return done

    def fail(self, error: BaseException) -> None:
        """A worker has failed: fail the round in progress and every later push with ``error``.

        Without this, the other workers would wait for the failed one's gradient until their
        RPC timeout.
        """
        with self._lock:
            self._failed = error
            round_, self._round, self._pushed = self._round, rpc.Future(), {}
        if not round_.done():
            round_.set_exception(error)


def evaluate(model: Any, dataset: Any) -> Tuple[float, int, int]:
    """(mean NLL loss, correct, total) of ``model`` over ``dataset``, batches of 500."""
    loader = DataLoader(dataset, batch_size=EVAL_BATCH)
    loss, correct, total = 0.0, 0, 0
    model.eval()
    with mt.no_grad():
        for x, y in loader:
            out = model(x)
            loss += float(F.nll_loss(out, y, reduction="sum").item())
            correct += int((out.argmax(dim=1) == y).sum().item())
            total += int(y.shape[0])
    model.train()
    return loss / max(total, 1), correct, total


# ------------------------------------------------------------------------------ a worker
class Worker:
    """Lives on a worker rank: a replica of LeNet, this worker's shard, the training steps.

    Created on its rank by the server (``rpc.remote``); it reads the training data itself.

    Args:
        ps: an RRef to the :class:`ParameterServer`.
        index: this worker's index among the workers (0 ..  workers - 1).
        workers: the number of workers (the shards of the data).
        args: the command line (data flags, batch size, seed).
    """

    def __init__(self, ps: rpc.RRef, index: int, workers: int,
                 args: argparse.Namespace) -> None:
        self.ps = ps
        self.index = index
        train = load_data(args, rank=index + 1)["train"]
        self.sampler = DistributedSampler(train, num_replicas=workers, rank=index,
                                          shuffle=True, seed=args.seed)
        self.loader = DataLoader(train, batch_size=args.batch_size, sampler=self.sampler)
        self.model = LeNet()  # its initial weights are overwritten by the server's
        self.params = list(self.model.parameters())

    def _load(self, values: Sequence[np.ndarray]) -> None:
        with mt.no_grad():
            for p, v in zip(self.params, values):
                p.copy_(mt.from_numpy(v))

    def train_epoch(self, epoch: int, steps: int) -> Tuple[float, int]:
        """Run ``steps`` steps of epoch ``epoch``; return (sum of batch losses x size, samples)."""
        self.sampler.set_epoch(epoch)
        values = self.ps.rpc_sync().fetch()
        loss_sum, samples = 0.0, 0
        for step, (x, y) in enumerate(self.loader):
            if step == steps:
                break
            self._load(values)
            for p in self.params:
                p.grad = None
            loss = F.nll_loss(self.model(x), y)
            loss.backward()
            grads = [p.grad.numpy() for p in self.params]
            values = self.ps.rpc_sync().push(self.index, grads)
            loss_sum += float(loss.item()) * int(y.shape[0])
            samples += int(y.shape[0])
        return loss_sum, samples


# ------------------------------------------------------------------------------ the run
def serve(args: argparse.Namespace, world: int) -> None:
    """Rank 0: build the model, start the workers, run the epochs, report."""
    workers = world - 1
    if args.batch_size is None:
        args.batch_size = max(1, GLOBAL_BATCH // workers)
    if args.lr is None:
        args.lr = LR if args.mode == "sync" else LR / workers
    if args.momentum is None:
        args.momentum = MOMENTUM if args.mode == "sync" else ASYNC_MOMENTUM
    data = load_data(args, rank=0)
    # the workers read exactly what the server found, without trying to download again
    args.dataset, args.no_download = data["name"].lower(), True
    mt.manual_seed(args.seed)  # train.py's seeding, so both start from the same weights
    np.random.seed(args.seed)
    random.seed(args.seed)
    model = LeNet()
    optimizer = SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    server = ParameterServer(model, optimizer, workers, sync=args.mode == "sync")
    ps = rpc.RRef(server)
    trainers = [rpc.remote(f"worker{r}", Worker, args=(ps, r - 1, workers, args))
                for r in range(1, world)]
    # every worker's shard has the same number of batches (the sampler pads it)
    steps_per_epoch = len(DataLoader(data["train"], batch_size=args.batch_size,
                                     sampler=DistributedSampler(data["train"], workers, 0)))
    per_update = args.batch_size * (workers if server.sync else 1)
    print(f"parameter server on rank 0, {workers} worker(s): LeNet on {data['description']}, "
          f"{args.mode} SGD, batch {args.batch_size} per worker = {per_update} per update, "
          f"{args.epochs} epoch(s) of {steps_per_epoch} steps, lr {args.lr:g} "
          f"(x{args.gamma}/epoch), momentum {args.momentum}, seed {args.seed}")
    loss, correct, total = evaluate(model, data["val"])
    print(f"initial held-out loss {loss:.4f}, accuracy {100 * correct / total:.2f}% "
          f"({correct}/{total})")
    done_steps, epochs_run = 0, 0
    for epoch in range(args.epochs):
        steps = steps_per_epoch
        if args.max_steps is not None:
            steps = min(steps, args.max_steps - done_steps)
        if steps <= 0:
            break
        t0 = time.perf_counter()
        futures = [t.rpc_async(timeout=0).train_epoch(epoch, steps) for t in trainers]
        results = _wait_all(futures, server)
        elapsed = time.perf_counter() - t0
        done_steps += steps
        epochs_run += 1
        loss_sum, samples = map(sum, zip(*results))
        loss, correct, total = evaluate(model, data["val"])
        scheduler.step()
        print(f"epoch {epoch + 1}/{args.epochs}: train loss {loss_sum / samples:.4f}, "
              f"held-out loss {loss:.4f}, accuracy {100 * correct / total:.2f}% "
              f"({correct}/{total}), {samples / elapsed:,.0f} samples/s")
    print(f"final held-out accuracy {100 * correct / total:.2f}% ({correct}/{total}) after "
          f"{epochs_run} epoch(s), {server.updates} updates from {workers} worker(s), "
          f"{args.mode}, {data['name']}")


def _wait_all(futures: List[rpc.Future], server: ParameterServer) -> List[Any]:
    """Every future's value; the first error (in time) is raised once all have finished.

    The server learns of a failed worker as soon as its call fails, so that the others, whose
    pushes would wait for the failed worker's gradient, fail at once instead of at a timeout.
    """
    errors: List[BaseException] = []
    lock = threading.Lock()

    def watch(index: int) -> Any:
        def on_done(fut: rpc.Future) -> None:
            exc = fut.exception()
            if exc is None:
                return
            with lock:
                errors.append(exc)
            server.fail(RuntimeError(f"worker{index + 1} failed ({type(exc).__name__}), so "
                                     "this round of pushes cannot complete"))

        return on_done

    for i, fut in enumerate(futures):
        fut.add_done_callback(watch(i))
    results = []
    for fut in futures:
        try:
            results.append(fut.wait())
        except BaseException:  # noqa: BLE001 - reported below: the first one, not this one
            pass
    if errors:
        raise errors[0]
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the command line, start RPC, serve (rank 0) or work; return the exit code."""
    args = build_parser().parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    rank = launcher_rank()
    load_blas_users_first(args)  # before init_rpc limits the BLAS pools to this rank's share
    rpc.init_rpc(SERVER if rank == 0 else f"worker{rank}")
    from mpi4py import MPI  # initialized by init_rpc

    world = MPI.COMM_WORLD.Get_size()
    status = 0
    try:
        if rank == 0:
            if world < 2:
                sys.stderr.write(f"{PROG} needs at least 2 ranks (a server and a worker), got "
                                 f"{world}: run `mpiexec -n 3 python examples/{PROG}`\n")
                status = 2
            else:
                try:
                    serve(args, world)
                except UserError as exc:
                    sys.stderr.write(f"{PROG}: error: {exc}\n")
                    status = 1
        # the workers only serve: shutdown() returns once the server is done with them
    finally:
        rpc.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
