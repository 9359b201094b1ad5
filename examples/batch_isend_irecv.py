"""A ring shift with ``batch_isend_irecv`` (the torch.distributed docs example).

Every rank sends ``arange(2) + 2 * rank`` to its right neighbour and receives its left
neighbour's tensor, with both operations started together so the ring cannot deadlock.

Launch (needs at least 2 ranks: mpitensor refuses point-to-point messages to the sender itself)::

    mpiexec -n 4 python examples/batch_isend_irecv.py

Expected output (one line per rank, in any order)::

    Rank 0 has data tensor([6., 7.])
    Rank 1 has data tensor([0., 1.])
    Rank 2 has data tensor([2., 3.])
    Rank 3 has data tensor([4., 5.])

Rank r receives from rank (r - 1) mod N, i.e. ``tensor([2(r-1), 2(r-1) + 1])``. With one rank
it prints a one-line error and exits with code 2.
"""

import sys

import mpitensor as torch
import mpitensor.distributed as dist


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size < 2:
        if rank == 0:
            print(f"batch_isend_irecv.py needs at least 2 ranks, got {world_size}: "
                  "run `mpiexec -n 4 python examples/batch_isend_irecv.py`", file=sys.stderr,
                  flush=True)
        dist.destroy_process_group()
        sys.exit(2)
    send_tensor = torch.arange(2, dtype=torch.float32) + 2 * rank
    recv_tensor = torch.rand(2, dtype=torch.float32)  # overwritten by the receive
    send_op = dist.P2POp(dist.isend, send_tensor, (rank + 1) % world_size)
    recv_op = dist.P2POp(dist.irecv, recv_tensor, (rank - 1 + world_size) % world_size)
    reqs = dist.batch_isend_irecv([send_op, recv_op])
    for req in reqs:
        req.wait()
    print("Rank", rank, "has data", recv_tensor, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
