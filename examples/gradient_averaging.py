"""Gradient averaging: the PyTorch tutorial's ``average_gradients`` helper.

In data-parallel training every rank computes gradients on its own share of the data, then
all-reduces each parameter's gradient (SUM) and divides by the world size, so that every rank
applies the same averaged update. Here a tiny stand-in model holds a 2x3 weight and a bias of 2,
and each rank fills in fake gradients (what ``loss.backward()`` would leave)::

    rank r:  weight.grad = (r + 1) * [[1, 2, 3], [4, 5, 6]]      bias.grad = [r, 1 - r]

so the average over N ranks is ``weight.grad = (N + 1) / 2 * [[1, 2, 3], [4, 5, 6]]`` and
``bias.grad = [(N - 1) / 2, 1 - (N - 1) / 2]``. Each rank checks its result against that mean.

Launch::

    mpiexec -n 4 python examples/gradient_averaging.py

Expected output (one line per rank, in any order; works at any world size)::

    Rank 0 averaged gradients: weight [[2.5, 5.0, 7.5], [10.0, 12.5, 15.0]] bias [1.5, -0.5] ok
    Rank 1 averaged gradients: weight [[2.5, 5.0, 7.5], [10.0, 12.5, 15.0]] bias [1.5, -0.5] ok
    Rank 2 averaged gradients: weight [[2.5, 5.0, 7.5], [10.0, 12.5, 15.0]] bias [1.5, -0.5] ok
    Rank 3 averaged gradients: weight [[2.5, 5.0, 7.5], [10.0, 12.5, 15.0]] bias [1.5, -0.5] ok

A rank whose result differs from the mean prints ``MISMATCH`` instead of ``ok`` and the program
exits with code 1.
"""

import sys
from typing import List, Optional

import numpy as np

import mpitensor as torch
import mpitensor.distributed as dist


class Parameter:
    """What ``average_gradients`` sees of a parameter: its ``data`` and its ``grad``."""

    def __init__(self, data: "torch.Tensor") -> None:
        self.data = data
        self.grad: Optional["torch.Tensor"] = None


class TinyModel:
    """Stands in for an ``nn.Module``: ``parameters()`` yields a 2x3 weight and a bias of 2."""

    def __init__(self) -> None:
        self.weight = Parameter(torch.zeros(2, 3))
        self.bias = Parameter(torch.zeros(2))

    def parameters(self) -> List[Parameter]:
        return [self.weight, self.bias]


def fake_backward(model: TinyModel, rank: int) -> None:
    """Fill in the gradients a backward pass on this rank's data would have produced."""
    base = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    model.weight.grad = base * (rank + 1)
    model.bias.grad = torch.tensor([float(rank), 1.0 - rank])


def average_gradients(model: TinyModel) -> None:
    """Gradient averaging: the tutorial's helper, word for word."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = TinyModel()
    fake_backward(model, rank)
    average_gradients(model)
    # the mean computed locally, without communication, from every rank's known gradients
    weight_mean = np.mean([(r + 1) * np.arange(1.0, 7.0).reshape(2, 3) for r in range(size)], 0)
    bias_mean = np.mean([[float(r), 1.0 - r] for r in range(size)], 0)
    weight, bias = model.weight.grad.tolist(), model.bias.grad.tolist()
    ok = np.allclose(weight, weight_mean) and np.allclose(bias, bias_mean)
    print(f"Rank {rank} averaged gradients: weight {weight} bias {bias} "
          f"{'ok' if ok else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
