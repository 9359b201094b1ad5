"""Collectives on picklable Python objects (the torch.distributed docs examples).

``all_gather_object``, ``broadcast_object_list``, ``gather_object``, ``scatter_object_list``
and ``send_object_list``/``recv_object_list`` move any picklable object. They pickle, so they
are for metadata (configurations, metrics), not for tensors on a hot path. Rank r contributes
``OBJECTS[r % 4]`` where ``OBJECTS = ["foo", 12, {1: 2}, ("bar", 3.5)]``.

Launch::

    mpiexec -n 4 python examples/object_collectives.py

Expected output (lines of different ranks may interleave; works at any world size)::

    [all_gather_object] Rank r has data ['foo', 12, {1: 2}, ('bar', 3.5)]     # every rank
    [broadcast_object_list] Rank r has data ['foo', 12, {1: 2}]               # every rank
    [gather_object] Rank 0 has data ['foo', 12, {1: 2}, ('bar', 3.5)]
    [gather_object] Rank r has data None                                     # r > 0
    [scatter_object_list] Rank 0 has data ['foo']                            # rank r: [OBJECTS[r]]
    [scatter_object_list] Rank 2 has data [{1: 2}]
    [send_object_list] Rank 0 has data ['foo', 12, {1: 2}]                   # sent to rank 1
    [send_object_list] Rank 1 has data ['foo', 12, {1: 2}]                   # received
    [send_object_list] Rank r has data [None, None, None]                    # r > 1: idle

With one rank, the ``send_object_list`` line is left out (it needs a second rank).
"""

import sys
from typing import Any, List, Optional

import mpitensor.distributed as dist

OBJECTS = ["foo", 12, {1: 2}, ("bar", 3.5)]  # any picklable objects


def show(name: str, rank: int, data: Any) -> None:
    print(f"[{name}] Rank {rank} has data {data}", flush=True)


def main() -> None:
    # one write per line, so lines of different ranks never mix (even under PYTHONUNBUFFERED=1)
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = OBJECTS[rank % len(OBJECTS)]

    output: List[Any] = [None for _ in range(size)]
    dist.all_gather_object(output, mine)
    show("all_gather_object", rank, output)

    objects: List[Any] = ["foo", 12, {1: 2}] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objects, src=0)
    show("broadcast_object_list", rank, objects)

    gathered: Optional[List[Any]] = [None for _ in range(size)] if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    show("gather_object", rank, gathered)

    inputs = [OBJECTS[r % len(OBJECTS)] for r in range(size)] if rank == 0 else None
    output_list: List[Any] = [None]
    dist.scatter_object_list(output_list, inputs, src=0)
    show("scatter_object_list", rank, output_list)

    if size >= 2:
        if rank == 0:
            objects = ["foo", 12, {1: 2}]
            dist.send_object_list(objects, dst=1)
        else:
            objects = [None, None, None]
            if rank == 1:
                dist.recv_object_list(objects, src=0)
        show("send_object_list", rank, objects)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
