"""Gradient averaging: the PyTorch tutorial's ``average_gradients`` helper, on a real model.

In data-parallel training every rank computes gradients on its own share of the data, then
all-reduces each parameter's gradient (SUM) and divides by the world size, so that every rank
applies the same averaged update. With equal shares and a mean loss, that average is exactly the
gradient of the loss over the whole batch: this example checks it.

Every rank builds the same ``nn.Linear(3, 2)`` (fixed weights) and the same global batch of 12
samples, takes its contiguous share (12 / world size rows), runs ``loss.backward()`` on its share
(MSE loss), and calls ``average_gradients``. It then computes, locally and without any
communication, the gradient of the loss over all 12 samples, and compares.

Launch (any world size that divides 12: 1, 2, 3, 4, 6, 12)::

    mpiexec -n 4 python examples/gradient_averaging.py

Expected output (one line per rank, in any order; the same numbers at every world size, since
the full-batch gradient does not depend on how the batch is split)::

    Rank 0 (samples 0-2): averaged weight.grad [[-9.3225, -9.7055, -10.0885], [-2.5245, -2.632,
    -2.7395]] bias.grad [-3.83, -1.075] == full-batch gradient: ok
    Rank 1 (samples 3-5): ... (the same gradients)
    Rank 2 (samples 6-8): ... (the same gradients)
    Rank 3 (samples 9-11): ... (the same gradients)

(each rank's line is one line; the first is shown wrapped here)

A rank whose result differs prints ``MISMATCH`` instead of ``ok`` and the program exits with
code 1.
"""

import sys

import numpy as np

import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.nn as nn
import mpitensor.nn.functional as F

SAMPLES = 12


def make_model() -> nn.Linear:
    """The same model on every rank: a Linear(3, 2) with fixed weights."""
    model = nn.Linear(3, 2).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]]))
        model.bias.copy_(torch.tensor([0.05, -0.05]))
    return model


def make_batch() -> "tuple[torch.Tensor, torch.Tensor]":
    """The global batch every rank knows: inputs 0.0, 0.1, ..., targets from a fixed rule."""
    x = np.arange(SAMPLES * 3, dtype=np.float64).reshape(SAMPLES, 3) / 10
    y = np.stack([x.sum(1) - 1.0, 2.0 * x[:, 0] - x[:, 2]], axis=1)
    return torch.from_numpy(x), torch.from_numpy(y)


def average_gradients(model: nn.Module) -> None:
    """Gradient averaging: the tutorial's helper, word for word."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def rounded(t: "torch.Tensor") -> list:
    return np.round(t.numpy(), 4).tolist()


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    if SAMPLES % size:
        raise SystemExit(f"run on a world size that divides {SAMPLES} (got {size})")
    x, y = make_batch()
    share = SAMPLES // size
    lo, hi = rank * share, (rank + 1) * share

    model = make_model()
    F.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()   # this rank's share only
    average_gradients(model)

    full = make_model()                                  # no communication: all 12 samples
    F.mse_loss(full(x), y).backward()
    ok = all(np.allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12)
             for p, q in zip(model.parameters(), full.parameters()))
    print(f"Rank {rank} (samples {lo}-{hi - 1}): averaged weight.grad "
          f"{rounded(model.weight.grad)} bias.grad {rounded(model.bias.grad)} == full-batch "
          f"gradient: {'ok' if ok else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
