"""Time training steps of the convolution family against torch, in the same run, at one thread.

Two workloads, each a full step (forward, loss, backward, Adam update):

- ``dcgan``: DCGAN's generator (Radford et al.): a 100-d code through ConvTranspose2d layers
  100->512 (4x4 kernel, stride 1: 4x4), 512->256->128->64->3 (4x4 kernels, stride 2, padding
  1: 8, 16, 32, 64), BatchNorm2d and ReLU between them, tanh at the end; batch 64, 64x64
  output; loss = mean squared error to a fixed target;
- ``conv1d``: a 1-D convolutional classifier: Conv1d 32->64 (7, padding 3), 64->128 (5,
  stride 2, padding 2), 128->128 (3, padding 1), ReLU after each, the mean over time, a linear
  layer to 10 classes and cross-entropy; batch 64, length 512;
- ``conv3d``: Conv3d 16->32 (3, padding 1), 32->32 (3, stride 2, padding 1), ReLU after each,
  ConvTranspose3d 32->16 (2, stride 2) back to the input's size; batch 8, 16x16x16 volumes;
  loss = mean squared error to a fixed target. (3-D runs on the generic im2col kernel, one
  product per group, against torch's oneDNN direct convolution.)

Both libraries run single-threaded (OpenBLAS/OMP/MKL threads = 1, ``torch.set_num_threads(1)``)
and alternate repetitions, so load from elsewhere hits both alike; the median of each is
reported with the ratio torch / mpitensor (the speed relative to torch: above 1.0, mpitensor
is faster). Without torch the torch columns are skipped with a note.

Usage:
    python benchmarks/conv_family.py [--reps 7] [--only dcgan,conv1d,conv3d] [--dtype float32]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402

import mpitensor as mt  # noqa: E402

BATCH = 64


def _torch_or_reason() -> Tuple[Optional[Any], str]:
    try:
        import torch  # noqa: PLC0415 - the baseline, imported after the thread settings
    except Exception as exc:  # ImportError, or a broken install
        return None, f"torch is not importable ({type(exc).__name__}: {exc})"
    torch.set_num_threads(1)
    return torch, ""


def _dcgan(lib: Any, dtype: str) -> Tuple[Any, Callable[[], Any]]:
    nn = lib.nn
    chans = [100, 512, 256, 128, 64, 3]
    layers: List[Any] = []
    for i, (cin, cout) in enumerate(zip(chans, chans[1:])):
        first = i == 0
        layers.append(nn.ConvTranspose2d(cin, cout, 4, 1 if first else 2, 0 if first else 1,
                                         bias=False))
        if cout != 3:
            layers += [nn.BatchNorm2d(cout), nn.ReLU(True)]
    layers.append(nn.Tanh())
    model = nn.Sequential(*layers)
    rng = np.random.default_rng(0)
    z = lib.tensor(rng.standard_normal((BATCH, 100, 1, 1)).astype(dtype))
    target = lib.tensor(rng.uniform(-1, 1, (BATCH, 3, 64, 64)).astype(dtype))
    model = model.to(getattr(lib, dtype))
    opt = lib.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step() -> Any:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(z), target)
        loss.backward()
        opt.step()
        return loss

    return model, step


def _conv1d(lib: Any, dtype: str) -> Tuple[Any, Callable[[], Any]]:
    nn = lib.nn
    feats = nn.Sequential(
        nn.Conv1d(32, 64, 7, padding=3), nn.ReLU(),
        nn.Conv1d(64, 128, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(128, 128, 3, padding=1), nn.ReLU(),
    )
    head = nn.Linear(128, 10)
    model = nn.Sequential(feats, head).to(getattr(lib, dtype))
    rng = np.random.default_rng(1)
    x = lib.tensor(rng.standard_normal((BATCH, 32, 512)).astype(dtype))
    y = lib.tensor(rng.integers(0, 10, BATCH))
    opt = lib.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> Any:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(head(feats(x).mean(2)), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def _conv3d(lib: Any, dtype: str) -> Tuple[Any, Callable[[], Any]]:
    nn = lib.nn
    model = nn.Sequential(
        nn.Conv3d(16, 32, 3, padding=1), nn.ReLU(),
        nn.Conv3d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose3d(32, 16, 2, stride=2),
    ).to(getattr(lib, dtype))
    rng = np.random.default_rng(2)
    x = lib.tensor(rng.standard_normal((8, 16, 16, 16, 16)).astype(dtype))
    target = lib.tensor(rng.standard_normal((8, 16, 16, 16, 16)).astype(dtype))
    opt = lib.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> Any:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        return loss

    return model, step


WORKLOADS = {"dcgan": _dcgan, "conv1d": _conv1d, "conv3d": _conv3d}


def _time(step: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args(argv)
    torch, reason = _torch_or_reason()
    print(f"one thread, batch {BATCH} (conv3d: 8), {args.dtype}, median of {args.reps} alternating "
          f"repetitions (one step each, after one warm-up step)")
    if torch is None:
        print(f"torch rows skipped: {reason}")
    print(f"{'workload':<10} {'mpitensor s':>12} {'torch s':>10} {'torch/mpitensor':>16}")
    for name in args.only.split(","):
        _, ours = WORKLOADS[name](mt, args.dtype)
        theirs = WORKLOADS[name](torch, args.dtype)[1] if torch is not None else None
        ours()
        if theirs is not None:
            theirs()
        t_ours: List[float] = []
        t_theirs: List[float] = []
        for _ in range(args.reps):
            t_ours.append(_time(ours))
            if theirs is not None:
                t_theirs.append(_time(theirs))
        a = statistics.median(t_ours)
        if t_theirs:
            b = statistics.median(t_theirs)
            print(f"{name:<10} {a:>12.4f} {b:>10.4f} {b / a:>16.2f}", flush=True)
        else:
            print(f"{name:<10} {a:>12.4f} {'-':>10} {'-':>16}", flush=True)


if __name__ == "__main__":
    main()
