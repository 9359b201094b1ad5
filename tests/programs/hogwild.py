"""Hogwild!: several processes train one model in shared memory, then the parent tests it.

    python tests/programs/hogwild.py [--procs 2] [--steps 150] [--start-method spawn]
    USE_MPITENSOR=0 python tests/programs/hogwild.py ...   # the same program on torch

A softmax classifier over 4 Gaussian clusters in 10 dimensions (made in memory, seeded). Each
process runs SGD on its own shard, with no locks, on the parameters it shares with the others;
the parent never trains. It prints the test accuracy before and after, and the weights' sum.
"""
import argparse
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.multiprocessing as mp
    import mpitensor.nn.functional as F
    from mpitensor import nn
else:
    import torch
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch import nn

DIM, CLASSES = 10, 4


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).standard_normal((CLASSES, DIM)) * 2.5
    y = rng.integers(0, CLASSES, n)
    x = centres[y] + rng.standard_normal((n, DIM))
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def train(rank, model, steps, batch):
    x, y = make_data(steps * batch, seed=100 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--start-method", default="spawn")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(DIM, CLASSES)
    model.share_memory()  # the gradients are made in each process; the weights are shared
    xt, yt = make_data(1000, seed=7)
    print(f"before: accuracy {accuracy(model, xt, yt):.3f}")
    ctx = mp.get_context(args.start_method)
    procs = [ctx.Process(target=train, args=(r, model, args.steps, args.batch))
             for r in range(args.procs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, f"a trainer exited {p.exitcode}"
    print(f"after: accuracy {accuracy(model, xt, yt):.3f}")
    print(f"shared: {model.weight.is_shared()}")


if __name__ == "__main__":
    main()
