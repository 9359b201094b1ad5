"""Non-blocking point-to-point communication (the PyTorch tutorial's ``isend``/``irecv``).

Rank 0 starts sending an incremented tensor with ``dist.isend``, rank 1 starts receiving it with
``dist.irecv``; both then ``req.wait()`` before touching the tensor. Any further ranks take no
part and keep their zeros.

Launch (needs at least 2 ranks)::

    mpiexec -n 2 python examples/p2p_nonblocking.py

Expected output (in any order)::

    Rank 0 started sending
    Rank 1 started receiving
    Rank 0 has data tensor(1.)
    Rank 1 has data tensor(1.)

With ``-n 4``, ranks 2 and 3 also print ``Rank 2 has data tensor(0.)`` and
``Rank 3 has data tensor(0.)``. With one rank it prints a one-line error and exits with code 2.
"""

import sys

import mpitensor as torch
import mpitensor.distributed as dist


def run(rank: int, size: int) -> None:
    """The tutorial's non-blocking ``run``: start, then ``wait()`` before reading the tensor."""
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        req = dist.isend(tensor=tensor, dst=1)
        print("Rank 0 started sending", flush=True)
    elif rank == 1:
        # Receive tensor from process 0
        req = dist.irecv(tensor=tensor, src=0)
        print("Rank 1 started receiving", flush=True)
    if req is not None:
        req.wait()
    print("Rank", rank, "has data", tensor[0], flush=True)


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        if rank == 0:
            print(f"p2p_nonblocking.py needs at least 2 ranks, got {size}: "
                  "run `mpiexec -n 2 python examples/p2p_nonblocking.py`", file=sys.stderr,
                  flush=True)
        dist.destroy_process_group()
        sys.exit(2)
    run(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
