"""Hello from every rank: the smallest mpitensor.distributed program.

Launch::

    mpiexec -n 4 python examples/hello.py
    python examples/hello.py                # a single rank works too

Expected output (one line per rank, in any order)::

    Hello from rank 0 of 4
    Hello from rank 1 of 4
    Hello from rank 2 of 4
    Hello from rank 3 of 4
"""

import sys

import mpitensor.distributed as dist


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")  # rank and world size come from mpiexec
    rank, size = dist.get_rank(), dist.get_world_size()
    print(f"Hello from rank {rank} of {size}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
