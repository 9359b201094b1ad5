#!/usr/bin/env python3
"""A local multi-host cluster for testing hostfile runs: network namespaces act as hosts.

What it builds (root is needed for ``ip netns``)::

    root namespace: bridge <prefix>b, address 10.77.S.254/24   (the launching "head node")
      ├── veth ── namespace <prefix>h1: lo up, 10.77.S.1/24   ("host 1")
      ├── veth ── namespace <prefix>h2: lo up, 10.77.S.2/24   ("host 2")
      └── ...

plus, in a private temporary directory, a hostfile (``10.77.S.1:2`` ...) and an ``ssh``-like
launcher script that skips ssh's options, takes the host and runs the rest with
``ip netns exec <namespace> sh -c "<command>"``. MPICH's hydra then starts one proxy per
"host"::

    mpiexec -f HOSTFILE -launcher ssh -launcher-exec LAUNCHER -localhost 10.77.S.254 \\
            -n 4 python prog.py

Every name carries the creating process's id (``mt<pid>``), and the subnet ``10.77.S.0/24``
takes the first ``S`` (from 0) that no route uses yet, so two clusters never clash. Teardown
kills what still runs in the namespaces and removes every namespace, link and file made; it also
runs when creation fails half-way.

Use from Python::

    from netns_cluster import NetnsCluster, netns_unavailable_reason
    with NetnsCluster(hosts=2, slots=2) as c:
        subprocess.run(c.mpiexec_args(4) + [sys.executable, "prog.py"], env=c.env(), ...)

or from the shell (a cluster lives as long as the command)::

    sudo python hostfiles/netns_cluster.py --hosts 2 --slots 2 -- \\
        mpiexec -f {hostfile} -launcher ssh -launcher-exec {launcher} -localhost {head} \\
        -n 4 python examples/tour.py
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

__all__ = ["NetnsCluster", "netns_unavailable_reason", "leftovers"]

_IP = shutil.which("ip") or "/sbin/ip"
IFACE = "eth0"  # the name of each host's link into the bridge, inside its namespace

_LAUNCHER = """#!/bin/sh
# ssh stand-in for a network-namespace cluster: [ssh options] HOST COMMAND...
while [ $# -gt 0 ]; do
    case "$1" in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;   # ssh options that take a value
        -*) shift ;;
        *) break ;;
    esac
done
host="$1"; shift
case "$host" in
{cases}
    *) echo "netns launcher: unknown host $host" >&2; exit 255 ;;
esac
exec {ip} netns exec "$ns" unshare --uts sh -c "hostname $ns; $*"
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([_IP, *args], capture_output=True, text=True, check=check, timeout=30)


def netns_unavailable_reason() -> Optional[str]:
    """Why namespaces cannot be made here (``None`` when they can): tries to create one."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "creating network namespaces needs root"
    if not os.path.exists(_IP):
        return "the `ip` command (iproute2) is not installed"
    probe = f"mtprobe{os.getpid()}"
    try:
        r = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` failed: {exc}"
    if r.returncode != 0:
        return f"`ip netns add` is not permitted here: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def leftovers(prefix: str) -> List[str]:
    """Namespaces and links whose names start with ``prefix`` (what a teardown must remove)."""
    found = []
    r = _ip("netns", "list", check=False)
    found += [line.split()[0] for line in r.stdout.splitlines()
              if line.strip() and line.split()[0].startswith(prefix)]
    r = _ip("-o", "link", "show", check=False)
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix):
                found.append(name)
    return found


class NetnsCluster:
    """``hosts`` namespace hosts with ``slots`` slots each, a hostfile and an ssh stand-in.

    Attributes:
        prefix: the per-run name prefix (``mt<pid>`` plus a counter).
        head: the bridge's address, reachable from every host (``-localhost`` for hydra).
        host_ips: the hosts' addresses, host 1 first.
        namespaces: the namespaces' names, host 1 first.
        hostfile: path of the MPICH hostfile (``ip:slots`` lines).
        launcher: path of the ssh-like launcher script.
    """

    _count = 0

    def __init__(self, hosts: int = 2, slots: int = 2) -> None:
        if hosts < 1 or hosts > 250 or slots < 1:
            raise ValueError("hosts must be in 1..250 and slots at least 1")
        NetnsCluster._count += 1
        self.hosts, self.slots = hosts, slots
        self.prefix = f"mt{os.getpid()}{chr(ord('a') + (NetnsCluster._count - 1) % 26)}"
        self.bridge = f"{self.prefix}b"
        self.namespaces = [f"{self.prefix}h{i}" for i in range(1, hosts + 1)]
        self.head = ""
        self.host_ips: List[str] = []
        self.dir = ""
        self.hostfile = ""
        self.launcher = ""
        self._up = False

    # -- building -------------------------------------------------------------------------

    def _free_subnet(self) -> ipaddress.IPv4Network:
        routes = _ip("-4", "route", "show", "table", "all", check=False).stdout
        addrs = _ip("-4", "-o", "addr", "show", check=False).stdout
        used = []
        for token in (routes + " " + addrs).split():
            try:
                used.append(ipaddress.ip_network(token, strict=False))
            except ValueError:
                continue
        for third in range(256):
            net = ipaddress.ip_network(f"10.77.{third}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return net
        raise RuntimeError("no free 10.77.S.0/24 subnet for the namespace cluster")

    def up(self) -> "NetnsCluster":
        """Create the bridge, namespaces, veth pairs, hostfile and launcher."""
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self._up = True
        return self

    def _build(self) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"{self.prefix}-cluster-")
        net = self._free_subnet()
        hosts = list(net.hosts())  # .1 ... .254
        self.head = str(hosts[253])
        self.host_ips = [str(hosts[i]) for i in range(self.hosts)]
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.head}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.host_ips), 1):
            outer, inner = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("link", "set", inner, "netns", ns)
            # every host sees its link as IFACE, as on a cluster of like machines
            _ip("-n", ns, "link", "set", inner, "name", IFACE)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        self.hostfile = os.path.join(self.dir, "hostfile")
        with open(self.hostfile, "w") as f:
            f.write("# namespace cluster made by hostfiles/netns_cluster.py\n")
            for addr in self.host_ips:
                f.write(f"{addr}:{self.slots}\n")
        cases = "\n".join(f'    {addr}) ns={ns} ;;'
                          for addr, ns in zip(self.host_ips, self.namespaces))
        self.launcher = os.path.join(self.dir, "netns-ssh")
        with open(self.launcher, "w") as f:
            f.write(_LAUNCHER.format(cases=cases, ip=_IP))
        os.chmod(self.launcher, stat.S_IRWXU)
        self._wait_reachable()

    def _wait_reachable(self) -> None:
        """Wait until every host can reach the head (the bridge port leaves its listening state)."""
        if shutil.which("ping") is None:
            return  # nothing to probe with; hydra's own connection retries cover the rest
        deadline = time.monotonic() + 10
        for ns in self.namespaces:
            while True:
                r = subprocess.run([_IP, "netns", "exec", ns, "ping", "-c", "1", "-W", "1",
                                    self.head], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, timeout=15)
                if r.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"namespace {ns} cannot reach {self.head}")
                time.sleep(0.1)

    # -- using ----------------------------------------------------------------------------

    def mpiexec_args(self, nprocs: int, mpiexec: str = "mpiexec") -> List[str]:
        """``mpiexec -f HOSTFILE -launcher ssh -launcher-exec LAUNCHER -localhost HEAD -n N``."""
        return [mpiexec, "-f", self.hostfile, "-launcher", "ssh", "-launcher-exec",
                self.launcher, "-localhost", self.head, "-n", str(nprocs)]

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """An environment for the job: no outer MPI job's variables."""
        env = dict(os.environ if base is None else base)
        for k in list(env):
            if k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL")):
                del env[k]
        return env

    def namespace_of(self, ip: str) -> str:
        """The namespace name of a host address."""
        return self.namespaces[self.host_ips.index(ip)]

    # -- tearing down ---------------------------------------------------------------------

    def down(self) -> None:
        """Kill what runs in the namespaces, delete namespaces, links and files (idempotent)."""
        for ns in self.namespaces:
            r = _ip("netns", "pids", ns, check=False)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in self.namespaces:
            for _ in range(50):  # a namespace with a dying process may refuse briefly
                if _ip("netns", "del", ns, check=False).returncode != 0:
                    break
                if ns not in _ip("netns", "list", check=False).stdout.split():
                    break
                time.sleep(0.1)
        for i in range(1, self.hosts + 1):
            _ip("link", "del", f"{self.prefix}v{i}", check=False)
        _ip("link", "del", self.bridge, check=False)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._up = False

    def __enter__(self) -> "NetnsCluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def main(argv: Optional[List[str]] = None) -> int:
    """Build a cluster, run one command on it ({hostfile}, {launcher}, {head} filled in)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2, help="namespace hosts (default 2)")
    parser.add_argument("--slots", type=int, default=2, help="slots per host (default 2)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="kill the command after this many seconds (default 600)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="command after --; {hostfile}, {launcher}, {head}, {bridge} are "
                        "replaced")
    ns = parser.parse_args(argv)
    cmd = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not cmd:
        parser.error("give a command after --")
    reason = netns_unavailable_reason()
    if reason:
        parser.exit(2, f"{parser.prog}: error: {reason}\n")
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind through the teardown below

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    with NetnsCluster(ns.hosts, ns.slots) as c:
        filled = [a.format(hostfile=c.hostfile, launcher=c.launcher, head=c.head,
                           bridge=c.bridge) for a in cmd]
        proc = subprocess.Popen(filled, env=c.env(), start_new_session=True)
        try:
            return proc.wait(timeout=ns.timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return 124


if __name__ == "__main__":
    sys.exit(main())
