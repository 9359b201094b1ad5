"""The collectives tour: every operation of the PyTorch distributed tutorial in one run.

Each rank runs point-to-point send/recv, isend/irecv, broadcast, all_reduce (SUM and AVG),
reduce, scatter, gather, all_gather, reduce_scatter, all_to_all, a sub-group all_reduce and a
barrier, checks its own result against the value torch.distributed documents, and rank 0 prints
one table row per operation with every rank's result (gathered with ``gather_object``).

Launch::

    mpiexec -n 4 python examples/tour.py

Expected output (printed by rank 0; the other ranks print nothing)::

    mpitensor collectives tour: 4 ranks, backend mpi
    operation (input on rank r)  | rank 0     | rank 1     | rank 2      | rank 3      | check
    send/recv 0 -> 1             | 1          | 1          | 0           | 0           | ok
    isend/irecv 0 -> 1           | 2          | 2          | 0           | 0           | ok
    broadcast 42 from 0          | 42         | 42         | 42          | 42          | ok
    all_reduce SUM of 1          | 4          | 4          | 4           | 4           | ok
    all_reduce AVG of r          | 1.5        | 1.5        | 1.5         | 1.5         | ok
    reduce SUM of 1 to 0         | 4          | 1          | 1           | 1           | ok
    scatter 1..4 from 0          | 1          | 2          | 3           | 4           | ok
    gather r to 0                | [0 1 2 3]  | -          | -           | -           | ok
    all_gather r                 | [0 1 2 3]  | [0 1 2 3]  | [0 1 2 3]   | [0 1 2 3]   | ok
    reduce_scatter arange(8)     | [0 4]      | [8 12]     | [16 20]     | [24 28]     | ok
    all_to_all arange(4) + 4r    | [0 4 8 12] | [1 5 9 13] | [2 6 10 14] | [3 7 11 15] | ok
    new_group([0, 1]) all_reduce | 2          | 2          | 1           | 1           | ok
    barrier                      | ok         | ok         | ok          | ok          | ok
    all 13 operations agree with torch.distributed on every rank

Rows read "operation (input on rank r)": rank r starts with the input named there (``1`` is a
tensor of ones, ``r`` its own rank), and each column shows what that rank holds afterwards
(``-``: gather leaves non-destination ranks without a result). It works at any world size; with
one rank, the rows that need a second rank (point-to-point, the sub-group) are left out. If any
rank's result differs from the documented one, its row ends in ``MISMATCH`` and the program
exits with code 1.
"""

import sys
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

import mpitensor as torch
import mpitensor.distributed as dist

# One operation: it returns (what this rank holds after it, what torch documents it should be).
# ``None`` as a result means "this rank's output is not defined" (gather's non-destination).
Outcome = Tuple[Any, Any]


def _values(x: Any) -> Any:
    """Plain Python numbers/lists of a tensor, a list of tensors, or None."""
    if x is None:
        return None
    if isinstance(x, list):
        return [_values(t) for t in x]
    return np.asarray(x.tolist()).ravel().tolist()


def _fmt(v: Any) -> str:
    """Compact text of a value: ``4``, ``1.5``, ``[0 4 8 12]``; ``-`` for None."""
    if v is None:
        return "-"
    if isinstance(v, list):
        flat = np.asarray(v, dtype=np.float64).ravel()
        if flat.size == 1:
            return f"{flat[0]:g}"
        return "[" + " ".join(f"{x:g}" for x in flat) + "]"
    return f"{v:g}"


def op_send_recv(rank: int, size: int) -> Outcome:
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor, dst=1)
    elif rank == 1:
        dist.recv(tensor, src=0)
    return tensor, [1.0 if rank < 2 else 0.0]


def op_isend_irecv(rank: int, size: int) -> Outcome:
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 2
        req = dist.isend(tensor, dst=1)
    elif rank == 1:
        req = dist.irecv(tensor, src=0)
    if req is not None:
        req.wait()
    return tensor, [2.0 if rank < 2 else 0.0]


def op_broadcast(rank: int, size: int) -> Outcome:
    tensor = torch.tensor([42.0]) if rank == 0 else torch.zeros(1)
    dist.broadcast(tensor, src=0)
    return tensor, [42.0]


def op_all_reduce(rank: int, size: int) -> Outcome:
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor, [float(size)]


def op_all_reduce_avg(rank: int, size: int) -> Outcome:
    tensor = torch.tensor([float(rank)])
    dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    return tensor, [(size - 1) / 2]


def op_reduce(rank: int, size: int) -> Outcome:
    tensor = torch.ones(1)
    dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM)
    return tensor, [float(size) if rank == 0 else 1.0]


def op_scatter(rank: int, size: int) -> Outcome:
    tensor = torch.zeros(1)
    scatter_list = [torch.tensor([i + 1.0]) for i in range(size)] if rank == 0 else None
    dist.scatter(tensor, scatter_list, src=0)
    return tensor, [rank + 1.0]


def op_gather(rank: int, size: int) -> Outcome:
    tensor = torch.tensor([float(rank)])
    gather_list = [torch.zeros(1) for _ in range(size)] if rank == 0 else None
    dist.gather(tensor, gather_list, dst=0)
    if rank != 0:
        return None, None
    return torch.cat(gather_list), [float(r) for r in range(size)]


def op_all_gather(rank: int, size: int) -> Outcome:
    tensor = torch.tensor([float(rank)])
    tensor_list = [torch.zeros(1) for _ in range(size)]
    dist.all_gather(tensor_list, tensor)
    return torch.cat(tensor_list), [float(r) for r in range(size)]


def op_reduce_scatter(rank: int, size: int) -> Outcome:
    input_list = list(torch.arange(2 * size).chunk(size))
    output = torch.zeros(2, dtype=torch.int64)
    dist.reduce_scatter(output, input_list, op=dist.ReduceOp.SUM)
    return output, [size * 2 * rank, size * (2 * rank + 1)]


def op_all_to_all(rank: int, size: int) -> Outcome:
    input_list = list((torch.arange(size) + rank * size).chunk(size))
    output = torch.zeros(size, dtype=torch.int64)
    dist.all_to_all(list(output.chunk(size)), input_list)
    return output, [rank + j * size for j in range(size)]


def op_subgroup(rank: int, size: int) -> Outcome:
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    if dist.get_rank(group) >= 0:  # only members call the group's collectives
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor, [2.0 if rank < 2 else 1.0]


def op_barrier(rank: int, size: int) -> Outcome:
    dist.barrier()
    return "ok", "ok"


# (row label for world size n: the operation and its input, operation, smallest world size)
OPERATIONS: List[Tuple[Callable[[int], str], Callable[[int, int], Outcome], int]] = [
    (lambda n: "send/recv 0 -> 1", op_send_recv, 2),
    (lambda n: "isend/irecv 0 -> 1", op_isend_irecv, 2),
    (lambda n: "broadcast 42 from 0", op_broadcast, 1),
    (lambda n: "all_reduce SUM of 1", op_all_reduce, 1),
    (lambda n: "all_reduce AVG of r", op_all_reduce_avg, 1),
    (lambda n: "reduce SUM of 1 to 0", op_reduce, 1),
    (lambda n: f"scatter 1..{n} from 0", op_scatter, 1),
    (lambda n: "gather r to 0", op_gather, 1),
    (lambda n: "all_gather r", op_all_gather, 1),
    (lambda n: f"reduce_scatter arange({2 * n})", op_reduce_scatter, 1),
    (lambda n: f"all_to_all arange({n}) + {n}r", op_all_to_all, 1),
    (lambda n: "new_group([0, 1]) all_reduce", op_subgroup, 2),
    (lambda n: "barrier", op_barrier, 1),
]


def run(rank: int, size: int) -> List[Tuple[str, str, bool]]:
    """Run every operation this world size allows; return (label, result text, ok) per row."""
    rows = []
    for label_of, op, min_size in OPERATIONS:
        if size < min_size:
            continue
        label = label_of(size)
        got, want = op(rank, size)
        if isinstance(got, str):
            rows.append((label, got, got == want))
            continue
        values = _values(got)
        ok = (values is None and want is None) or (
            values is not None and want is not None and len(values) == len(want)
            and np.allclose(values, want))
        rows.append((label, _fmt(values), bool(ok)))
    return rows


def report(size: int, per_rank: List[List[Tuple[str, str, bool]]]) -> bool:
    """Print the table (rank 0); return True when every rank's every result is as documented."""
    header = ["operation (input on rank r)", *[f"rank {r}" for r in range(size)], "check"]
    table = []
    for i, (label, _, _) in enumerate(per_rank[0]):
        cells = [per_rank[r][i] for r in range(size)]
        ok = all(c[2] for c in cells)
        table.append([label, *[c[1] for c in cells], "ok" if ok else "MISMATCH"])
    widths = [max(len(row[k]) for row in [header, *table]) for k in range(len(header))]

    def line(row: List[str]) -> str:
        return " | ".join(f"{c:<{w}}" for c, w in zip(row, widths)).rstrip()

    ranks = f"{size} rank{'' if size == 1 else 's'}"
    print(f"mpitensor collectives tour: {ranks}, backend {dist.get_backend()}", flush=True)
    print(line(header), flush=True)
    for row in table:
        print(line(row), flush=True)
    bad = [row[0] for row in table if row[-1] != "ok"]
    if bad:
        print(f"MISMATCH in {len(bad)} of {len(table)} operations: {', '.join(bad)}", flush=True)
    else:
        print(f"all {len(table)} operations agree with torch.distributed on every rank",
              flush=True)
    return not bad


def main() -> None:
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = run(rank, size)
    gathered: Optional[List[Any]] = [None] * size if rank == 0 else None
    dist.gather_object(rows, gathered, dst=0)
    ok = report(size, gathered) if rank == 0 else True
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
