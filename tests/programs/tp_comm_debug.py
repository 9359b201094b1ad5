"""Tensor parallelism as torch's TP tutorial teaches it, with the debugging tools: a small
feed-forward model split column-wise then row-wise over every process, trained a few steps;
CommDebugMode counts each step's collectives and visualize_sharding shows a weight's layout.

    mpiexec -n 2 python tp_comm_debug.py [--steps 3]
    USE_MPITENSOR=0 torchrun --nproc-per-node 2 tp_comm_debug.py      # the same on torch

Weights come from a formula and the batches from NumPy, so both libraries start alike; rank 0
prints each step's loss and collective counts, and the weight's table.
"""
import argparse
import importlib
import os

import numpy as np

LIB = "mpitensor" if os.environ.get("USE_MPITENSOR", "1") == "1" else "torch"
# the program names torch's modules; one switch picks the library behind them
torch, dist, nn, mesh_api, tp, debug = (importlib.import_module(LIB + sub) for sub in (
    "", ".distributed", ".nn", ".distributed.device_mesh", ".distributed.tensor.parallel",
    ".distributed.tensor.debug"))

IN, HIDDEN, OUT, BATCH = 6, 24, 4, 8


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(IN, HIDDEN, dtype=torch.float64)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(HIDDEN, OUT, dtype=torch.float64)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def initial_weights(model):
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(model.named_parameters())):
            n = p.numel()
            vals = np.sin(np.arange(n) * 0.37 + i) * 0.3
            p.copy_(torch.tensor(vals.reshape(tuple(p.shape))))


def counts(mode):
    return ", ".join(f"{k} x{v}" for k, v in sorted((str(k), v) for k, v in
                                                     mode.get_comm_counts().items()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("mpi" if LIB == "mpitensor" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = mesh_api.init_device_mesh("cpu", (world,))
    model = ToyModel()
    initial_weights(model)
    model = tp.parallelize_module(model, mesh, {"in_proj": tp.ColwiseParallel(),
                                                "out_proj": tp.RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    for step in range(1, args.steps + 1):
        x = torch.tensor(rng.standard_normal((BATCH, IN)))  # every rank: the same batch
        target = torch.tensor(rng.standard_normal((BATCH, OUT)))
        mode = debug.CommDebugMode()
        with mode:
            loss = ((model(x) - target) ** 2).mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
        all_reduces = mode.get_comm_counts()[torch.ops.c10d_functional.all_reduce]
        if rank == 0:
            print(f"step {step} loss {loss.item():.12f} collectives "
                  f"{mode.get_total_counts()}: {counts(mode)} (all_reduce {all_reduces})")
    if rank == 0:
        print("sharding", {k: str(v) for k, v in sorted(mode.get_sharding_info().items())})
    try:
        debug.visualize_sharding(model.in_proj.weight, header="in_proj.weight")
    except ValueError as exc:  # torch without tabulate or rich
        if rank == 0:
            print("visualize_sharding:", exc)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
