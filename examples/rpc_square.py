"""RPC, torch style: a caller (worker0) has a worker (worker1) square its tensors.

Launch::

    mpiexec -n 2 python examples/rpc_square.py

The program is written as for ``torch.distributed.rpc``; only the imports differ
(``import mpitensor as torch``, ``import mpitensor.distributed.rpc as rpc``). mpiexec starts
the processes, so there is no ``mp.spawn`` and no ``MASTER_ADDR``/``MASTER_PORT`` rendezvous:
``init_rpc`` takes rank and world size from MPI. Expected output (from worker0)::

    rpc_sync:  tensor([0., 1., 4., 9.])
    rpc_async: tensor([ 0.,  1., 16., 81.])
    remote:    tensor([ 4.,  9., 16.]) (owner worker1)
    running total on worker1: 20.0
"""

import sys

import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.distributed.rpc as rpc


def square(t):
    """Runs on worker1: the caller's tensor arrives, its square goes back."""
    return t * t


class RunningTotal:
    """An object that lives on worker1; worker0 drives it through an RRef."""

    def __init__(self):
        self.total = 0.0

    def add(self, t):
        self.total += float(t.sum())
        return self.total


def caller():
    x = torch.arange(4.0)
    y = rpc.rpc_sync("worker1", square, args=(x,))  # blocks until worker1 answers
    print(f"rpc_sync:  {y}")
    fut = rpc.rpc_async("worker1", square, args=(y,))  # returns at once
    print(f"rpc_async: {fut.wait()}")
    rref = rpc.remote("worker1", square, args=(torch.tensor([2.0, 3.0, 4.0]),))
    print(f"remote:    {rref.to_here()} (owner {rref.owner_name()})")
    total = rpc.remote("worker1", RunningTotal)  # the object stays on worker1
    for t in (x, y):
        total.rpc_sync().add(t)  # runs RunningTotal.add there
    print(f"running total on worker1: {total.rpc_sync().add(torch.zeros(1))}")


def main():
    sys.stdout.reconfigure(line_buffering=True)
    rank = dist.launcher_rank()  # from mpiexec's environment (0 under a plain `python`)
    rpc.init_rpc(f"worker{rank}")  # rank and world size come from MPI
    status = 0
    try:
        if rank == 0:
            try:
                rpc.get_worker_info("worker1")
            except ValueError:
                print("run on two ranks: mpiexec -n 2 python examples/rpc_square.py",
                      file=sys.stderr)
                status = 2
            else:
                caller()
        # the other workers only serve: shutdown() returns once worker0 is done with them
    finally:
        rpc.shutdown()
    sys.exit(status)


if __name__ == "__main__":
    main()
