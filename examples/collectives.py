"""Every collective of the PyTorch tutorial and the torch.distributed docs, one per subcommand.

Each ``do_<name>`` function is the tutorial's (or the torch docs') snippet with mpitensor imports;
each rank prints one line ``[<name>] Rank <r> has data <value>``. The values below are for 4
ranks; every collective works at any world size N (the comments give the rule).

Launch::

    mpiexec -n 4 python examples/collectives.py                 # all of them, in this order
    mpiexec -n 4 python examples/collectives.py scatter gather  # only some
    mpiexec -n 4 python examples/collectives.py --async-op      # async_op=True + work.wait()

Expected output (lines of different ranks and collectives may interleave)::

    [broadcast] Rank r has data tensor(42.)                    # every rank: rank 0's value
    [all_reduce] Rank r has data tensor(4.)                    # every rank: N
    [reduce] Rank 0 has data tensor(4.)                        # N on dst=0
    [reduce] Rank r has data tensor(1.)                        # r > 0: unchanged
    [scatter] Rank r has data tensor(r+1.)                     # e.g. rank 2: tensor(3.)
    [gather] Rank 0 has data [tensor([0.]), tensor([1.]), tensor([2.]), tensor([3.])]
    [gather] Rank r sent tensor([r.])                          # r > 0
    [all_gather] Rank r has data [tensor([0.]), tensor([1.]), tensor([2.]), tensor([3.])]
    [reduce_scatter] Rank 0 has data tensor([0, 4])            # N * [2r, 2r+1]
    [reduce_scatter] Rank 1 has data tensor([ 8, 12])
    [all_to_all] Rank 0 has data [tensor([0]), tensor([4]), tensor([8]), tensor([12])]
    [all_to_all] Rank 1 has data [tensor([1]), tensor([5]), tensor([9]), tensor([13])]
    [all_gather_into_tensor] Rank r has data tensor([1, 2, 3, 4, 5, 6, 7, 8])
    [reduce_scatter_tensor] Rank 1 has data tensor([ 8, 12])   # N * [2r, 2r+1]
    [all_to_all_single] Rank 0 has data tensor([ 0,  4,  8, 12])

(``[r.]`` stands for the rank as a float, e.g. ``tensor([2.])``; exact lines for every world
size are in ``tests/test_examples.py``.)
"""

import argparse
import sys
from typing import Any, Callable, Dict, Optional

import mpitensor as torch
import mpitensor.distributed as dist

ASYNC = False  # set by --async-op: run every collective with async_op=True, then wait()


def _wait(work: Optional[Any]) -> None:
    if work is not None:
        work.wait()


def show(name: str, rank: int, data: Any, verb: str = "has data") -> None:
    print(f"[{name}] Rank {rank} {verb}", data, flush=True)


def do_broadcast(rank: int, size: int) -> None:
    """Rank 0's tensor is copied to every rank."""
    if rank == 0:
        tensor = torch.tensor([42.0])
    else:
        tensor = torch.zeros(1)
    _wait(dist.broadcast(tensor, src=0, async_op=ASYNC))
    show("broadcast", rank, tensor[0])


def do_all_reduce(rank: int, size: int) -> None:
    """The tutorial's all-reduce: ones summed over all ranks, everywhere (= world size)."""
    group = dist.new_group(list(range(size)))
    tensor = torch.ones(1)
    _wait(dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=ASYNC))
    show("all_reduce", rank, tensor[0])


def do_reduce(rank: int, size: int) -> None:
    """Ones summed into rank 0; the other ranks keep their input."""
    tensor = torch.ones(1)
    _wait(dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM, async_op=ASYNC))
    show("reduce", rank, tensor[0])


def do_scatter(rank: int, size: int) -> None:
    """Rank 0 scatters [1, 2, ..., N]: rank r receives r + 1."""
    tensor = torch.zeros(1)
    if rank == 0:
        tensor_list = [torch.tensor([i + 1], dtype=torch.float32) for i in range(size)]
        work = dist.scatter(tensor, scatter_list=tensor_list, src=0, async_op=ASYNC)
    else:
        work = dist.scatter(tensor, scatter_list=[], src=0, async_op=ASYNC)
    _wait(work)
    show("scatter", rank, tensor[0])


def do_gather(rank: int, size: int) -> None:
    """Every rank sends its rank; rank 0 collects them in order."""
    tensor = torch.tensor([rank], dtype=torch.float32)
    if rank == 0:
        gather_list = [torch.zeros(1) for _ in range(size)]
        _wait(dist.gather(tensor, gather_list=gather_list, dst=0, async_op=ASYNC))
        show("gather", rank, gather_list)
    else:
        _wait(dist.gather(tensor, gather_list=[], dst=0, async_op=ASYNC))
        show("gather", rank, tensor, verb="sent")


def do_all_gather(rank: int, size: int) -> None:
    """Every rank sends its rank; every rank collects all of them."""
    tensor = torch.tensor([rank], dtype=torch.float32)
    tensor_list = [torch.zeros(1) for _ in range(size)]
    _wait(dist.all_gather(tensor_list, tensor, async_op=ASYNC))
    show("all_gather", rank, tensor_list)


def do_reduce_scatter(rank: int, size: int) -> None:
    """Each rank offers arange(2N) in N pieces; rank r gets the sum of pieces r: N*[2r, 2r+1]."""
    input_list = [torch.arange(2 * j, 2 * j + 2) for j in range(size)]
    output = torch.zeros(2, dtype=torch.int64)
    _wait(dist.reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, async_op=ASYNC))
    show("reduce_scatter", rank, output)


def do_all_to_all(rank: int, size: int) -> None:
    """The torch docs example: rank r sends arange(N) + r*N, one element to each rank."""
    input = torch.arange(size) + rank * size
    input = list(input.chunk(size))
    output = list(torch.zeros([size], dtype=torch.int64).chunk(size))
    _wait(dist.all_to_all(output, input, async_op=ASYNC))
    show("all_to_all", rank, output)


def do_all_gather_into_tensor(rank: int, size: int) -> None:
    """The torch docs example: [1, 2] + 2r from every rank, concatenated: [1, 2, ..., 2N]."""
    tensor_in = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank
    tensor_out = torch.zeros(size * 2, dtype=torch.int64)
    _wait(dist.all_gather_into_tensor(tensor_out, tensor_in, async_op=ASYNC))
    show("all_gather_into_tensor", rank, tensor_out)


def do_reduce_scatter_tensor(rank: int, size: int) -> None:
    """The torch docs example: arange(2N) summed over ranks; rank r gets N*[2r, 2r+1]."""
    tensor_out = torch.zeros(2, dtype=torch.int64)
    tensor_in = torch.arange(size * 2, dtype=torch.int64)
    _wait(dist.reduce_scatter_tensor(tensor_out, tensor_in, async_op=ASYNC))
    show("reduce_scatter_tensor", rank, tensor_out)


def do_all_to_all_single(rank: int, size: int) -> None:
    """The torch docs example: like all_to_all on single tensors: rank r gets [r, r+N, ...]."""
    input = torch.arange(size) + rank * size
    output = torch.zeros([size], dtype=torch.int64)
    _wait(dist.all_to_all_single(output, input, async_op=ASYNC))
    show("all_to_all_single", rank, output)


COLLECTIVES: Dict[str, Callable[[int, int], None]] = {
    "broadcast": do_broadcast,
    "all_reduce": do_all_reduce,
    "reduce": do_reduce,
    "scatter": do_scatter,
    "gather": do_gather,
    "all_gather": do_all_gather,
    "reduce_scatter": do_reduce_scatter,
    "all_to_all": do_all_to_all,
    "all_gather_into_tensor": do_all_gather_into_tensor,
    "reduce_scatter_tensor": do_reduce_scatter_tensor,
    "all_to_all_single": do_all_to_all_single,
}


def main(argv: Optional[list] = None) -> None:
    global ASYNC
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="COLLECTIVE", default=list(COLLECTIVES),
                        help=f"which to run (default: all): {', '.join(COLLECTIVES)}")
    parser.add_argument("--async-op", action="store_true",
                        help="call each collective with async_op=True and wait() on its work")
    args = parser.parse_args(argv)
    ASYNC = args.async_op
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    unknown = [n for n in args.names if n not in COLLECTIVES]
    if unknown:  # every rank sees the same arguments, so every rank exits the same way
        if rank == 0:
            print(f"collectives.py: unknown collective(s) {', '.join(unknown)}; choose from "
                  f"{', '.join(COLLECTIVES)}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        sys.exit(2)
    for name in args.names:
        COLLECTIVES[name](rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
