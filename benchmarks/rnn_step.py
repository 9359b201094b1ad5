"""Time a training step of recurrent models against torch, in the same run, at one thread.

Two workloads, each a full step (forward, loss, backward, SGD update):

- ``lm``: the word-level language model of torch's examples: embedding (vocabulary 10,000,
  256), a 2-layer LSTM (hidden 256), a linear decoder, cross-entropy, over a sequence of 35
  and a batch of 20;
- ``lstm``, ``gru``, ``rnn``: the recurrent layers alone (2 layers, hidden 256, input 256,
  sequence 35, batch 20), loss = the outputs' sum.

Both libraries run single-threaded (OpenBLAS/OMP/MKL threads = 1, ``torch.set_num_threads(1)``)
and alternate repetitions, so load from elsewhere hits both alike; the median of each is
reported with the ratio torch / mpitensor (the speed relative to torch: above 1.0, mpitensor
is faster). Without torch the torch columns are skipped with a note.

Usage:
    python benchmarks/rnn_step.py [--reps 15] [--only lm,lstm] [--dtype float32]
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

VOCAB, EMB, HID, LAYERS, SEQ, BATCH = 10_000, 256, 256, 2, 35, 20


def _torch_or_reason() -> Tuple[Optional[Any], str]:
    try:
        import torch  # noqa: PLC0415 - the baseline, imported after the thread settings
    except Exception as exc:  # ImportError, or a broken install
        return None, f"torch is not importable ({type(exc).__name__}: {exc})"
    torch.set_num_threads(1)
    return torch, ""


def _model(lib: Any, kind: str, dtype: str) -> Tuple[Any, Callable[[], Any]]:
    """A model and one training step of it, written once for both libraries."""
    nn = lib.nn
    rng = np.random.default_rng(0)
    dt = getattr(lib, dtype)
    if kind == "lm":
        emb, lstm, dec = nn.Embedding(VOCAB, EMB), nn.LSTM(EMB, HID, LAYERS), nn.Linear(HID, VOCAB)
        params = [*emb.parameters(), *lstm.parameters(), *dec.parameters()]
        for p in params:
            p.data = p.data.to(dt)
        tokens = lib.tensor(rng.integers(0, VOCAB, (SEQ, BATCH)))
        target = lib.tensor(rng.integers(0, VOCAB, (SEQ * BATCH,)))
        opt = lib.optim.SGD(params, lr=0.1)

        def step() -> Any:
            opt.zero_grad()
            out, _ = lstm(emb(tokens))
            loss = nn.functional.cross_entropy(dec(out).view(-1, VOCAB), target)
            loss.backward()
            opt.step()
            return loss
        return params, step
    layer = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind](EMB, HID, LAYERS)
    layer.to(dt)
    x = lib.tensor(rng.standard_normal((SEQ, BATCH, EMB)).astype(dtype))
    opt = lib.optim.SGD(layer.parameters(), lr=0.01)

    def step_layer() -> Any:
        opt.zero_grad()
        out, _ = layer(x)
        out.sum().backward()
        opt.step()
        return out
    return layer, step_layer


def _time_pair(fm: Callable[[], Any], ft: Optional[Callable[[], Any]], reps: int
               ) -> Tuple[float, Optional[float]]:
    for _ in range(2):  # warm-up: workspaces, BLAS buffers, first-call imports
        fm()
        if ft is not None:
            ft()
    ours: List[float] = []
    theirs: List[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fm()
        ours.append(time.perf_counter() - t0)
        if ft is not None:
            t0 = time.perf_counter()
            ft()
            theirs.append(time.perf_counter() - t0)
    return statistics.median(ours) * 1e3, (statistics.median(theirs) * 1e3 if theirs else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", default="lm,lstm,gru,rnn")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args()
    torch, why = _torch_or_reason()
    if torch is None:
        print(f"note: no torch rows: {why}")
    print(f"{'workload':10s} {'mpitensor ms':>13s} {'torch ms':>9s} {'speed vs torch':>15s}")
    for kind in args.only.split(","):
        _, fm = _model(mt, kind, args.dtype)
        ft = _model(torch, kind, args.dtype)[1] if torch is not None else None
        ours, theirs = _time_pair(fm, ft, args.reps)
        if theirs is None:
            print(f"{kind:10s} {ours:13.2f} {'-':>9s} {'-':>15s}")
        else:
            print(f"{kind:10s} {ours:13.2f} {theirs:9.2f} {theirs / ours:14.2f}x")


if __name__ == "__main__":
    main()
