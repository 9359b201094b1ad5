"""DDP over two of four RPC processes, with the embedding table in a RemoteModule.

    python rpc_ddp_remote_module.py [--steps 6] [--dtype float32 [float64]]
    USE_MPITENSOR=0 python rpc_ddp_remote_module.py ...     # the same program on torch

Four processes from ``mp.spawn``: "ps" (rank 3) only serves; "master" (rank 2) builds an
``nn.EmbeddingBag`` on "ps" as a ``RemoteModule`` and starts both trainers over RPC;
"trainer0" and "trainer1" (ranks 0 and 1) form a process group of their own
(``init_process_group(world_size=2)`` at an address of their own) and train a hybrid model:
the remote embedding lookup, then a local ``nn.Linear`` wrapped in ``DistributedDataParallel``.
One ``dist_autograd.backward`` sends the embedding's gradient to "ps" and DDP averages the
linear layer's between the trainers; one ``DistributedOptimizer`` steps both. Barriers between
the trainers keep the table's updates out of the other trainer's lookups and backward pass,
and the trainers step in turn: torch's DistributedOptimizer runs SGD as a TorchScript
functional optimizer that updates a parameter without a lock, so two trainers stepping the
shared table at once can lose one's update (about one run in two here; ours takes a lock).
So the losses are reproducible. Weights and batches come from NumPy with fixed seeds.
"""
import argparse
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.distributed as dist
    import mpitensor.distributed.autograd as dist_autograd
    import mpitensor.distributed.rpc as rpc
    import mpitensor.multiprocessing as mp
    from mpitensor import nn, optim
    from mpitensor.distributed.nn import RemoteModule
    from mpitensor.distributed.optim import DistributedOptimizer
    from mpitensor.nn.parallel import DistributedDataParallel as DDP
else:
    import torch
    import torch.distributed as dist
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    from torch import nn, optim
    from torch.distributed.nn import RemoteModule
    from torch.distributed.optim import DistributedOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

ROWS, DIM, CLASSES = 40, 8, 5


def _fill(module, dtype, phase):
    module.to(dtype)
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            values = np.cos(np.arange(p.numel()) * 0.37 + phase + i) * 0.5
            p.copy_(torch.from_numpy(values.reshape(tuple(p.shape))).to(dtype))
    return module


def make_table(dtype):
    """Built on "ps" by the RemoteModule."""
    return _fill(nn.EmbeddingBag(ROWS, DIM, mode="sum"), dtype, 0.0)


class Hybrid(nn.Module):
    def __init__(self, table, dtype):
        super().__init__()
        self.table = table
        self.fc = DDP(_fill(nn.Linear(DIM, CLASSES), dtype, 1.0))

    def forward(self, indices, offsets):
        return self.fc(self.table.forward(indices, offsets))


def batch(rank, step):
    rng = np.random.default_rng(100 * rank + step)
    n = int(rng.integers(12, 24))
    indices = rng.integers(0, ROWS, n)
    offsets = np.concatenate([[0], np.sort(rng.choice(np.arange(1, n), 5, replace=False))])
    target = rng.integers(0, CLASSES, len(offsets))
    return (torch.from_numpy(indices), torch.from_numpy(offsets), torch.from_numpy(target))


def run_trainer(table, rank, steps, lr, dtype_name):
    dtype = getattr(torch, dtype_name)
    model = Hybrid(table, dtype)
    params = table.remote_parameters() + [rpc.RRef(p) for p in model.fc.parameters()]
    opt = DistributedOptimizer(optim.SGD, params, lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for step in range(1, steps + 1):
        indices, offsets, target = batch(rank, step)
        with dist_autograd.context() as cid:
            loss = loss_fn(model(indices, offsets), target)
            dist_autograd.backward(cid, [loss])
            dist.barrier()  # both backward passes are done on "ps" before the table changes
            for turn in range(2):  # one trainer steps the shared table at a time (see above)
                if turn == rank:
                    opt.step(cid)
                dist.barrier()  # the update has landed before the next step or lookup
        losses.append(loss.item())
    return losses


def run_worker(rank, world_size, ports, steps, lr, dtype_names):
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8,
                                              init_method=f"tcp://127.0.0.1:{ports[0]}")
    if rank <= 1:
        dist.init_process_group("gloo", rank=rank, world_size=2,
                                init_method=f"tcp://127.0.0.1:{ports[1]}")
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=options)
    elif rank == 2:
        rpc.init_rpc("master", rank=rank, world_size=world_size, rpc_backend_options=options)
        for name in dtype_names:  # one training per dtype, each from the same start
            table = RemoteModule("ps/cpu", make_table, args=(getattr(torch, name),))
            futs = [rpc.rpc_async(f"trainer{r}", run_trainer, args=(table, r, steps, lr, name))
                    for r in (0, 1)]
            for r, fut in enumerate(futs):
                for step, loss in enumerate(fut.wait(), 1):
                    print(f"{name} trainer {r} step {step} loss {loss:.10f}", flush=True)
            weights = table.get_module_rref().rpc_sync().state_dict()["weight"]
            print(f"{name} table weight sum {float(weights.double().sum()):.10f}", flush=True)
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size, rpc_backend_options=options)
    rpc.shutdown()
    if rank <= 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--dtype", choices=["float32", "float64"], nargs="+",
                        default=["float32"], help="train once in each")
    parser.add_argument("--ports", type=int, nargs=2, default=[29501, 29500],
                        help="RPC's rendezvous port, then the trainers' process group's")
    args = parser.parse_args()
    mp.spawn(run_worker, args=(4, args.ports, args.steps, args.lr, args.dtype), nprocs=4,
             join=True)


if __name__ == "__main__":
    main()
