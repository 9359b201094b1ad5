"""Real MPICH ranks on fake hosts against the PMI helper: what they send, and that they work.

Four processes, two on each of two host names (each in a UTS namespace of its own, as
``unshare --uts`` gives; root needed), connect to a :class:`HelperServer` run in this
process, which records every line, and call ``MPI_Init`` through it. What must hold:

* every rank starts, the two of a host see one node of two and map MPICH's shared memory,
  and an all-reduce over all four gives the sum;
* each host's first rank puts its network address as **one** key: the ``vallen_max`` the
  helper answers holds it (with hydra's 1024, MPICH 5.0.2 split it into 10 keys, so the
  first ranks' exchange of addresses cost ``10 H**2`` requests for ``H`` hosts);
* what ``benchmarks/startup_scale.py`` replays for a simulated rank is what the real rank
  sent, line by line (commands and keys): its figures are those of real ranks.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from mpitensor.distributed.launch import pmi as _pmi

from .launch import clean_env

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
N, PER_HOST = 4, 2

RANK = """\
    import os, sys, time
    from mpitensor.distributed.launch import pmi
    port, rank, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    deadline = time.monotonic() + 60
    fd = pmi.connect_pmi("127.0.0.1", port, rank, token, deadline)
    os.environ.update(PMI_FD=str(fd), PMI_RANK=str(rank), PMI_SIZE=sys.argv[4])
    from mpi4py import MPI
    import numpy as np
    watch = pmi.Watch("127.0.0.1", port, rank, token, deadline)
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    with open("/proc/self/maps") as maps:
        shm = any("/dev/shm/mpich_shm_" in line for line in maps)
    total = np.zeros(1)
    world.Allreduce(np.array([rank + 1.0]), total)
    print(f"rank {world.Get_rank()} of {world.Get_size()}: node of {node.Get_size()}, "
          f"shared memory mapped {shm}, sum {total[0]}", flush=True)
    node.Free()
    watch.finalizing()
    MPI.Finalize()
"""


class _Recorder(_pmi.HelperServer):
    """The helper, keeping each rank's lines (rank, line) in order."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.lines: List[Tuple[int, str]] = []

    def _handle(self, c, line: bytes) -> None:  # type: ignore[no-untyped-def]
        if c.kind == "pmi":
            self.lines.append((c.rank, line.decode("ascii")))
        super()._handle(c, line)


def _unavailable() -> str:
    if shutil.which("unshare") is None:
        return "no unshare command"
    try:
        done = subprocess.run(["unshare", "--uts", "hostname", "x"], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare --uts: {exc}"
    if done.returncode:
        return f"unshare --uts is not permitted here: {done.stderr.decode().strip()}"
    out = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; "
                          "print(MPI.Get_library_version().splitlines()[0])"],
                         capture_output=True, text=True, timeout=60, env=clean_env())
    if "MPICH" not in out.stdout:
        return f"the MPI library is not MPICH: {out.stdout.strip() or out.stderr[-300:]}"
    return ""


def _request(line: str) -> Tuple[str, str]:
    """(command, key) of a request: what the simulation must match (values differ)."""
    w = _pmi._words(line)
    return w.get("cmd", ""), w.get("key", "")


def _simulated(server: _pmi.HelperServer, rank: int) -> List[Tuple[str, str]]:
    """The benchmark's lines for ``rank``, answered as ``server`` answers them."""
    spec = importlib.util.spec_from_file_location(
        "startup_scale", ROOT / "benchmarks" / "startup_scale.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    gen = bench._mpich_rank(rank, N, server.token, 4096, [0, 0], per_host=PER_HOST)
    out: List[Tuple[str, str]] = []
    reply = None
    while True:
        try:
            line = gen.send(reply)
        except StopIteration:
            return out[1:]  # (the hello is mpitensor's line, not MPICH's)
        out.append(_request(line.decode("ascii").rstrip("\n")))
        cmd = out[-1][0]
        static = server.static.get(cmd.encode())
        reply = (static if static is not None else server.kvs.get(out[-1][1].encode())
                 if cmd == "get" else b"cmd=" + cmd.encode() + b" rc=0\n")


def test_real_ranks_put_one_address_key_and_match_the_simulation(tmp_path: Path) -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    hosts = [f"fakehost{r // PER_HOST}" for r in range(N)]
    server = _Recorder(N, "t" * 32, 120.0, mapping=_pmi.process_mapping(hosts))
    served: Dict[str, int] = {}
    thread = threading.Thread(target=lambda: served.update(code=server.serve()), daemon=True)
    thread.start()
    prog = tmp_path / "rank.py"
    prog.write_text(textwrap.dedent(RANK))
    env = clean_env({"MPITENSOR_SECRET": None})
    procs = [subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", f'hostname {hosts[r]} && exec "$0" "$@"',
         sys.executable, str(prog), str(server.port), str(r), server.token, str(N)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        for r in range(N)]
    results = []
    deadline = time.monotonic() + 120
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                last = {r: [line[:80] for q, line in server.lines if q == r][-3:]
                        for r in range(N)}
                pytest.fail(f"the ranks hung; each one's last lines: {last}; done: {results}")
            results.append((p.returncode, out, err[-2000:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        thread.join(timeout=30)  # it ends once every rank has finalized and closed
        if thread.is_alive():
            server._close_all()  # (a failed run; the thread is a daemon)
        for lst in server.listeners:
            lst.close()
    assert [code for code, _, _ in results] == [0] * N, results
    assert served.get("code") == 0, served
    library = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; "
                              "print(MPI.Get_library_version())"], capture_output=True,
                             text=True, timeout=60, env=env).stdout
    mapped = "5.0." in library  # (MPICH 4.3.2 maps no /dev/shm/mpich_shm_* file)
    total = float(N * (N + 1) // 2)
    assert sorted(out.strip() for _, out, _ in results) == [
        f"rank {r} of {N}: node of {PER_HOST}, shared memory mapped {mapped}, sum {total}"
        for r in range(N)], results

    by_rank: Dict[int, List[Tuple[str, str]]] = {r: [] for r in range(N)}
    for rank, line in server.lines:
        by_rank[rank].append(_request(line))
    puts = [line for _, line in server.lines if line.startswith("cmd=put ")]
    assert not [p for p in puts if "value=segments=" in p], [p[:100] for p in puts]
    firsts = list(range(0, N, PER_HOST))
    addresses = [(r, _request(line)[0], line) for r, line in server.lines
                 if "-allgather" in line]
    puts = {r: line for r, cmd, line in addresses if cmd == "put"}
    # each host's first rank puts its address as one key; the H hosts get the H addresses
    # (MPICH 5.0.2: the first rank gets them all; 4.3.2: its host's ranks share the gets)
    assert sorted(puts) == firsts, addresses
    assert len([a for a in addresses if a[1] == "get"]) == len(firsts) ** 2, addresses
    for line in puts.values():
        value = _pmi._words(line)["value"]
        # MPICH 5.0.2's 4,096-byte address: with hydra's vallen_max (1024) one key held at
        # most 1022 characters of it, so it went as 10 keys
        assert (1022 if mapped else 0) < len(value) <= _pmi._kvs.VAL_MAX, len(value)
    if not mapped:
        return  # the simulation replays MPICH 5.0.2's lines (4.3.2 also puts a -bcast- key)
    for r in range(N):
        sim = _simulated(server, r)
        # MPI_Init's lines, then MPI_Finalize's: one barrier and a finalize
        assert by_rank[r][:len(sim)] == sim, (r, by_rank[r], sim)
        assert by_rank[r][len(sim):] == [("barrier_in", ""), ("finalize", "")], by_rank[r]
