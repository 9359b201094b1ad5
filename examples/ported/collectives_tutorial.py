"""A walk through torch.distributed's point-to-point calls and collectives, each one checked.

Every step prints what each rank holds afterwards and raises if the value is not the one the
collective promises, so a clean exit means every result was right on every rank.

    mpiexec -n 2 python examples/ported/collectives_tutorial.py
    mpiexec -n 3 python examples/ported/collectives_tutorial.py
    USE_MPITENSOR=0 mpiexec -n 3 python examples/ported/collectives_tutorial.py   # real torch, gloo

Under real torch the MPI launcher's PMI_RANK/PMI_SIZE become torch's RANK/WORLD_SIZE and the
rendezvous is ``env://`` at MASTER_ADDR:MASTER_PORT (127.0.0.1:29500 unless set).
"""
import os

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.distributed as dist
else:
    import torch
    import torch.distributed as dist


def init_from_launcher(backend="gloo"):
    """torchrun sets RANK/WORLD_SIZE; mpiexec (hydra) sets PMI_RANK/PMI_SIZE: accept both."""
    if "RANK" not in os.environ:
        os.environ["RANK"] = os.environ.get("PMI_RANK", "0")
        os.environ["WORLD_SIZE"] = os.environ.get("PMI_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend, init_method="env://")


def check(name, got, want):
    if not torch.equal(got, want):
        raise AssertionError(f"rank {dist.get_rank()}: {name} gave {got}, expected {want}")
    # one line per result, so that lines of different ranks cannot interleave inside it
    print(f"rank {dist.get_rank()} {name}: {' '.join(str(got).split())}", flush=True)


def point_to_point(rank, size):
    # blocking: rank 0 sends a different tensor to every other rank
    t = torch.zeros(3)
    if rank == 0:
        for dst in range(1, size):
            dist.send(torch.arange(3, dtype=torch.float32) + 10 * dst, dst=dst)
        t += 1
        check("send", t, torch.ones(3))
    else:
        dist.recv(t, src=0)
        check("recv", t, torch.arange(3, dtype=torch.float32) + 10 * rank)

    # non-blocking: a ring, every rank sends right and receives from the left
    right, left = (rank + 1) % size, (rank - 1) % size
    out = torch.full((2,), float(rank))
    inbox = torch.empty(2)
    reqs = [dist.isend(out, dst=right), dist.irecv(inbox, src=left)]
    for req in reqs:
        req.wait()
    check("isend/irecv ring", inbox, torch.full((2,), float(left)))


def collectives(rank, size):
    ranks = torch.arange(size, dtype=torch.float32)

    t = torch.tensor([rank + 1.0, 2.0 * rank])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    check("all_reduce SUM", t, torch.stack([(ranks + 1).sum(), (2 * ranks).sum()]))

    t = torch.tensor([float(rank), float(-rank)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce MAX", t, torch.tensor([size - 1.0, 0.0]))

    t = torch.arange(4) if rank == 0 else torch.zeros(4, dtype=torch.int64)
    dist.broadcast(t, src=0)
    check("broadcast", t, torch.arange(4))

    t = torch.ones(2) * (rank + 1)
    dist.reduce(t, dst=size - 1, op=dist.ReduceOp.SUM)
    if rank == size - 1:  # only the destination's result is defined
        check("reduce", t, torch.full((2,), size * (size + 1) / 2))

    mine = torch.tensor([rank, rank * rank])
    gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(gathered, mine)
    check("all_gather", torch.stack(gathered),
          torch.stack([torch.tensor([r, r * r]) for r in range(size)]))

    gather_list = [torch.zeros(1) for _ in range(size)] if rank == 0 else None
    dist.gather(torch.tensor([rank * 1.5]), gather_list=gather_list, dst=0)
    if rank == 0:
        check("gather", torch.cat(gather_list), ranks * 1.5)

    piece = torch.zeros(2)
    scatter_list = [torch.full((2,), 100.0 + r) for r in range(size)] if rank == 0 else None
    dist.scatter(piece, scatter_list=scatter_list, src=0)
    check("scatter", piece, torch.full((2,), 100.0 + rank))


def exchanges(rank, size):
    # all_to_all_single: rank r sends element j of its input to rank j
    sent = torch.arange(size, dtype=torch.float32) + 10 * rank
    received = torch.empty(size)
    dist.all_to_all_single(received, sent)
    check("all_to_all_single", received, 10 * torch.arange(size, dtype=torch.float32) + rank)

    # reduce_scatter: the sum over ranks of chunk r ends up on rank r
    inputs = [torch.full((2,), float(rank * size + r)) for r in range(size)]
    out = torch.zeros(2)
    dist.reduce_scatter(out, inputs, op=dist.ReduceOp.SUM)
    want = float(sum(q * size + rank for q in range(size)))
    check("reduce_scatter", out, torch.full((2,), want))

    # all_to_all with a list of tensors per peer
    outs = [torch.full((1,), float(rank * 10 + r)) for r in range(size)]
    ins = [torch.empty(1) for _ in range(size)]
    dist.all_to_all(ins, outs)
    check("all_to_all", torch.cat(ins),
          10 * torch.arange(size, dtype=torch.float32) + rank)


def subgroup(rank, size):
    group = dist.new_group([0, 1])  # every rank must call new_group, members or not
    t = torch.ones(1) * (rank + 1)
    if rank in (0, 1):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        check("new_group([0, 1]) all_reduce", t, torch.tensor([3.0]))
    else:
        check("outside new_group([0, 1])", t, torch.tensor([rank + 1.0]))


def main():
    init_from_launcher()
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        raise SystemExit("run with at least two ranks: mpiexec -n 2 python " + __file__)
    point_to_point(rank, size)
    dist.barrier()
    collectives(rank, size)
    dist.barrier()
    exchanges(rank, size)
    subgroup(rank, size)
    dist.barrier()
    print(f"rank {rank} all checks passed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
