"""``init_process_group(world_size=k, rank=r)`` by k processes of a larger job: RPC runs over
all N processes of one ``mpiexec -n 4`` job, and a few of them form the default group of their
own at an address of their own. Every rank of the job prints what it saw; the test checks
each. The bad calls: a rank claimed twice (``ValueError`` on every caller), a world size that
never fills (``DistStoreError`` naming the rank that did not come, within the timeout), a rank
outside ``0..k-1`` (``ValueError`` before any traffic)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict

from .launch import find_mpiexec, run_job
from .test_programs_rpc import free_ports

SCRIPT = r'''
import datetime, json, sys
import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.distributed.rpc as rpc
from mpi4py import MPI

me = MPI.COMM_WORLD.Get_rank()
ports = [int(p) for p in sys.argv[1:]]
out = {"me": me}


def url(i):
    return f"tcp://127.0.0.1:{ports[i]}"


def attempt(key, **kw):
    try:
        dist.init_process_group("gloo", **kw)
        out[key] = "joined"
        dist.destroy_process_group()
    except Exception as exc:
        out[key] = [type(exc).__name__, isinstance(exc, ValueError),
                    isinstance(exc, dist.DistStoreError), str(exc)]


rpc.init_rpc(f"w{me}", rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
    num_worker_threads=4))
# job ranks 3 and 1 are the group's ranks 0 and 1 (the order the callers give, not MPI's)
if me in (3, 1):
    dist.init_process_group("gloo", rank=(3 - me) // 2, world_size=2, init_method=url(0))
    t = torch.tensor([float(me + 1)], dtype=torch.float64)
    dist.all_reduce(t)
    got = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(got, torch.tensor([float(me)]))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    model(torch.full((3, 2), float(me))).sum().backward()
    out.update(rank=dist.get_rank(), size=dist.get_world_size(), sum=t.item(),
               gathered=[g.item() for g in got], grad=model.module.weight.grad.tolist())
    dist.destroy_process_group()
out["rpc"] = rpc.rpc_sync(f"w{(me + 1) % 4}", torch.add, args=(torch.ones(1), me)).item()
# one rank claimed twice: job ranks 1 and 2 both say rank 1 of 3
if me < 3:
    attempt("twice", rank=min(me, 1), world_size=3, init_method=url(1))
# a group of 3 that only 2 join: both time out naming rank 2
if me < 2:
    attempt("short", rank=me, world_size=3, init_method=url(2),
            timeout=datetime.timedelta(seconds=3))
if me == 3:
    attempt("range", rank=2, world_size=2, init_method=url(3))
    attempt("no_rank", world_size=2, init_method=url(3))
print("RESULT " + json.dumps(out), flush=True)
rpc.shutdown()
'''


def _results(tmp_path: Path) -> Dict[int, Dict]:
    script = tmp_path / "subjob.py"
    script.write_text(SCRIPT)
    rc, out, err, _ = run_job([find_mpiexec(), "-n", "4", sys.executable, str(script),
                               *map(str, free_ports(4))], timeout=150, cwd=tmp_path,
                              env={"OMP_NUM_THREADS": "1", "MPITENSOR_ABORT_ON_EXCEPTION": "0"})
    assert rc == 0, f"{out}\n{err}"
    found = [json.loads(s[len("RESULT "):]) for s in out.splitlines() if s.startswith("RESULT ")]
    assert sorted(r["me"] for r in found) == [0, 1, 2, 3], f"{out}\n{err}"
    return {r["me"]: r for r in found}


def test_subgroup_of_a_larger_job(tmp_path: Path) -> None:
    res = _results(tmp_path)
    for me in range(4):
        assert res[me]["rpc"] == me + 1.0  # RPC over all four, before and after the group
    # the group: job ranks 3 and 1 as ranks 0 and 1; collectives and DDP over those two
    for me, rank in ((3, 0), (1, 1)):
        r = res[me]
        assert (r["rank"], r["size"], r["sum"]) == (rank, 2, 6.0), r
        assert r["gathered"] == [3.0, 1.0], r
        assert r["grad"] == [[6.0, 6.0]], r  # mean over the two of 3*me per weight
    assert "rank" not in res[0] and "rank" not in res[2]
    # rank 1 claimed twice: every caller fails with ValueError naming it
    for me in range(3):
        kind, is_value, _, msg = res[me]["twice"]
        assert is_value and "rank 1 was claimed twice" in msg, res[me]["twice"]
    # a world size nobody fills: DistStoreError (as torch's) naming the missing rank
    for me in range(2):
        kind, _, is_store, msg = res[me]["short"]
        assert is_store and "rank(s) [2] did not" in msg, res[me]["short"]
    kind, is_value, _, msg = res[3]["range"]
    assert is_value and "rank=2 is out of range for world_size=2" in msg
    kind, is_value, _, msg = res[3]["no_rank"]
    assert is_value and "no rank for this process" in msg


SEPARATE = r'''
import sys
import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.distributed.rpc as rpc

me, port = int(sys.argv[1]), sys.argv[2]
rpc.init_rpc(f"w{me}", rank=me, world_size=4)
if me < 2:  # workers 1 and 0 are the group's ranks 0 and 1
    dist.init_process_group("gloo", rank=1 - me, world_size=2,
                            init_method=f"tcp://127.0.0.1:{port}")
    t = torch.ones(1) * (me + 1)
    dist.all_reduce(t)
    print(f"worker {me} group rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()}",
          flush=True)
got = rpc.rpc_sync(f"w{(me + 1) % 4}", torch.add, args=(torch.ones(1), me)).item()
print(f"worker {me} rpc {got}", flush=True)
rpc.shutdown()
'''


def test_subgroup_of_separately_started_workers(tmp_path: Path) -> None:
    """Four processes started apart meet in init_rpc (MASTER_ADDR/MASTER_PORT); two of them
    then form a group at an address of their own."""
    script = tmp_path / "separate.py"
    script.write_text(SEPARATE)
    rpc_port, group_port = free_ports(2)
    py = f"'{sys.executable}' '{script}'"
    outs = [f"w{r}.out" for r in range(4)]
    cmd = "".join(f"{py} {r} {group_port} > {outs[r]} 2>&1 & pids=\"$pids $!\"; "
                  for r in range(4))
    cmd += f"rc=0; for p in $pids; do wait $p || rc=1; done; cat {' '.join(outs)}; exit $rc"
    rc, out, err, _ = run_job(["timeout", "-k", "5", "120", "sh", "-c", cmd], timeout=140,
                              cwd=tmp_path, env={"MASTER_ADDR": "127.0.0.1",
                                                 "MASTER_PORT": str(rpc_port),
                                                 "OMP_NUM_THREADS": "1"})
    assert rc == 0, f"{out}\n{err}"
    lines = set(out.splitlines())
    for me in range(4):
        assert f"worker {me} rpc {me + 1.0}" in lines, out
    for me, rank in ((1, 0), (0, 1)):
        assert f"worker {me} group rank {rank} of 2 sum 3.0" in lines, out
