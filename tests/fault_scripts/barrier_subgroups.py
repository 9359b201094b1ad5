"""monitored_barrier, new_subgroups, new_subgroups_by_enumeration, get_node_local_rank and
is_torchelastic_launched, as a torch program uses them (run by tests/test_distributed_helpers.py
under mpiexec -n 4). ``late``: rank 2 arrives 6 s after a 2 s monitored_barrier."""
import datetime
import sys
import time

import mpitensor as torch
import mpitensor.distributed as dist

dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=20))
r = dist.get_rank()
print(f"rank {r} local {dist.get_node_local_rank()} elastic {dist.is_torchelastic_launched()}",
      flush=True)
dist.monitored_barrier()
mine, groups = dist.new_subgroups(2)
t = torch.ones(1) * r
dist.all_reduce(t, group=mine)
print(f"rank {r} pairs {int(t.item())} of {len(groups)}", flush=True)
mine, groups = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
t = torch.ones(1) * r
dist.all_reduce(t, group=mine)
print(f"rank {r} enumerated {int(t.item())} ranks {dist.get_process_group_ranks(mine)}",
      flush=True)
for bad in (3, 0, 8):
    try:
        dist.new_subgroups(bad)
    except ValueError as exc:
        print(f"rank {r} new_subgroups({bad}) ValueError: {exc}", flush=True)
try:
    dist.new_subgroups_by_enumeration([[0, 1], [1, 2]])
except ValueError as exc:
    print(f"rank {r} overlap ValueError: {exc}", flush=True)
if sys.argv[1:] == ["late"]:
    if r == 2:
        time.sleep(6)
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=True)
        print(f"rank {r} passed", flush=True)
    except Exception as exc:
        print(f"rank {r} raised {type(exc).__name__}: {exc}", flush=True)
dist.destroy_process_group()
