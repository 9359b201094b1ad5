"""Blocking point-to-point communication (the PyTorch tutorial's first ``run``).

Rank 0 increments a zero tensor and sends it to rank 1 with ``dist.send``; rank 1 blocks in
``dist.recv`` until it arrives. Any further ranks take no part and keep their zeros. As in the
tutorial, this program asks for ``backend="gloo"``: mpitensor accepts it as an alias of its MPI
path, so torch programs written for gloo run unchanged.

Launch (needs at least 2 ranks)::

    mpiexec -n 2 python examples/p2p_blocking.py

Expected output (one line per rank, in any order)::

    Rank 0 has data tensor(1.)
    Rank 1 has data tensor(1.)

With ``-n 4``, ranks 2 and 3 are idle and print ``Rank 2 has data tensor(0.)`` and
``Rank 3 has data tensor(0.)``. With one rank it prints a one-line error and exits with code 2.
Rank 0 may also log mpitensor's one-time notice that ``gloo`` runs on the MPI path (stderr).
"""

import sys

import mpitensor as torch
import mpitensor.distributed as dist


def run(rank: int, size: int) -> None:
    """The tutorial's blocking point-to-point ``run``."""
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        dist.send(tensor=tensor, dst=1)
    elif rank == 1:
        # Receive tensor from process 0
        dist.recv(tensor=tensor, src=0)
    print("Rank", rank, "has data", tensor[0], flush=True)


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="gloo")  # the tutorial's backend: an alias of "mpi" here
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        if rank == 0:
            print(f"p2p_blocking.py needs at least 2 ranks, got {size}: "
                  "run `mpiexec -n 2 python examples/p2p_blocking.py`", file=sys.stderr,
                  flush=True)
        dist.destroy_process_group()
        sys.exit(2)
    run(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
