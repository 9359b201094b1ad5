"""RPC programs of our own, run as a user runs them, under mpitensor and under torch (the
oracle; its RPC runs on TensorPipe over loopback) from the same weights and data; their
printed losses agree to float32 rounding (1e-5 relative) or to 1e-10 in float64:

- tests/programs/rpc_param_server.py: a parameter server and its trainers started as
  separate commands that meet through MASTER_ADDR/MASTER_PORT (no mpiexec); trainers pull
  parameters and push gradients, the server applies their mean;
- tests/programs/rpc_ddp_remote_module.py: four processes from ``mp.spawn``; an embedding
  table as a ``RemoteModule`` on "ps", two trainers doing DDP over a local Linear in a
  process group of their own (``init_process_group(world_size=2)``), one master.
"""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

from .launch import run_job

PROGRAMS = Path(__file__).resolve().parent / "programs"
LOSS = re.compile(r"^trainer (\d+) step (\d+) loss (-?\d+\.\d+)$", re.M)
RTOL = {"float32": 1e-5, "float64": 1e-10}


def free_ports(n: int) -> List[int]:
    """n distinct free loopback ports (held together while chosen, so never the same)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _run(cmd: Sequence[str], lib: str, cwd: Path, env: Dict[str, str]) -> str:
    env = {"USE_MPITENSOR": "1" if lib == "mpitensor" else "0", "OMP_NUM_THREADS": "1", **env}
    rc, out, err, _ = run_job(["timeout", "-k", "5", "150", *cmd], timeout=170, cwd=cwd,
                              env=env)
    assert rc == 0, f"{lib}: {' '.join(cmd)}\n{out}\n{err}"
    return out


def _losses(out: str) -> Dict[Tuple[int, int], float]:
    return {(int(r), int(s)): float(v) for r, s, v in LOSS.findall(out)}


def _libs() -> List[str]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return ["mpitensor"]
    return ["mpitensor", "torch"]


def _agree(runs: Dict[str, str], dtype: str, expected: int, final: str) -> None:
    ours = _losses(runs["mpitensor"])
    assert len(ours) == expected, runs["mpitensor"]
    if "torch" not in runs:
        pytest.skip("torch is not installed (the oracle)")
    theirs = _losses(runs["torch"])
    assert sorted(ours) == sorted(theirs), f"ours:\n{runs['mpitensor']}\ntorch:\n{runs['torch']}"
    rtol = RTOL[dtype]
    for key, value in ours.items():
        assert value == pytest.approx(theirs[key], rel=rtol), (key, value, theirs[key])
    sums = [float(re.search(final, runs[lib]).group(1)) for lib in ("mpitensor", "torch")]
    assert sums[0] == pytest.approx(sums[1], rel=rtol, abs=rtol), sums


def _param_server(lib: str, trainers: int, steps: int, dtype: str, cwd: Path) -> str:
    """One command for the server and one per trainer, started apart, collected by `wait`;
    each writes to a file of its own (processes printing into one pipe can split lines)."""
    prog = f"'{sys.executable}' '{PROGRAMS / 'rpc_param_server.py'}'"
    common = f"--trainers {trainers} --dtype {dtype}"
    outs = [f"{lib}-{r}.out" for r in range(trainers + 1)]
    script = f"{prog} --role server {common} > {outs[0]} 2>&1 & pids=$!; "
    for r in range(1, trainers + 1):
        script += (f"{prog} --role trainer --rank {r} --steps {steps} {common} > {outs[r]} 2>&1 "
                   "& pids=\"$pids $!\"; ")
    script += f"rc=0; for p in $pids; do wait $p || rc=1; done; cat {' '.join(outs)}; exit $rc"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0])}
    return _run(["sh", "-c", script], lib, cwd, env)


@pytest.mark.parametrize("trainers, dtype", [(1, "float32"), (2, "float64")])
def test_param_server_started_as_separate_commands(tmp_path: Path, trainers: int,
                                                   dtype: str) -> None:
    steps = 6
    runs = {lib: _param_server(lib, trainers, steps, dtype, tmp_path) for lib in _libs()}
    for out in runs.values():
        assert f"server: {steps} updates" in out, out
    _agree(runs, dtype, trainers * steps, r"weight sum (-?\d+\.\d+)")


def test_ddp_over_two_of_four_rpc_processes_with_remote_module(tmp_path: Path) -> None:
    steps, dtypes = 3, ["float32", "float64"]
    runs = {}
    for lib in _libs():
        ports = [str(p) for p in free_ports(2)]
        runs[lib] = _run([sys.executable, str(PROGRAMS / "rpc_ddp_remote_module.py"),
                          "--steps", str(steps), "--dtype", *dtypes, "--ports", *ports],
                         lib, tmp_path, {})
    for dtype in dtypes:  # each launch trains once per dtype: its lines begin with the dtype
        _agree({lib: "\n".join(line[len(dtype) + 1:] for line in out.splitlines()
                               if line.startswith(dtype + " ")) for lib, out in runs.items()},
               dtype, 2 * steps, r"table weight sum (-?\d+\.\d+)")
