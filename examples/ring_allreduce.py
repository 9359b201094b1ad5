"""A hand-written ring all-reduce (the PyTorch tutorial's "Our Own Ring-Allreduce").

Each rank repeatedly sends a buffer to its right neighbour with ``isend`` and receives its left
neighbour's with ``recv``, accumulating what arrives; after N - 1 steps every rank holds the sum
of all ranks' tensors. The result is compared with the library's ``dist.all_reduce``.

Launch::

    mpiexec -n 4 python examples/ring_allreduce.py

Expected output (one line per rank, in any order; works at any world size)::

    Rank 0 has data tensor([10., 20.]) (dist.all_reduce: tensor([10., 20.]))
    Rank 1 has data tensor([10., 20.]) (dist.all_reduce: tensor([10., 20.]))
    Rank 2 has data tensor([10., 20.]) (dist.all_reduce: tensor([10., 20.]))
    Rank 3 has data tensor([10., 20.]) (dist.all_reduce: tensor([10., 20.]))

Rank r contributes ``(r + 1) * [1, 2]``, so the sum over N ranks is ``N(N+1)/2 * [1, 2]``.
"""

import sys

import mpitensor as torch
import mpitensor.distributed as dist


def allreduce(send: "torch.Tensor", recv: "torch.Tensor") -> None:
    """Implementation of a ring-reduce with addition (the tutorial's, unchanged)."""
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = send.clone()
    recv_buff = send.clone()
    accum = send.clone()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank = dist.get_rank()
    send = torch.tensor([1.0, 2.0]) * (rank + 1)
    recv = torch.zeros(2)
    allreduce(send, recv)
    reference = send.clone()
    dist.all_reduce(reference)
    print("Rank", rank, "has data", recv, f"(dist.all_reduce: {reference!s})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
