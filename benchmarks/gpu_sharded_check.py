"""DTensor redistribution and one ``fully_shard`` training step on CuPy, checked against NumPy.

Run (``benchmarks/gpu_suite.sh`` does, at 2 ranks on one GPU)::

    mpiexec -n 2 python benchmarks/gpu_sharded_check.py                 # CuPy (the default)
    mpiexec -n 2 python benchmarks/gpu_sharded_check.py --device cpu    # the same on NumPy

The tests of ``tests/mpi/test_dtensor.py`` and ``tests/mpi/test_fsdp.py`` build CPU meshes only;
this script runs the same machinery on a ``"cuda"`` mesh over the MPI backend (NCCL refuses two
ranks on one GPU) and compares every result with a NumPy computation of its own:

* a float32 matrix of uneven shape distributed as ``Shard(0)``, redistributed to ``Shard(1)``,
  to ``Replicate()`` and gathered; ``Partial()`` pieces (rank r holds (r + 1) X) summed into
  ``Replicate()``; every local piece must live on the mesh's device;
* a two-layer MLP given to ``fully_shard`` (each Linear and the root) trains ``--steps`` SGD
  steps on per-rank batches; its gathered weights must equal the NumPy MLP's trained on the
  same batches with the gradients averaged over ranks (the data-parallel mean FSDP computes).

Tolerance: float32 sums of at most 16 products per element per step, a few steps: relative
error a few hundred ulps at worst, so rtol 1e-5 (against the largest weight, as the ranks'
sums meet in another order in a reduce-scatter). Prints one ``KEY:`` line for the suite and
exits 1 (on every rank) when a check fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import numpy as np  # noqa: E402

RTOL = 1e-5
SHAPE = (7, 10)  # uneven over 2, 3 and 4 ranks on both dims
DIMS = (8, 16, 4)  # MLP: in, hidden, out
BATCH = 5


def _host(t: Any) -> np.ndarray:
    """A tensor's values as a NumPy array (copied off the GPU where they live there)."""
    return t.detach().cpu().numpy()


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))


def check_dtensor(mesh: Any, device: str, rank: int, n: int) -> Dict[str, float]:
    """Redistribute Shard(0) -> Shard(1) -> Replicate and Partial -> Replicate; the errors."""
    import mpitensor as mt
    from mpitensor.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    d = distribute_tensor(mt.tensor(x).to(device), mesh, [Shard(0)])
    cols = d.redistribute(mesh, [Shard(1)])
    rep = cols.redistribute(mesh, [Replicate()])
    for piece in (d, cols, rep):
        if piece.to_local().is_cuda != (device == "cuda"):
            raise AssertionError(f"rank {rank}: a local piece of {piece.placements} is not on "
                                 f"{device}")
    chunk = -(-SHAPE[1] // n)  # torch.chunk's rows: ceil(10 / n) each, the last ones shorter
    want_cols = x[:, rank * chunk:(rank + 1) * chunk]
    part = DTensor.from_local(mt.tensor(x * (rank + 1)).to(device), mesh, [Partial()])
    summed = part.redistribute(mesh, [Replicate()]).to_local()
    return {"shard(0)->shard(1) local": _rel_err(_host(cols.to_local()), want_cols),
            "shard(1)->replicate": _rel_err(_host(rep.to_local()), x),
            "full_tensor": _rel_err(_host(d.full_tensor()), x),
            "partial->replicate": _rel_err(_host(summed), x * (n * (n + 1) / 2))}


def _batch(step: int, rank: int) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * step + rank)
    return (rng.standard_normal((BATCH, DIMS[0])).astype(np.float32),
            rng.standard_normal((BATCH, DIMS[2])).astype(np.float32))


def numpy_mlp_steps(w: Dict[str, np.ndarray], steps: int, n: int,
                    lr: float) -> Dict[str, np.ndarray]:
    """SGD on Linear-ReLU-Linear with the mean-squared loss, gradients averaged over n ranks."""
    w = {k: v.astype(np.float32).copy() for k, v in w.items()}
    for s in range(steps):
        grads = {k: np.zeros_like(v) for k, v in w.items()}
        for r in range(n):
            x, y = _batch(s, r)
            h = x @ w["0.weight"].T + w["0.bias"]
            a = np.maximum(h, 0)
            out = a @ w["2.weight"].T + w["2.bias"]
            dout = 2 * (out - y) / out.size
            dh = (dout @ w["2.weight"]) * (h > 0)
            for k, g in (("2.weight", dout.T @ a), ("2.bias", dout.sum(0)),
                         ("0.weight", dh.T @ x), ("0.bias", dh.sum(0))):
                grads[k] += g / n
        for k in w:
            w[k] -= np.float32(lr) * grads[k]
    return w


def check_fully_shard(device: str, rank: int, n: int, steps: int, lr: float) -> Dict[str, float]:
    """Train the sharded MLP ``steps`` steps; the error of each gathered weight."""
    import mpitensor as mt
    import mpitensor.nn as nn
    from mpitensor.distributed.fsdp import fully_shard
    from mpitensor.distributed.tensor import DTensor
    from mpitensor.optim import SGD

    mt.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIMS[0], DIMS[1]), nn.ReLU(), nn.Linear(DIMS[1], DIMS[2]))
    start = {k: _host(v) for k, v in model.state_dict().items()}
    model = model.to(device)
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = SGD(model.parameters(), lr=lr)
    for s in range(steps):
        x, y = (mt.tensor(a).to(device) for a in _batch(s, rank))
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    want = numpy_mlp_steps(start, steps, n, lr)
    errs = {}
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        if local.is_cuda != (device == "cuda"):
            raise AssertionError(f"rank {rank}: the shard of {name} is not on {device}")
        full = p.full_tensor() if isinstance(p, DTensor) else p
        errs[f"fully_shard {name}"] = _rel_err(_host(full), want[name])
    return errs


def main(argv: List[str] = None) -> int:
    """Run both checks on every rank; rank 0 prints the errors and the ``KEY:`` line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    import mpitensor.distributed as dist
    from mpitensor.distributed.device_mesh import init_device_mesh

    if args.device == "cuda":
        from mpitensor.backend import cupy_unavailable_reason, get_cupy

        reason = cupy_unavailable_reason()
        if reason:
            print(f"gpu_sharded_check: --device cuda is unavailable: {reason}", file=sys.stderr)
            return 2
        cp = get_cupy()
        cp.cuda.Device(int(_local_rank()) % cp.cuda.runtime.getDeviceCount()).use()
    dist.init_process_group(backend="mpi")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(args.device, (n,))
    errs = check_dtensor(mesh, args.device, rank, n)
    errs.update(check_fully_shard(args.device, rank, n, args.steps, args.lr))
    worst = max(errs.values())
    every = [None] * n
    dist.all_gather_object(every, worst)
    ok = max(every) <= RTOL
    if rank == 0:
        for k, v in errs.items():
            print(f"{k:<28} max relative error {v:.2e}")
        verdict = "ok" if ok else f"FAILED (rtol {RTOL})"
        print(f"KEY: DTensor + fully_shard on {args.device}, {n} ranks: max rel err "
              f"{max(every):.1e} vs NumPy, {verdict}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


def _local_rank() -> int:
    """This rank's index on its node, from the launcher's variables (0 when run alone)."""
    import os

    for var in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK"):
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
