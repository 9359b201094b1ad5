"""A parameter server over RPC, started as separate commands (no mpiexec, no launcher).

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python rpc_param_server.py --role server --trainers 2
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python rpc_param_server.py --role trainer --rank 1
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python rpc_param_server.py --role trainer --rank 2
    USE_MPITENSOR=0 ...                       # the same program on torch (TensorPipe)

The server (RPC rank 0, named "ps") holds a small regression MLP. Each trainer, every step,
pulls the current parameters, computes the loss and gradients of its own batch locally, and
pushes the gradients; the server applies their mean with SGD once every trainer's has come
(``rpc.functions.async_execution``: the pushes wait on one Future without holding a thread),
then answers all of them. Trainers print their losses; the server prints a checksum of the
final weights. Weights and data come from NumPy with fixed seeds, so both libraries start
from the same numbers.
"""
import argparse
import os
import threading

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.distributed.rpc as rpc
    from mpitensor import nn
else:
    import torch
    import torch.distributed.rpc as rpc
    from torch import nn

IN, HIDDEN = 6, 12


def make_model(dtype):
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)).to(dtype)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            values = np.sin(np.arange(p.numel()) * 1.3 + i) * 0.4
            p.copy_(torch.from_numpy(values.reshape(tuple(p.shape))).to(dtype))
    return model


def batch(rank, step, dtype, size=16):
    rng = np.random.default_rng(1000 * rank + step)
    x = rng.standard_normal((size, IN))
    y = np.sin(x[:, :1] * 1.5) + 0.3 * x[:, 1:2] * x[:, 2:3]
    return torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)


class ParameterServer:
    """The server's state: the model, and the gradients pushed for the current step."""

    def __init__(self, trainers, lr, dtype):
        self.model = make_model(dtype)
        self.trainers, self.lr = trainers, lr
        self.lock = threading.Lock()
        self.pending = []
        self.done = torch.futures.Future()
        self.updates = 0


SERVER = None  # set in the server process


def pull():
    with SERVER.lock:
        return [p.detach().clone() for p in SERVER.model.parameters()]


@rpc.functions.async_execution
def push(grads):
    """Keep this trainer's gradients; the last of a step applies the mean and answers all."""
    with SERVER.lock:
        SERVER.pending.append(grads)
        fut = SERVER.done
        if len(SERVER.pending) == SERVER.trainers:
            with torch.no_grad():
                for i, p in enumerate(SERVER.model.parameters()):
                    total = SERVER.pending[0][i].clone()
                    for g in SERVER.pending[1:]:
                        total += g[i]
                    p -= SERVER.lr * total / SERVER.trainers
            SERVER.pending, SERVER.done = [], torch.futures.Future()
            SERVER.updates += 1
            fut.set_result(SERVER.updates)
    return fut


def train(rank, steps, dtype):
    model = make_model(dtype)
    for step in range(1, steps + 1):
        with torch.no_grad():
            for p, value in zip(model.parameters(), rpc.rpc_sync("ps", pull)):
                p.copy_(value)
        model.zero_grad()
        x, y = batch(rank, step, dtype)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        rpc.rpc_sync("ps", push, args=([p.grad for p in model.parameters()],))
        print(f"trainer {rank} step {step} loss {loss.item():.10f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["server", "trainer"], required=True)
    parser.add_argument("--rank", type=int, default=1, help="trainer rank (1..trainers)")
    parser.add_argument("--trainers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    world = args.trainers + 1
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8)
    if args.role == "server":
        global SERVER
        SERVER = ParameterServer(args.trainers, args.lr, dtype)
        rpc.init_rpc("ps", rank=0, world_size=world, rpc_backend_options=options)
        rpc.shutdown()  # returns when every trainer is done
        total = sum(float(p.detach().double().sum()) for p in SERVER.model.parameters())
        print(f"server: {SERVER.updates} updates, weight sum {total:.10f}", flush=True)
    else:
        if not 1 <= args.rank <= args.trainers:
            parser.error(f"--rank must be 1..{args.trainers}")
        rpc.init_rpc(f"trainer{args.rank}", rank=args.rank, world_size=world,
                     rpc_backend_options=options)
        train(args.rank, args.steps, dtype)
        rpc.shutdown()


if __name__ == "__main__":
    main()
