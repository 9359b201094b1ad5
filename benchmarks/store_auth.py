"""What the shared secret costs a TCPStore: connect time and a small set+get round trip.

Two masters run in processes of their own, one with ``MPITENSOR_SECRET`` and one without; the
same client code measures both in the same run, interleaved, so the machine's noise hits both
alike. Prints the median (and the 10th/90th percentiles) in microseconds, and the ratios.

    python benchmarks/store_auth.py [--connects 200] [--round-trips 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Dict, List

from mpitensor.distributed import TCPStore

_SERVER = """
import sys
from datetime import timedelta
from mpitensor.distributed import TCPStore
m = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
print(m.port, flush=True)
sys.stdin.read()
"""
_SECRET = "benchmark secret " + "x" * 47


def _server(secret: bool) -> "tuple[subprocess.Popen, int]":
    env = dict(os.environ)
    env.pop("MPITENSOR_SECRET", None)
    if secret:
        env["MPITENSOR_SECRET"] = _SECRET
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    return proc, int(proc.stdout.readline())


def _client(port: int, secret: bool) -> TCPStore:
    if secret:
        os.environ["MPITENSOR_SECRET"] = _SECRET
    else:
        os.environ.pop("MPITENSOR_SECRET", None)
    return TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))


def _stats(xs: List[float]) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"median {statistics.median(xs):8.1f} us  (p10 {q[0]:7.1f}, p90 {q[-1]:7.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connects", type=int, default=200)
    ap.add_argument("--round-trips", type=int, default=2000)
    args = ap.parse_args()
    servers = {s: _server(s) for s in (False, True)}
    try:
        connect: Dict[bool, List[float]] = {False: [], True: []}
        trip: Dict[bool, List[float]] = {False: [], True: []}
        for _ in range(args.connects):
            for s in (False, True):
                t0 = time.perf_counter()
                c = _client(servers[s][1], s)
                connect[s].append((time.perf_counter() - t0) * 1e6)
                c.close()
        clients = {s: _client(servers[s][1], s) for s in (False, True)}
        for s in (False, True):  # warm-up
            for _ in range(50):
                clients[s].set("k", b"v" * 16)
                clients[s].get("k")
        for _ in range(args.round_trips):
            for s in (False, True):
                c = clients[s]
                t0 = time.perf_counter()
                c.set("k", b"v" * 16)
                c.get("k")
                trip[s].append((time.perf_counter() - t0) * 1e6)
        for c in clients.values():
            c.close()
    finally:
        for proc, _ in servers.values():
            proc.stdin.close()
            proc.wait(timeout=10)
    print(f"TCPStore on 127.0.0.1, {args.connects} connects and {args.round_trips} round trips "
          "(set + get of 16 bytes) each, interleaved")
    for s in (False, True):
        name = "with secret   " if s else "without secret"
        print(f"  connect     {name}: {_stats(connect[s])}")
    for s in (False, True):
        name = "with secret   " if s else "without secret"
        print(f"  round trip  {name}: {_stats(trip[s])}")
    print(f"  ratio with/without: connect "
          f"{statistics.median(connect[True]) / statistics.median(connect[False]):.2f}, "
          f"round trip {statistics.median(trip[True]) / statistics.median(trip[False]):.2f}")


if __name__ == "__main__":
    main()
