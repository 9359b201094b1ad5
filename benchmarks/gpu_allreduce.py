"""all_reduce bandwidth on GPUs: mpitensor's NCCL backend against torch's NCCL, in one run.

Run (``benchmarks/gpu_suite.sh`` does, one rank per GPU)::

    mpiexec -n 1 python benchmarks/gpu_allreduce.py                     # 1 MiB .. 1 GiB
    mpiexec -n 2 python benchmarks/gpu_allreduce.py --max-bytes 16M --device cpu   # MPI vs gloo

Both libraries go through ``mpitensor.distributed.bench`` (warm-up, batches sized to
``--rep-time``, the median of ``--reps`` repetitions of the slowest rank, back to back), size by
size and alternating which library goes first, on float32 buffers on the rank's GPU: CuPy
arrays wrapped in ``mpitensor.Tensor`` for mpitensor, ``torch.cuda`` tensors for torch. torch
joins through a TCP rendezvous on 127.0.0.1 (rank and size from MPI); its rows are left out,
with the reason, where torch or its CUDA is missing.

busbw = algbw x 2(n-1)/n as nccl-tests defines it: on one GPU it is 0 by definition (nothing
crosses a link); the algbw column then shows what one in-place all_reduce costs on the device.
``--device cpu`` runs the same comparison on host memory (mpitensor's MPI backend against torch's
gloo), to try the script on a machine without a GPU. Prints a table, one ``KEY:`` line, and with
``--md`` writes the table as markdown.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)  # run from a checkout without installing

import mpitensor  # noqa: F401, E402 - first: MPI starts with mpitensor's settings

# isort: split
from mpi4py import MPI  # noqa: E402

from mpitensor.distributed import bench as B  # noqa: E402


class TorchApi(B.Api):
    """torch.distributed (NCCL on CUDA, gloo on the CPU) on float32 torch tensors."""

    def __init__(self, device: str) -> None:
        import torch
        import torch.distributed as tdist

        self.torch, self.tdist = torch, tdist
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" \
            else torch.device("cpu")
        self.name = "torch-nccl" if device == "cuda" else "torch-gloo"

    def alloc(self, count: int) -> Any:
        return self.torch.zeros(count, dtype=self.torch.float32, device=self.device)

    def all_reduce(self, buf: Any) -> Callable[[], Any]:
        return functools.partial(self.tdist.all_reduce, buf)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def torch_reason(device: str) -> str:
    """'' when torch can run its side here, else why not."""
    try:
        import torch
        import torch.distributed as tdist
    except Exception as exc:
        return f"torch is not importable ({type(exc).__name__}: {exc})"
    if device == "cuda":
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        if not tdist.is_nccl_available():
            return "this torch build has no NCCL"
    elif not tdist.is_gloo_available():
        return "this torch build has no gloo"
    return ""


def start_torch(comm: Any, device: str, local: int) -> Optional[TorchApi]:
    """Join torch's process group (every rank agrees whether it can); None where it cannot."""
    from _torch_baseline import free_port

    reasons = comm.allgather(torch_reason(device))
    if any(reasons):
        if comm.Get_rank() == 0:
            print(f"# torch rows skipped: {next(r for r in reasons if r)}")
        return None
    import torch
    import torch.distributed as tdist

    if device == "cuda":
        torch.cuda.set_device(local % torch.cuda.device_count())
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None, root=0)
    tdist.init_process_group("nccl" if device == "cuda" else "gloo",
                             init_method=f"tcp://127.0.0.1:{port}",
                             rank=comm.Get_rank(), world_size=comm.Get_size())
    return TorchApi(device)


def sweep(apis: List[B.Api], comm: Any, sizes: List[int], reps: int,
          rep_time: float) -> List[Dict[str, Any]]:
    """Every size for every library, the library order rotating size by size."""
    rank, n = comm.Get_rank(), comm.Get_size()
    rows = []
    for i, size in enumerate(sizes):
        for api in apis[i % len(apis):] + apis[:i % len(apis)]:
            case = B.make_case(api, "all_reduce", size, rank, n, 4)
            seconds, iters, _ = B.measure(case.fn, comm, "back-to-back", reps, case.nbytes,
                                          rep_time=rep_time, sync=api.sync)
            rows.append(B.row_for("all_reduce", "back-to-back", size, case, seconds, iters,
                                  reps, n, impl=api.name))
            del case
    return rows


def table(rows: List[Dict[str, Any]], names: List[str]) -> str:
    """Markdown: per size, each library's latency, algbw and busbw, and the time ratio."""
    head = ["size"] + [f"{k} {nm}" for nm in names for k in ("µs", "algbw GB/s", "busbw GB/s")]
    if len(names) > 1:
        head.append(f"time {names[0]} / {names[1]}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(r["impl"], r["size"]): r for r in rows}
    for size in sorted({r["size"] for r in rows}):
        got = [by[(nm, size)] for nm in names]
        cells = [B.format_size(size)]
        for r in got:
            cells += [f"{r['latency_us']:,.1f}", f"{r['algbw_GBps']:.1f}", f"{r['busbw_GBps']:.1f}"]
        if len(got) > 1:
            cells.append(f"{got[0]['latency_us'] / got[1]['latency_us']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the sweep; rank 0 prints the table and the ``KEY:`` line (and writes ``--md``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--min-bytes", type=B.parse_size, default=1 << 20)
    p.add_argument("--max-bytes", type=B.parse_size, default=1 << 30)
    p.add_argument("--factor", type=int, choices=(2, 4), default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rep-time", type=float, default=0.05)
    p.add_argument("--md", default=None, help="write the table (markdown) here")
    args = p.parse_args(argv)
    if not 1 <= args.min_bytes <= args.max_bytes:
        p.error(f"need 1 <= --min-bytes <= --max-bytes, got {args.min_bytes} and "
                f"{args.max_bytes}")
    if args.reps < 1:
        p.error(f"--reps must be at least 1, got {args.reps}")
    comm = MPI.COMM_WORLD.Dup()
    rank, n = comm.Get_rank(), comm.Get_size()
    local = int(comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank())
    import mpitensor.distributed as dist

    backend = "mpi"
    if args.device == "cuda":
        from mpitensor.backend import cupy_unavailable_reason, get_cupy, nccl_unavailable_reason

        reason = cupy_unavailable_reason() or nccl_unavailable_reason()
        if reason:
            print(f"gpu_allreduce: NCCL on CuPy is unavailable: {reason}", file=sys.stderr)
            return 2
        cp = get_cupy()
        cp.cuda.Device(local % cp.cuda.runtime.getDeviceCount()).use()
        backend = "nccl"
    dist.init_process_group(backend=backend)
    apis: List[B.Api] = [B.MpitensorApi("float32", "tensor", args.device)]
    torch_api = start_torch(comm, args.device, local)
    if torch_api is not None:
        apis.append(torch_api)
    names = [a.name for a in apis]
    rows = sweep(apis, comm, B.sweep_sizes(args.min_bytes, args.max_bytes, args.factor),
                 args.reps, args.rep_time)
    if rank == 0:
        md = table(rows, names)
        print(f"# all_reduce float32, {n} rank(s), {args.device}, mpitensor backend {backend}"
              + ("; busbw is 0 on one rank (nccl-tests' 2(n-1)/n)" if n == 1 else ""))
        print(md)
        if args.md:
            Path(args.md).write_text(md + "\n")
        big = {r["impl"]: r for r in rows if r["size"] == max(x["size"] for x in rows)}
        figs = ", ".join(f"{nm} {big[nm]['algbw_GBps']:.1f} GB/s algbw "
                         f"{big[nm]['busbw_GBps']:.1f} busbw" for nm in names)
        print(f"KEY: all_reduce {B.format_size(max(big[names[0]]['size'], 1))} on {n} rank(s): "
              f"{figs}", flush=True)
    comm.Barrier()
    if torch_api is not None:
        torch_api.tdist.destroy_process_group()
    dist.destroy_process_group()
    comm.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
