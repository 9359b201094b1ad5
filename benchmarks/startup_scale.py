"""Start-up cost of processes that meet without a launcher, as the number of ranks grows.

Two parts, both run in the same invocation so that the machine's load hits them alike:

* **helper**: rank 0's PMI helper (``mpitensor/distributed/_pmi.py``) serving N fake ranks
  that speak MPICH's start-up sequence from one process (non-blocking sockets on 127.0.0.1):
  hello, ``init``, ``get_maxes``, ``get_my_kvsname``, ``get PMI_process_mapping``, ``put``
  of a business card, ``barrier_in``, ``get`` of a neighbour's card. Two forms: *mapping*
  (the helper answers ``PMI_process_mapping``, as now) and *hostnames* (it does not, so each
  rank also puts its host name and gets every other rank's, as MPICH does then: N^2
  requests). Reported: the wall time from the first connection to the last rank done, and
  the requests served.
* **ranks**: N real processes started by hand on ``tcp://127.0.0.1`` calling
  ``init_process_group`` (store, helper, ``MPI_Init``); reported: from the last rank's call to
  the last rank's return (the others' waits for its imports left out), median of the
  repetitions, beside the slowest ``MPI_Init`` under ``mpiexec -n N``.

Usage: ``python benchmarks/startup_scale.py [--fake 64,256,1024] [--ranks 2,4] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpitensor.distributed import _pmi  # noqa: E402


class _Fake:
    __slots__ = ("rank", "sock", "steps", "i", "buf", "done", "sent")

    def __init__(self, rank: int, sock: socket.socket, steps: List[str]) -> None:
        self.rank, self.sock, self.steps = rank, sock, steps
        self.i, self.buf, self.done, self.sent = 0, b"", False, 0


def _steps(rank: int, n: int, token: str, hostnames: bool) -> List[str]:
    out = [f"cmd=mpitensor-hello rank={rank} token={token}", "cmd=init pmi_version=1 "
           "pmi_subversion=1", "cmd=get_maxes", "cmd=get_my_kvsname",
           "cmd=get kvsname=k key=PMI_process_mapping"]
    if hostnames:
        out.append(f"cmd=put kvsname=k key=hostname[{rank}] value=host{rank % 4}")
    out += [f"cmd=put kvsname=k key=card-{rank} value=tcp://10.0.0.{rank % 250}:{rank}",
            "cmd=barrier_in"]
    if hostnames:
        out += [f"cmd=get kvsname=k key=hostname[{i}]" for i in range(n) if i != rank]
    out.append(f"cmd=get kvsname=k key=card-{(rank + 1) % n}")
    return out


def helper_run(n: int, hostnames: bool) -> Tuple[float, int]:
    """Serve ``n`` fake ranks; return (seconds, requests)."""
    mapping = None if hostnames else _pmi.process_mapping([f"host{r // 4}" for r in range(n)])
    h = _pmi.start_helper(n, 300.0, mapping=mapping)
    sel = selectors.DefaultSelector()
    fakes: List[_Fake] = []
    requests = 0
    try:
        t0 = time.perf_counter()
        for r in range(n):
            sock = socket.create_connection(("127.0.0.1", h.port))
            sock.setblocking(False)
            f = _Fake(r, sock, _steps(r, n, h.token, hostnames))
            fakes.append(f)
            sel.register(sock, selectors.EVENT_READ, f)
            sock.sendall((f.steps[0] + "\n").encode())
            requests += 1
        left = n
        while left:
            for key, _ in sel.select(timeout=60):
                f = key.data
                data = f.sock.recv(1 << 16)
                if not data:
                    raise RuntimeError(f"the helper closed fake rank {f.rank}")
                f.buf += data
                while b"\n" in f.buf:
                    line, f.buf = f.buf.split(b"\n", 1)
                    if b"rc=0" not in line and b"key_not_found" not in line:
                        raise RuntimeError(f"fake rank {f.rank}: {line!r}")
                    f.i += 1
                    if f.i == len(f.steps):
                        f.done = True
                        left -= 1
                        sel.unregister(f.sock)
                        break
                    f.sock.sendall((f.steps[f.i] + "\n").encode())
                    requests += 1
        return time.perf_counter() - t0, requests
    finally:
        for f in fakes:
            f.sock.close()
        h.proc.kill()
        h.proc.wait()


RANK = """\
    import sys, time
    import mpitensor.distributed as dist
    t1 = time.time()
    dist.init_process_group("gloo", init_method=sys.argv[2], rank=int(sys.argv[1]),
                            world_size=int(sys.argv[3]), timeout=120)
    print(f"{t1:.6f} {time.time():.6f}", flush=True)
    dist.destroy_process_group()
"""

UNDER_MPIEXEC = """\
    import time
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
    t0 = time.perf_counter()
    MPI.Init_thread()
    print(f"{time.perf_counter() - t0:.4f}", flush=True)
    MPI.Finalize()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks_run(n: int, prog: str) -> float:
    url = f"tcp://127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    env["PYTHONPATH"] = str(ROOT)
    procs = [subprocess.Popen([sys.executable, prog, str(r), url, str(n)], env=env,
                              stdout=subprocess.PIPE, text=True) for r in range(n)]
    enter, leave = [], []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        if p.returncode:
            raise RuntimeError(f"a rank failed (exit code {p.returncode})")
        enter.append(float(out.split()[0]))
        leave.append(float(out.split()[1]))
    return max(leave) - max(enter)  # from the last rank's call: not the others' imports


def mpiexec_run(n: int, prog: str) -> float:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    out = subprocess.run([str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(n),
                          sys.executable, prog], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    # the ranks' lines may come interleaved through mpiexec: take every 4-decimal number
    return max(float(x) for x in re.findall(r"\d+\.\d{4}", out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake", default="64,256,1024")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"host {socket.gethostname()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print("\nhelper with N fake ranks (median of reps): seconds, requests, µs per request")
    for n in [int(x) for x in args.fake.split(",") if x]:
        row: Dict[str, Tuple[float, int]] = {}
        for form in ("mapping", "hostnames"):
            runs = [helper_run(n, form == "hostnames") for _ in range(args.reps)]
            row[form] = (statistics.median(t for t, _ in runs), runs[0][1])
        m, hn = row["mapping"], row["hostnames"]
        print(f"  N={n:5d}  mapping {m[0]:7.3f} s {m[1]:8d} req {m[0] / m[1] * 1e6:6.1f} µs  |  "
              f"hostnames {hn[0]:7.3f} s {hn[1]:8d} req {hn[0] / hn[1] * 1e6:6.1f} µs  |  "
              f"ratio {hn[0] / m[0]:5.1f}")
    with tempfile.TemporaryDirectory() as d:
        rank = os.path.join(d, "rank.py")
        Path(rank).write_text(textwrap.dedent(RANK))
        under = os.path.join(d, "under.py")
        Path(under).write_text(textwrap.dedent(UNDER_MPIEXEC))
        print("\nreal ranks: seconds from the last rank's call (median of reps)")
        for n in [int(x) for x in args.ranks.split(",") if x]:
            ours, theirs = [], []
            for _ in range(args.reps):  # alternate, so that load hits both
                ours.append(ranks_run(n, rank))
                theirs.append(mpiexec_run(n, under))
            a, b = statistics.median(ours), statistics.median(theirs)
            print(f"  N={n}  init_process_group (rendezvous) {a:.3f} s  |  MPI_Init under "
                  f"mpiexec {b:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
