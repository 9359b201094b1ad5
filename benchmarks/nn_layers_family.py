"""Time forward + backward of the newer nn layers against torch, in the same run, at one
thread.

Layers (batch and sizes chosen so each step takes milliseconds, not seconds):

- ``instancenorm2d``: InstanceNorm2d(32, affine=True) on (16, 32, 32, 32);
- ``maxpool3d``: MaxPool3d(3, stride=2, padding=1) on (8, 16, 16, 16, 16);
- ``avgpool3d``: AvgPool3d(2) on (8, 16, 16, 16, 16);
- ``adaptiveavgpool3d``: AdaptiveAvgPool3d((3, 5, 7)) on (8, 16, 16, 16, 16);
- ``ctcloss``: CTCLoss on log_softmax of (T=50, N=16, C=20) logits, targets of length 10-20;
- ``maxunpool2d``: MaxPool2d(2, return_indices=True) then MaxUnpool2d(2) on (16, 32, 32, 32).

Each step runs the layer on a fixed input that requires grad and backpropagates the sum of
its output. Both libraries run single-threaded (OpenBLAS/OMP/MKL threads = 1,
``torch.set_num_threads(1)``) and alternate repetitions, so load from elsewhere hits both
alike; the median of each is reported with the ratio torch / mpitensor (above 1.0 mpitensor
is faster). Without torch the torch columns are skipped with a note.

Usage:
    python benchmarks/nn_layers_family.py [--reps 7] [--only maxpool3d,ctcloss] [--dtype float32]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
from typing import Any, Callable, List, Optional  # noqa: E402

import numpy as np  # noqa: E402
from conv_family import _time, _torch_or_reason  # noqa: E402 - this folder's shared pieces

import mpitensor as mt  # noqa: E402


def _input(lib: Any, shape: tuple, dtype: str, seed: int = 0) -> Any:
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return lib.tensor(x, requires_grad=True)


def _layer_step(layer: Any, x: Any) -> Callable[[], Any]:
    def step() -> Any:
        x.grad = None
        out = layer(x)
        out.sum().backward()
        return out

    return step


def _instancenorm2d(lib: Any, dtype: str) -> Callable[[], Any]:
    layer = lib.nn.InstanceNorm2d(32, affine=True).to(getattr(lib, dtype))
    return _layer_step(layer, _input(lib, (16, 32, 32, 32), dtype))


def _maxpool3d(lib: Any, dtype: str) -> Callable[[], Any]:
    return _layer_step(lib.nn.MaxPool3d(3, stride=2, padding=1),
                       _input(lib, (8, 16, 16, 16, 16), dtype))


def _avgpool3d(lib: Any, dtype: str) -> Callable[[], Any]:
    return _layer_step(lib.nn.AvgPool3d(2), _input(lib, (8, 16, 16, 16, 16), dtype))


def _adaptiveavgpool3d(lib: Any, dtype: str) -> Callable[[], Any]:
    return _layer_step(lib.nn.AdaptiveAvgPool3d((3, 5, 7)),
                       _input(lib, (8, 16, 16, 16, 16), dtype))


def _ctcloss(lib: Any, dtype: str) -> Callable[[], Any]:
    t, n, c = 50, 16, 20
    rng = np.random.default_rng(1)
    x = _input(lib, (t, n, c), dtype)
    tl = rng.integers(10, 21, n)
    targets = lib.tensor(rng.integers(1, c, (n, 20)))
    il, tl = tuple([t] * n), tuple(int(v) for v in tl)
    loss = lib.nn.CTCLoss()

    def step() -> Any:
        x.grad = None
        out = loss(x.log_softmax(2), targets, il, tl)
        out.backward()
        return out

    return step


def _maxunpool2d(lib: Any, dtype: str) -> Callable[[], Any]:
    pool = lib.nn.MaxPool2d(2, return_indices=True)
    unpool = lib.nn.MaxUnpool2d(2)
    x = _input(lib, (16, 32, 32, 32), dtype)

    def step() -> Any:
        x.grad = None
        out, idx = pool(x)
        unpool(out, idx).sum().backward()
        return out

    return step


LAYERS = {"instancenorm2d": _instancenorm2d, "maxpool3d": _maxpool3d, "avgpool3d": _avgpool3d,
          "adaptiveavgpool3d": _adaptiveavgpool3d, "ctcloss": _ctcloss,
          "maxunpool2d": _maxunpool2d}


def _medians_ms(steps: List[Callable[[], Any]], reps: int) -> List[float]:
    """Each step's median time (ms) over ``reps`` rounds that run every step once in turn,
    after one warm-up call each."""
    for step in steps:
        step()
    rounds = [[_time(step) for step in steps] for _ in range(reps)]
    return [statistics.median(r[i] for r in rounds) * 1e3 for i in range(len(steps))]


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default=",".join(LAYERS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args(argv)
    torch, reason = _torch_or_reason()
    print(f"one thread, {args.dtype}, forward + backward, median of {args.reps} alternating "
          f"repetitions (after one warm-up step)")
    if torch is None:
        print(f"torch rows skipped: {reason}")
    print(f"{'layer':<18} {'mpitensor ms':>13} {'torch ms':>10} {'torch/mpitensor':>16}")
    for name in args.only.split(","):
        steps = [LAYERS[name](lib, args.dtype) for lib in (mt, torch) if lib is not None]
        times = _medians_ms(steps, args.reps)
        theirs = f"{times[1]:>10.2f} {times[1] / times[0]:>16.2f}" if len(times) > 1 else \
            f"{'-':>10} {'-':>16}"
        print(f"{name:<18} {times[0]:>13.2f} {theirs}", flush=True)


if __name__ == "__main__":
    main()
