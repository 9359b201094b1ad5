"""All-reduce inside a sub-group (the PyTorch tutorial's ``new_group`` example).

``dist.new_group([0, 1])`` makes a group of ranks 0 and 1; an all-reduce of ones in that group
gives 2 on its members, while the other ranks, which are not members, keep their 1. Every rank
calls ``new_group`` (as torch requires); only members call the collective.

Launch (needs at least 2 ranks)::

    mpiexec -n 4 python examples/subgroup_allreduce.py

Expected output (one line per rank, in any order)::

    Rank 0 has data tensor(2.)
    Rank 1 has data tensor(2.)
    Rank 2 has data tensor(1.)
    Rank 3 has data tensor(1.)

With one rank it prints a one-line error and exits with code 2.
"""

import sys

import mpitensor as torch
import mpitensor.distributed as dist


def run(rank: int, size: int) -> None:
    """The tutorial's group all-reduce."""
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    # torch lets non-members call and silently skip; mpitensor raises for them, so guard
    if dist.get_rank(group) >= 0:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    print("Rank", rank, "has data", tensor[0], flush=True)


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        if rank == 0:
            print(f"subgroup_allreduce.py needs at least 2 ranks, got {size}: "
                  "run `mpiexec -n 4 python examples/subgroup_allreduce.py`", file=sys.stderr,
                  flush=True)
        dist.destroy_process_group()
        sys.exit(2)
    run(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
