"""Flat against hierarchical collectives on network-namespace hosts (issue 29).

Run (root, MPICH): ``timeout 900 python benchmarks/hierarchical.py [--reps 15] [--rate 1gbit]
[--plot docs/img/hierarchical.png]``

Builds two namespace hosts of two slots (``hostfiles/netns_cluster.py``; removed after),
traffic between them on TCP over each host's ``eth0``, and runs ``tests/hier_job.py`` on 4
ranks, placed host by host (ranks 0-1, 2-3) and round robin (``-ppn 1``: ranks 0, 2 and 1, 3):

- time: median seconds per all_reduce of float64, flat (a group with
  ``MPITENSOR_HIERARCHICAL=off``) and hierarchical (forced on), called alternately after a
  barrier each, the slowest rank's median; their ratio;
- bytes: what each host's link sent per call (its ``eth0`` counter, read in the namespace
  around the calls only), flat and hierarchical, for all_reduce, all_gather_into_tensor (whose
  output is the size given) and reduce_scatter_tensor (whose input is);
- the cost model of ``auto`` (its crossover in bytes, and the fitted lines).

Prints Markdown tables. The namespaces share one kernel and its cores: a "link" is a veth
pair, as fast as memory copies, so timings say little about a real network unless ``--rate``
caps each host's link (a token-bucket qdisc); the byte counts are what a real network would
carry.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
JOB = str(ROOT / "tests" / "hier_job.py")
_spec = importlib.util.spec_from_file_location("netns_cluster",
                                               ROOT / "hostfiles" / "netns_cluster.py")
netns_cluster = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(netns_cluster)

SIZES = [8, 1 << 10, 8 << 10, 64 << 10, 512 << 10, 4 << 20, 16 << 20]
BYTE_SIZES = [("all_reduce", 2048, 200), ("all_reduce", 64 << 10, 50),
              ("all_reduce", 4 << 20, 4), ("all_gather", 32 << 10, 100),
              ("all_gather", 4 << 20, 4), ("reduce_scatter", 32 << 10, 100),
              ("reduce_scatter", 4 << 20, 4)]
NET_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": netns_cluster.IFACE,
           "FI_PROVIDER": "tcp", "FI_TCP_IFACE": netns_cluster.IFACE}


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def _run(c, args: List[str], env: Dict[str, str], round_robin: bool) -> str:
    cmd = c.mpiexec_args(4, _mpiexec()) + (["-ppn", "1"] if round_robin else [])
    full = c.env({**os.environ, **NET_ENV, **env, "PYTHONPATH": str(ROOT)})
    r = subprocess.run(cmd + [sys.executable, JOB, *args], env=full, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"job failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}")
    return r.stdout


def _times(c, reps: int, round_robin: bool) -> "tuple[str, list]":
    out = _run(c, ["time", ",".join(map(str, SIZES)), str(reps)],
               {"MPITENSOR_HIERARCHICAL": "on"}, round_robin)
    rows = ["| bytes | flat (µs) | hierarchical (µs) | hierarchical / flat |", "|---|---|---|---|"]
    points = []
    for size, flat, hier in re.findall(r"TIME (\d+) (\S+) (\S+)", out):
        f, h = float(flat), float(hier)
        points.append((int(size), f, h))
        rows.append(f"| {int(size):,} | {f * 1e6:,.0f} | {h * 1e6:,.0f} | {h / f:.2f} |")
    return "\n".join(rows), points


def _plot(path: str, curves: dict, rate: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for (name, points), color in zip(curves.items(), ("tab:blue", "tab:orange")):
        sizes = [p[0] for p in points]
        ax.plot(sizes, [p[1] * 1e3 for p in points], "o--", color=color, label=f"flat, {name}")
        ax.plot(sizes, [p[2] * 1e3 for p in points], "s-", color=color,
                label=f"hierarchical, {name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per all_reduce (float64)")
    ax.set_ylabel("ms per call (median, slowest rank)")
    ax.set_title(f"all_reduce, 2 namespace hosts x 2 ranks{', links at ' + rate if rate else ''}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _bytes(c, round_robin: bool) -> str:
    rows = ["| call | bytes | calls | flat: bytes a host sends per call | hierarchical | "
            "hierarchical / flat |", "|---|---|---|---|---|---|"]
    for op, nbytes, calls in BYTE_SIZES:
        out = _run(c, ["bytes", str(nbytes / (1 << 20)), str(calls), op],
                   {"MPITENSOR_HIERARCHICAL": "on"}, round_robin)
        found = [(int(f), int(h)) for f, h in re.findall(r"BYTES \S+ (\d+) (\d+) \d+", out)]
        per = 2 * calls  # two windows of each kind
        flat = sum(f for f, _ in found) / len(found) / per
        hier = sum(h for _, h in found) / len(found) / per
        rows.append(f"| {op} | {nbytes:,} | {calls} | {flat:,.0f} | {hier:,.0f} | "
                    f"{hier / flat:.3f} |")
    return "\n".join(rows)


def _model(c, round_robin: bool) -> str:
    out = _run(c, ["time", "8", "1"], {"MPITENSOR_HIERARCHICAL": "auto"}, round_robin)
    m = re.search(r"MODEL (.+)", out)
    return m.group(1) if m else "no model (the group chose flat for good)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=15, help="timed calls per size and path")
    parser.add_argument("--rate", default="", help="cap each host's link at this rate (tc's "
                        "units: 1gbit, 200mbit), as a real network is slower than memory")
    parser.add_argument("--plot", default="", help="write a PNG of the times here")
    ns = parser.parse_args()
    reason = netns_cluster.netns_unavailable_reason()
    if reason:
        raise SystemExit(f"namespace cluster: {reason}")
    with netns_cluster.NetnsCluster(hosts=2, slots=2) as c:
        if ns.rate:  # a token bucket on each host's eth0 (gone with the namespace)
            for host in c.namespaces:
                subprocess.run(["ip", "netns", "exec", host, "tc", "qdisc", "add", "dev",
                                netns_cluster.IFACE, "root", "tbf", "rate", ns.rate, "burst",
                                "1mb", "latency", "200ms"], check=True)
            print(f"each host's link capped at {ns.rate}")
        curves = {}
        for name, rr in (("host by host", False), ("round robin", True)):
            print(f"\n### 2 hosts x 2 ranks, placed {name}\n")
            table, curves[name] = _times(c, ns.reps, rr)
            print(table)
            print()
            print(_bytes(c, rr))
            print(f"\ncost model (auto): {_model(c, rr)}")
    if ns.plot:
        _plot(ns.plot, curves, ns.rate)


if __name__ == "__main__":
    main()
