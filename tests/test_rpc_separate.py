"""RPC between processes started as separate commands, without mpiexec (issue 25, family 9):
each calls ``rpc.init_rpc(name, rank=r, world_size=n)`` with MASTER_ADDR/MASTER_PORT set, as
torch's RPC tutorials start their parameter server and trainers."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .launch import clean_env

SCRIPT = """
import sys
import mpitensor as torch
import mpitensor.distributed.rpc as rpc

def add(a, b):
    return a + b

rank, world = int(sys.argv[1]), int(sys.argv[2])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world,
             rpc_backend_options=rpc.TensorPipeRpcBackendOptions(num_worker_threads=4))
if rank == 0:
    for peer in range(1, world):
        got = rpc.rpc_sync(f"worker{peer}", add, args=(torch.ones(2) * peer, torch.ones(2)))
        print(f"from worker{peer}: {got.tolist()}", flush=True)
    print("names", sorted(rpc.get_worker_info(f"worker{p}").name for p in range(world)),
          flush=True)
rpc.shutdown()
print(f"rank {rank} done", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 3])
def test_separately_started_processes_meet_and_call(tmp_path: Path, world: int) -> None:
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=tmp_path) for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out}"
        assert f"rank {r} done" in out
    for peer in range(1, world):
        assert f"from worker{peer}: {[peer + 1.0] * 2}" in outs[0]
    assert f"names {[f'worker{r}' for r in range(world)]}" in outs[0]

