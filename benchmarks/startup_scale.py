"""Start-up cost of processes that meet without a launcher, as the number of ranks grows.

Processes started without ``mpiexec`` (torchrun, ``mp.spawn``, by hand) first meet in the
TCPStore (``mpitensor/distributed/launch/rendezvous.py``: ``_arrive`` + ``join``); then rank 0
starts a PMI-1 helper (``mpitensor/distributed/launch/pmi.py``) and every rank calls ``MPI_Init``
against it. This script simulates both steps for N ranks, 8 per simulated host, with every
server in a process of its own (its CPU time read from ``/proc/PID/stat``, its peak memory
from ``VmHWM`` in ``/proc/PID/status``), the N clients driven from this process
(non-blocking sockets) or, for torch's client objects, from threads in a few processes:

* **mpi_init**: the helper serving N simulated MPICH ranks, each sending what a real MPICH
  5.0.2 rank sends in ``MPI_Init`` (the lines the helper received from real ranks on fake
  hosts, 2026-11-29: hello, ``init``, ``get_maxes``, ``get_appnum``, ``get_my_kvsname``,
  ``get`` of ``PMI_process_mapping``, ``PMI_hwloc_xmlfile`` and
  ``PMI_mpi_memory_alloc_kinds``) and adapting to the answers as MPICH does: with the mapping
  answered, no host-name exchange; then the exchange of node addresses among the first rank
  of each host: each puts its address (``--addr-bytes``, 4,096 bytes in MPICH 5.0.2),
  every rank passes ``barrier_in``, each first rank gets every host's address, its own
  included. An address longer than ``(vallen_max - 2) / 2`` bytes (the ``get_maxes``
  answer) goes as a header key and segments, got one request each: 10 keys a host with the
  1024 the helper answered before, 1 with the 32 KiB it answers now; so ``H^2`` requests for
  H hosts, counted apart as ``node_req``. **mpi_init_1024** is the same as the helper
  answered before (the client keeps to 1024: 10 keys a host, ``10 H^2``); without the
  mapping (``--hostnames-max``, the old behaviour, N^2) each rank also puts its host name,
  passes a barrier and gets every other rank's. Reported: the time from the first
  connection to the last rank done, and beside the helper's CPU time the clients' (this
  process, which drives all N simulated ranks on one epoll, each line made once: on a
  loaded machine the wall time stretches with the CPU both can get, the CPU times do not;
  on a cluster the ranks' share runs on their own hosts). **mpi_init_own** is the same
  without the node-address exchange: the helper's own work.
* **rendezvous** (ours): our TCPStore master process; N ranks arriving over ``--spread``
  seconds, each doing what ``_arrive`` + ``join`` do on the store: compare_set ``job`` (its
  record carries the world size); then, sent together in one segment (``_claim``),
  compare_set ``rank/i``, add ``arrived`` and a get that waits for ``mode`` (rank 0: for
  ``arrived/all``; a posted error sets both, to a mark, so one waiting get suffices). The
  last to arrive leaves that get unread, sets ``arrived/all`` on a new connection and gets
  ``mode`` there. Rank 0 then checks and multi_gets every rank's record, sets ``mode`` and
  gets it: 4 requests a rank in 2 exchanges (rank 0: 8, the last 6). Reported: the time
  from the last arrival to the last rank done, and the requests served.
  **rendezvous_6** is the same as it was before (6 requests a rank: compare_set
  ``world_size`` apart, and every rank waiting for ``arrived/all``); **rendezvous_8** that
  with each wait a ``wait`` and then a ``get`` (8 requests a rank, as before 2026-11-29);
  **rendezvous_poll** replays the waits as they were before that: re-waits of 0.25 s, each
  followed by a check of ``error``, so that each rank's requests grow with its wait.
* **env_ours** / **env_torch**: torch's own ``env://`` pattern (each rank adds one to a counter,
  the last sets a key, every rank waits for that key) with the same arrivals, against our
  master (raw frames, as above) and against ``torch.distributed.TCPStore`` (``is_master=True``
  in its own process; clients are torch's own objects, one thread each, in chunks of
  ``--chunk`` threads per process).

For every quantity a growth fit ``a*N^b`` (least squares on log-log over the N measured) gives
``b``, with the ratio of the values at 2048 and 1024 where both were measured.

* **ranks** (``--ranks``): N real processes started by hand on ``tcp://127.0.0.1`` calling
  ``init_process_group`` (store, helper, ``MPI_Init``); reported: from the last rank's call to
  the last rank's return, median of the repetitions, beside the slowest ``MPI_Init`` under
  ``mpiexec -n N``.

At the end, each target of issue 30 is judged **MET**, **NOT MET** or **NOT RUN** (the sizes
it needs were not run), with the load average during the runs it comes from: every row
also shows the load as its run ended.

Usage: ``python benchmarks/startup_scale.py [--fake 16,64,256,1024] [--ranks 2,4] [--reps 1]``
(``--ranks ''`` skips the real ranks; ``--parts mpi_init,env_torch`` runs only those parts;
``--targets --reps 3`` runs what the targets need, and only that).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import re
import resource
import select
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpitensor.distributed._store import wire  # noqa: E402
from mpitensor.distributed.launch import pmi as _pmi  # noqa: E402

PER_HOST = 8
_TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ /proc readings
def proc_stats(pid: int) -> Tuple[float, float, float]:
    """(CPU seconds user+system, VmHWM MiB, VmRSS MiB) of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)
    hwm = rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return cpu, hwm, rss


class Server:
    """A server process: its CPU and memory at ready and at the end of the work."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.port = proc, port
        self.cpu0, _, self.rss0 = proc_stats(proc.pid)

    def finish(self) -> Dict[str, float]:
        cpu, hwm, _ = proc_stats(self.proc.pid)
        return {"cpu": cpu - self.cpu0, "hwm": hwm, "grow": max(0.0, hwm - self.rss0)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


OUR_MASTER = """\
import sys
from datetime import timedelta
sys.path.insert(0, sys.argv[1])
from mpitensor.distributed import TCPStore
m = TCPStore("127.0.0.1", 0, None, is_master=True, timeout=timedelta(seconds=600),
             wait_for_workers=False)
print(m.port, flush=True)
sys.stdin.read()
"""

TORCH_MASTER = """\
import sys
from datetime import timedelta
import torch.distributed as d
m = d.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=timedelta(seconds=600),
               wait_for_workers=False)
print(m.port, flush=True)
sys.stdin.read()
"""


def start_master(code: str) -> Server:
    env = {k: v for k, v in os.environ.items() if k != "MPITENSOR_SECRET"}
    # (torch's master warns once per client that it cannot name the client's host)
    proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"the store master did not start (said {line!r})")
    return Server(proc, int(line))


# ------------------------------------------------------------------ growth fit
def growth(ns: Sequence[int], ys: Sequence[float]) -> Tuple[Optional[float], Optional[float]]:
    """(b of a*N^b fitted by least squares on log-log, y(2048)/y(1024)); None where unknown."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y and y > 0]
    b = None
    if len(pts) >= 2:
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        if sxx > 0:
            b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    by = dict(zip(ns, ys))
    ratio = by[2048] / by[1024] if by.get(1024) and by.get(2048) is not None else None
    return b, ratio


# ------------------------------------------------------------------ mpi_init: the helper
def _hex_text(nbytes: int, seed: int) -> str:
    """A value as MPICH encodes ``nbytes`` bytes of an address: hex, with runs of zero bytes
    shortened (``[N]``); recorded: 5,083-6,007 characters for 4,096 bytes, so 0.7 * 2 a byte."""
    return (f"{seed:08X}" * nbytes)[:max(1, int(1.4 * nbytes))]


def _mpich_rank(rank: int, n: int, token: str, addr_bytes: int, count: List[int],
                clamp_vallen: int = 0, per_host: int = PER_HOST,
                shared: Optional[Dict[Tuple[str, int], List[bytes]]] = None
                ) -> Generator[bytes, bytes, None]:
    """What one MPICH 5.0.2 rank sends the helper in ``MPI_Init``, adapting to the answers
    as MPICH does (recorded from real ranks on fake hosts: see the module's docstring);
    ``count`` collects [requests, node-address requests]. ``addr_bytes``: the size of the
    address each host's first rank puts (0: no node-address exchange); ``clamp_vallen``: a
    client that shortens the value length it uses to this (MPICH 4.0-4.1 do, to 674).
    Each line is sent and each reply received as bytes with its ``\\n``; ``shared`` keeps
    the node-address gets, the same lines for every first rank, made once a run (what is
    timed is the helper, not the making of these lines).
    ``tests/test_pmi_ranks.py`` checks these lines against real ranks'."""
    # (one yield each: a reply is sent into this generator, which a list iterator refuses)
    yield f"cmd=mpitensor-hello rank={rank} token={token}\n".encode()
    yield b"cmd=init pmi_version=1 pmi_subversion=1\n"
    maxes = yield b"cmd=get_maxes\n"
    vallen = int(re.search(rb"vallen_max=(\d+)", maxes).group(1))  # type: ignore[union-attr]
    if clamp_vallen:
        vallen = min(vallen, clamp_vallen)
    yield b"cmd=get_appnum\n"
    kvs = (yield b"cmd=get_my_kvsname\n").rsplit(b"kvsname=", 1)[1].strip().decode()
    answer = yield f"cmd=get kvsname={kvs} key=PMI_process_mapping\n".encode()
    mapped = b" rc=0 " in answer
    if not mapped:  # MPICH learns the hosts itself: every rank's host name, from every rank
        yield (f"cmd=put kvsname={kvs} key=hostname[{rank}] value=host{rank // per_host}\n"
               .encode())
        yield b"cmd=barrier_in\n"
        for i in range(n):
            if i != rank:
                yield f"cmd=get kvsname={kvs} key=hostname[{i}]\n".encode()
    yield f"cmd=get kvsname={kvs} key=PMI_hwloc_xmlfile\n".encode()
    yield f"cmd=get kvsname={kvs} key=PMI_mpi_memory_alloc_kinds\n".encode()
    hosts = (n + per_host - 1) // per_host
    if hosts == 1:
        return  # every rank on one host: MPICH passes no PMI barrier in MPI_Init
    root = rank % per_host == 0
    # MPICH's allgather of the first ranks' addresses: a value longer than fits in one is
    # put as a header key and segments of (vallen - 2) // 2 bytes, and got the same way
    segsize = (vallen - 2) // 2
    segs = [] if addr_bytes < segsize else \
        [min(segsize, addr_bytes - i) for i in range(0, addr_bytes, segsize)]
    if root and addr_bytes:
        key = f"-allgather-1-{rank}"
        count[1] += 1 + len(segs)
        if segs:
            yield f"cmd=put kvsname={kvs} key={key} value=segments={len(segs)}\n".encode()
            for i, size in enumerate(segs):
                yield (f"cmd=put kvsname={kvs} key={key}-seg-{i + 1}/{len(segs)} "
                       f"value={_hex_text(size, rank)}\n").encode()
        else:
            yield f"cmd=put kvsname={kvs} key={key} value={_hex_text(addr_bytes, rank)}\n".encode()
    yield b"cmd=barrier_in\n"
    if root and addr_bytes:
        gets = _node_gets(kvs, hosts, per_host, len(segs), shared)
        count[1] += len(gets)
        for line in gets:  # noqa: UP028 - yield from a list iterator refuses send()
            yield line  # every host's address, this one's too


def _node_gets(kvs: str, hosts: int, per_host: int, nsegs: int,
               shared: Optional[Dict[Tuple[str, int], List[bytes]]]) -> List[bytes]:
    """The gets of every host's address (its header key, then each segment), in order."""
    gets = None if shared is None else shared.get((kvs, nsegs))
    if gets is None:
        gets = []
        for h in range(hosts):
            key = f"-allgather-1-{h * per_host}"
            gets.append(f"cmd=get kvsname={kvs} key={key}\n".encode())
            gets += [f"cmd=get kvsname={kvs} key={key}-seg-{i + 1}/{nsegs}\n".encode()
                     for i in range(nsegs)]
        if shared is not None:
            shared[(kvs, nsegs)] = gets
    return gets


def _simulated_ranks(n: int, port: int, token: str, addr_bytes: int, clamp_vallen: int,
                     count: List[int]) -> Dict[int, list]:
    """Connect ``n`` simulated ranks to the helper, each having sent its first line: their
    state by file descriptor, ``[socket, generator, bytes of a reply so far]``."""
    shared: Dict[Tuple[str, int], List[bytes]] = {}
    ranks: Dict[int, list] = {}
    for r in range(n):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        gen = _mpich_rank(r, n, token, addr_bytes, count, clamp_vallen, shared=shared)
        ranks[sock.fileno()] = [sock, gen, b""]
        sock.setblocking(False)
        sock.send(next(gen))
        count[0] += 1
    return ranks


def _drive_ranks(ranks: Dict[int, list], count: List[int]) -> None:
    """Run the simulated ranks to their end: each reply read, checked and answered by the
    rank's next line, every ready rank at each wake-up (epoll, no selector objects: this
    process plays all N clients, and must cost less than the helper it measures)."""
    ep = select.epoll()
    try:
        for fd in ranks:
            ep.register(fd, select.EPOLLIN)
        left = len(ranks)
        while left:
            events = ep.poll(120.0)
            if not events:
                raise RuntimeError(f"the helper went silent with {left} ranks left")
            for fd, _ in events:
                st = ranks[fd]
                data = st[0].recv(1 << 16)
                if not data:
                    raise RuntimeError(f"the helper closed simulated rank fd {fd}")
                if st[2]:
                    data = st[2] + data
                if data[-1:] != b"\n":  # (one reply is awaited at a time: its end is the end)
                    st[2] = data
                    continue
                st[2] = b""
                # (the head only: a node address's reply is 6 KB)
                if b" rc=0" not in data[:48] and b"key_not_found" not in data[:64]:
                    raise RuntimeError(f"simulated rank fd {fd}: {data[:200]!r}")
                try:
                    line = st[1].send(data)
                except StopIteration:
                    left -= 1
                    ep.unregister(fd)
                    continue
                st[0].send(line)
                count[0] += 1
    finally:
        ep.close()


def mpi_init_run(n: int, hostnames: bool, addr_bytes: int,
                 clamp_vallen: int = 0) -> Dict[str, float]:
    """The helper serving ``n`` simulated MPICH ranks."""
    mapping = None if hostnames else _pmi.process_mapping(
        [f"host{r // PER_HOST}" for r in range(n)])
    h = _pmi.start_helper(n, 600.0, mapping=mapping)
    server = Server(h.proc, h.port)
    count = [0, 0]
    ranks: Dict[int, list] = {}
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        ranks = _simulated_ranks(n, h.port, h.token, addr_bytes, clamp_vallen, count)
        _drive_ranks(ranks, count)
        took, client_cpu = time.perf_counter() - t0, time.process_time() - c0
        out = server.finish()
        out.update(time=took, req=count[0], node_req=count[1], client_cpu=client_cpu,
                   load=os.getloadavg()[0])
        return out
    finally:
        for st in ranks.values():
            st[0].close()
        server.stop()


# ------------------------------------------------------------------ our store's wire, raw
_P = b"mpitensor/init/"
Reply = Tuple[int, List[bytes]]
# What a script yields: a request, a list of requests sent together (their replies come one
# at a time: the script yields None to read the next without sending), or RECONNECT: drop
# the connection, unread replies and all; the next request goes on a new one.
Script = Generator[Any, Optional[Reply], None]
RECONNECT = "reconnect"


def _ms(seconds: float) -> bytes:
    return wire.i64(int(math.ceil(seconds * 1000)))


def _wait_key(key: bytes, deadline_s: float, poll: Optional[float],
              get: bool = True, split: bool = False) -> Script:
    """``_rendezvous._wait`` on one key: one get that waits (a posted error sets the key to a
    mark: the waiters wake at once); ``split``: a wait, then a get; with ``poll``, as
    before, waits of ``poll`` seconds with a check of ``error`` after each that timed out.
    ``get=False``: the wait alone, as torch's clients do."""
    if get and not poll and not split:
        status, f = yield (wire.GET, [_ms(deadline_s), key])
        if status != wire.OK or f[0].startswith(b"mpitensor: an error"):
            raise RuntimeError(f"get of {key!r}: status {status}")
        return
    while True:
        status, _ = yield (wire.WAIT, [_ms(poll or deadline_s), key])
        if status == wire.OK:
            if get:
                status, f = yield (wire.GET, [_ms(deadline_s), key])
                if status != wire.OK or f[0].startswith(b"mpitensor: an error"):
                    raise RuntimeError("an error was posted")
            return
        if not poll:
            raise RuntimeError(f"wait for {key!r} timed out")
        _, f = yield (wire.CHECK, [_P + b"error"])
        if f[0] == b"\x01":
            raise RuntimeError("an error was posted")


def rendezvous_rank(rank: int, n: int, poll: Optional[float] = None, split: bool = False,
                    before: bool = False) -> Script:
    """What ``_arrive`` + ``join`` send the store for one rank (the helper's start left out);
    ``before``: as they did before 2026-11-29 03:00 (the world size a key of its own, and
    every rank waiting for all to arrive before it waits for ``mode``); ``split``: each wait
    a wait and then a get; ``poll``: the waits of before that (re-waits of 0.25 s)."""
    old = before or split or bool(poll)
    job = json.dumps({"id": "", "source": "", "rank": rank, "pid": 100000 + rank,
                      "host": f"host{rank // PER_HOST}", "parent": "bench:1",
                      "start": time.time(), **({} if old else {"world_size": n})}).encode()
    _, f = yield (wire.CAS, [_P + b"job", b"", job])
    if old:
        _, f = yield (wire.CAS, [_P + b"world_size", b"", f"{n} {rank}".encode()])
        if f[0].split(b" ")[0] != str(n).encode():
            raise RuntimeError("world sizes differ")
    elif json.loads(f[0])["world_size"] != n:
        raise RuntimeError("world sizes differ")
    me = json.dumps({"rank": rank, "world_size": n, "host": f"host{rank // PER_HOST}",
                     "netns": "4:4026531840", "pidns": "4:4026531836", "pid": 100000 + rank,
                     "mpi": "fresh"}).encode()
    claim = (wire.CAS, [_P + f"rank/{rank}".encode(), b"", me])
    count = (wire.ADD, [_P + b"arrived", wire.i64(1)])
    waited = _P + (b"arrived/all" if old or rank == 0 else b"mode")
    if old:
        _, f = yield claim
        _, total = yield count
    else:  # together with the get that waits, as _claim sends them to our TCPStore
        _, f = yield [claim, count, (wire.GET, [_ms(600.0), waited])]
        _, total = yield None  # (None: read the next reply, send nothing)
    if f[0] != me:
        raise RuntimeError(f"rank {rank} claimed twice")
    last = wire.as_i64(total[0]) >= n
    if last and not old:
        yield RECONNECT  # the get is not read: a new connection sets arrived/all
    if last:
        yield (wire.SET, [_P + b"arrived/all", b"1"])
    if old or last:
        if old or rank == 0:
            yield from _wait_key(waited, 600.0, poll, get=not poll, split=split)
    else:
        status, f = yield None  # the get sent with the claim
        if status != wire.OK or f[0].startswith(b"mpitensor: an error"):
            raise RuntimeError(f"get of {waited!r}: status {status}")
    if rank == 0:
        keys = [_P + f"rank/{i}".encode() for i in range(n)]
        if not old:  # _gather: a check, then the claims
            _, f = yield (wire.CHECK, keys)
            if f[0] != b"\x01":
                raise RuntimeError("a claim is missing")
        status, f = yield (wire.MGET, [_ms(600.0)] + keys)
        if status != wire.OK or len(f) != n:
            raise RuntimeError("multi_get of the rank records failed")
        mode = json.dumps({"kind": "pmi", "port": 40000, "token": "0" * 32,
                           "unix": "mpitensor-pmi-" + "0" * 24, "host": "host0",
                           "addr": "127.0.0.1"}).encode()
        yield (wire.SET, [_P + b"mode", mode])
    if old or rank == 0 or last:
        yield from _wait_key(_P + b"mode", 600.0, poll, split=split)


def env_rank(rank: int, n: int) -> Script:
    """torch's env:// pattern on our store: add a counter, the last sets a key, wait for it."""
    _, f = yield (wire.ADD, [b"counter", wire.i64(1)])
    if wire.as_i64(f[0]) == n:
        yield (wire.SET, [b"done", b"1"])
    yield from _wait_key(b"done", 600.0, None, get=False)


class _Raw:
    __slots__ = ("rank", "sock", "script", "buf", "greeted", "done", "resume")

    def __init__(self, rank: int, script: Script) -> None:
        self.rank, self.script = rank, script
        self.sock = socket.socket()  # (replaced by _connect_raw's)
        self.buf, self.greeted, self.done = bytearray(), False, 0.0
        self.resume = False  # a new connection of a script under way (RECONNECT)


def _connect_raw(sel: selectors.BaseSelector, port: int, c: _Raw) -> None:
    """Give ``c`` a new connection to the master (its greeting awaited by the driver)."""
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sock.close()
    c.sock, c.buf, c.greeted = sock, bytearray(), False
    sel.register(sock, selectors.EVENT_READ, c)


def _frames(req: Any) -> Tuple[bytes, int]:
    """A request, or several sent together, as bytes; and how many requests."""
    reqs = req if isinstance(req, list) else [req]
    return b"".join(wire.encode(op, fields) for op, fields in reqs), len(reqs)


def drive_ours(port: int, starts: Sequence[float],
               script: Callable[[int, int], Script]) -> Dict[str, float]:
    """Run ``script`` for every rank against our master on ``port``, rank ``r`` connecting at
    ``starts[r]`` seconds; returns the time from the last arrival to the last rank done, and
    the requests sent."""
    n = len(starts)
    order = sorted(range(n), key=lambda r: starts[r])
    sel = selectors.DefaultSelector()
    clients: List[_Raw] = []
    count = [0, n]  # requests sent, ranks not done
    nxt = 0
    t0 = time.perf_counter()
    try:
        while count[1]:
            now = time.perf_counter() - t0
            while nxt < n and starts[order[nxt]] <= now:
                r = order[nxt]
                nxt += 1
                c = _Raw(r, script(r, n))
                _connect_raw(sel, port, c)
                clients.append(c)
            wait = 30.0 if nxt >= n else max(0.0, starts[order[nxt]] - now)
            events = sel.select(timeout=min(wait, 30.0))
            if not events and nxt >= n:
                raise RuntimeError(f"the store went silent with {count[1]} ranks left")
            for key, _ in events:
                _on_reply(key.data, sel, port, count, t0)
        last_done = max(c.done for c in clients)
        return {"time": last_done - max(starts), "total": last_done, "req": count[0]}
    finally:
        for c in clients:
            c.sock.close()


def _on_reply(c: _Raw, sel: selectors.BaseSelector, port: int, count: List[int],
              t0: float) -> None:
    """Read what the master sent ``c`` and run its script on: the greeting is answered with
    the first request (as our client sends it, MSG_MORE), each reply with the next."""
    try:
        data = c.sock.recv(1 << 20)
    except (BlockingIOError, InterruptedError):
        return
    if not data:
        raise RuntimeError(f"the store closed simulated rank {c.rank}")
    c.buf += data
    replies: List[Optional[Reply]] = []
    if not c.greeted:
        if len(c.buf) < len(wire.MAGIC):
            return
        if bytes(c.buf[:len(wire.MAGIC)]) != wire.MAGIC:
            raise RuntimeError("not our store's greeting")
        del c.buf[:len(wire.MAGIC)]
        c.greeted = True
        replies.append(None)  # a new connection: the script's first (or next) request
    while True:
        size = wire.frame_length(c.buf, 0, wire.MAX_REPLY)
        if size is None or len(c.buf) < 4 + size:
            break
        status, fields = wire.decode(memoryview(bytes(c.buf[4:4 + size])))
        del c.buf[:4 + size]
        if status not in (wire.OK, wire.TIMEOUT):
            raise RuntimeError(f"rank {c.rank}: status {status} {fields!r}")
        replies.append((status, fields))
    for reply in replies:
        try:
            if reply is None and not c.resume:
                req = next(c.script)
            else:
                req = c.script.send(reply)
        except StopIteration:
            c.done = time.perf_counter() - t0
            count[1] -= 1
            sel.unregister(c.sock)
            return
        c.resume = False
        if req is RECONNECT:
            sel.unregister(c.sock)
            c.sock.close()
            c.resume = True
            _connect_raw(sel, port, c)
            return
        if req is None:
            continue
        frame, k = _frames(req)
        if reply is None:
            frame = wire.MAGIC + frame
        count[0] += k
        if len(frame) > 1 << 15:
            c.sock.setblocking(True)
            c.sock.sendall(frame)
            c.sock.setblocking(False)
        else:
            c.sock.send(frame)


# ------------------------------------------------------------------ torch's client objects
TORCH_CHUNK = """\
import json, sys, threading, time
from datetime import timedelta
import torch.distributed as d
n = int(sys.argv[1])
mine = json.loads(sys.stdin.readline())  # [[rank, start offset], ...]
print("ready", flush=True)  # torch imported: the start times count from here
port, t0 = sys.stdin.readline().split()
port, t0 = int(port), float(t0)
threading.stack_size(256 * 1024)
done, errors, keep = [], [], []
lock = threading.Lock()
def rank(r, at):
    try:
        time.sleep(max(0.0, t0 + at - time.time()))
        s = d.TCPStore("127.0.0.1", port, None, is_master=False,
                       timeout=timedelta(seconds=600), wait_for_workers=False)
        if s.add("counter", 1) == n:
            s.set("done", "1")
        s.wait(["done"])
        with lock:
            done.append(time.time())
            keep.append(s)
    except BaseException as exc:
        with lock:
            errors.append(repr(exc))
threads = [threading.Thread(target=rank, args=(r, at), daemon=True) for r, at in mine]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"last": max(done) if done else 0.0, "done": len(done),
                  "errors": errors[:3], "n_errors": len(errors)}), flush=True)
"""


def torch_clients(starts: Sequence[float], chunk: int) -> List[subprocess.Popen]:
    """The processes of torch's clients, ``chunk`` threads each (they import torch while the
    master starts)."""
    n = len(starts)
    procs: List[subprocess.Popen] = []
    try:
        for lo in range(0, n, chunk):
            p = subprocess.Popen([sys.executable, "-c", TORCH_CHUNK, str(n)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
            procs.append(p)
            assert p.stdin is not None
            p.stdin.write(json.dumps([[r, starts[r]] for r in range(lo, min(n, lo + chunk))])
                          + "\n")
            p.stdin.flush()
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise
    return procs


def drive_torch(procs: List[subprocess.Popen], port: int,
                starts: Sequence[float]) -> Dict[str, float]:
    """torch's env:// pattern with torch's own clients (:func:`torch_clients`)."""
    n = len(starts)
    last, errors = 0.0, []
    try:
        for p in procs:  # every chunk has imported torch
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a torch client process did not start")
        t0 = time.time() + 0.2
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{port} {t0!r}\n")
            p.stdin.close()
        for p in procs:
            assert p.stdout is not None
            out = p.stdout.read()
            p.wait()
            if p.returncode or not out.strip():
                raise RuntimeError(f"a torch client process failed (exit code {p.returncode})")
            info = json.loads(out.strip().splitlines()[-1])
            last = max(last, info["last"])
            errors += info["errors"]
            if info["n_errors"]:
                raise RuntimeError(f"{info['n_errors']} torch clients failed, e.g. "
                                   f"{errors[:2]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"time": last - (t0 + max(starts)), "total": last - t0, "req": 2 * n + 1}


def store_run(part: str, n: int, spread: float, chunk: int, seed: int) -> Dict[str, float]:
    rng = random.Random(seed + n)
    starts = [rng.uniform(0.0, spread) for _ in range(n)]
    procs = torch_clients(starts, chunk) if part == "env_torch" else []
    try:
        server = start_master(TORCH_MASTER if part == "env_torch" else OUR_MASTER)
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise
    try:
        if part == "rendezvous":
            out = drive_ours(server.port, starts, rendezvous_rank)
        elif part == "rendezvous_6":
            out = drive_ours(server.port, starts,
                             lambda r, n: rendezvous_rank(r, n, before=True))
        elif part == "rendezvous_8":
            out = drive_ours(server.port, starts, lambda r, n: rendezvous_rank(r, n, None, True))
        elif part == "rendezvous_poll":
            out = drive_ours(server.port, starts, lambda r, n: rendezvous_rank(r, n, 0.25))
        elif part == "env_ours":
            out = drive_ours(server.port, starts, env_rank)
        else:
            out = drive_torch(procs, server.port, starts)
        out.update(server.finish())
        out["load"] = os.getloadavg()[0]
        return out
    finally:
        server.stop()


# ------------------------------------------------------------------ real ranks
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


# ------------------------------------------------------------------ report
_HELPER_COLUMNS = [("time", "MPI_Init s", "{:9.3f}"), ("cpu", "helper CPU s", "{:12.3f}"),
                   ("client_cpu", "clients CPU s", "{:13.3f}"), ("hwm", "peak MiB", "{:8.1f}"),
                   ("grow", "grew MiB", "{:8.1f}"), ("req", "requests", "{:9d}")]
_LOAD = [("load", "load", "{:5.1f}")]  # the 1-minute load average as each run ended
_NODE_REQ = [("node_req", "node_req", "{:9d}")]
COLUMNS = {  # part -> [(key, heading, format)]
    "mpi_init": _HELPER_COLUMNS + _NODE_REQ + _LOAD,
    "mpi_init_1024": _HELPER_COLUMNS + _NODE_REQ + _LOAD,
    "mpi_init_own": _HELPER_COLUMNS + _LOAD,
    "hostnames": _HELPER_COLUMNS + _LOAD,
}
for _part in ("rendezvous", "rendezvous_6", "rendezvous_8", "rendezvous_poll", "env_ours",
              "env_torch"):
    COLUMNS[_part] = [("time", "after last s", "{:12.3f}"), ("total", "total s", "{:8.3f}"),
                      ("cpu", "master CPU s", "{:12.3f}"), ("hwm", "peak MiB", "{:8.1f}"),
                      ("grow", "grew MiB", "{:8.1f}"), ("req", "requests", "{:9d}")] + _LOAD

TITLES = {
    "mpi_init": "mpi_init: the PMI helper (own process) serving N simulated MPICH ranks, "
                "mapping answered",
    "mpi_init_1024": "mpi_init_1024: the same with vallen_max 1024, as the helper answered "
                     "before (a node address as 10 keys)",
    "mpi_init_own": "mpi_init_own: the same without MPICH's node-address exchange (the "
                    "helper's own work: start-up lines, one barrier)",
    "hostnames": "hostnames: the same without PMI_process_mapping (each rank gets every "
                 "host name)",
    "rendezvous": "rendezvous: our TCPStore master (own process), _arrive + join of N ranks",
    "rendezvous_6": "rendezvous_6: the same as before 2026-11-29 03:00 (6 requests a rank: the "
                    "world size a key of its own, every rank waiting for all, then for mode)",
    "rendezvous_8": "rendezvous_8: the same with each wait a wait and then a get (8 requests a "
                    "rank, as before)",
    "rendezvous_poll": "rendezvous_poll: the same with the waits as before (0.25 s re-waits, "
                       "each followed by a check of the error key)",
    "env_ours": "env_ours: torch's env:// pattern (add, last sets, wait) on our TCPStore master",
    "env_torch": "env_torch: the same pattern on torch.distributed.TCPStore's master, torch "
                 "clients",
}


def report(part: str, rows: Dict[int, List[Dict[str, float]]]) -> Dict[int, Dict[str, float]]:
    """Print one part's table (medians over the repetitions) and growth fits; the medians,
    with each size's lowest and highest load (``load_lo``, ``load_hi``)."""
    cols = COLUMNS[part]
    print(f"\n{TITLES[part]}")
    print("  " + "  ".join([f"{'N':>5}"] + [h for _, h, _ in cols]))
    med: Dict[int, Dict[str, float]] = {}
    for n, runs in sorted(rows.items()):
        med[n] = {k: statistics.median(r[k] for r in runs) for k, _, _ in cols}
        med[n].update(load_lo=min(r["load"] for r in runs), load_hi=max(r["load"] for r in runs),
                      runs=len(runs))
        cells = [f"{n:5d}"]
        for k, h, fmt in cols:
            v = med[n][k]
            cells.append(fmt.format(int(v) if "d}" in fmt else v).rjust(len(h)))
        print(f"  {part} " + "  ".join(cells))
    ns = sorted(med)
    for k, h, _ in cols:
        if k == "load":
            continue
        b, ratio = growth(ns, [med[n][k] for n in ns])
        print(f"  fit {part} {h.strip()}: b = " + ("  n/a" if b is None else f"{b:5.2f}")
              + ", 2048/1024 = " + ("n/a" if ratio is None else f"{ratio:.2f}"))
    return med


# (part, size, what, the quantity, its limit, the words of the target); size 0: the ratio of
# the quantity at 2048 ranks to that at 1024
TARGETS = [
    ("mpi_init", 1024, "time", 2.0, "MPI_Init of 1,024 ranks (wall s) <="),
    ("mpi_init", 4096, "time", 30.0, "MPI_Init of 4,096 ranks (wall s) <="),
    ("rendezvous", 1024, "cpu", 0.5, "rendezvous master CPU at 1,024 ranks (s) <"),
    ("rendezvous", 0, "cpu", 2.5, "rendezvous master CPU, 2,048 / 1,024 ranks <="),
    ("mpi_init_own", 0, "cpu", 2.5, "helper's own CPU, 2,048 / 1,024 ranks <="),
]


def verdicts(meds: Dict[str, Dict[int, Dict[str, float]]]) -> List[str]:
    """One line per target of issue 30: MET, NOT MET or NOT RUN, the value, and the load
    average during the runs it comes from (a wall time on a loaded machine stretches)."""
    out = []
    for part, n, key, limit, words in TARGETS:
        med = meds.get(part, {})
        sizes = [n] if n else [1024, 2048]
        if not all(s in med for s in sizes):
            need = ",".join(str(s) for s in sizes)
            out.append(f"  NOT RUN  {words} {limit:g}: needs part {part} at N={need} "
                       "(--targets runs them all)")
            continue
        value = med[n][key] if n else med[2048][key] / max(med[1024][key], 1e-9)
        ok = value < limit if words.endswith("<") else value <= limit
        lo = min(med[s]["load_lo"] for s in sizes)
        hi = max(med[s]["load_hi"] for s in sizes)
        runs = min(int(med[s]["runs"]) for s in sizes)
        out.append(f"  {'MET    ' if ok else 'NOT MET'}  {words} {limit:g}: {value:.3f} "
                   f"(median of {runs}; load average {lo:.1f}-{hi:.1f} during those runs)")
    return out


def _options() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake", default="16,64,256,1024",
                    help="simulated world sizes, comma separated")
    ap.add_argument("--parts", default="mpi_init,mpi_init_1024,mpi_init_own,rendezvous,"
                                       "rendezvous_6,rendezvous_8,rendezvous_poll,env_ours,"
                                       "env_torch")
    ap.add_argument("--targets", action="store_true",
                    help="what issue 30's targets need, and nothing else: --fake "
                         "1024,2048,4096 --parts mpi_init,mpi_init_own,rendezvous --ranks '' "
                         "(give --reps 3 for medians)")
    ap.add_argument("--hostnames-max", type=int, default=0,
                    help="also run the helper without the mapping (N^2) up to this N")
    ap.add_argument("--addr-bytes", type=int, default=4096,
                    help="bytes of the address each host's first rank puts (MPICH 5.0.2: "
                         "4096)")
    ap.add_argument("--spread", type=float, default=5.0,
                    help="seconds over which the simulated ranks arrive at the store")
    ap.add_argument("--chunk", type=int, default=1024,
                    help="torch client threads per process")
    ap.add_argument("--ranks", default="2,4", help="real ranks ('' for none)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--res-options", default="timeout:1 attempts:1",
                    help="RES_OPTIONS for every process started here ('' leaves it unset): "
                         "torch's store master resolves each client's address, and where the "
                         "name server does not answer (this sandbox) each lookup waited 5 s")
    args = ap.parse_args()
    if args.targets:
        args.fake, args.parts, args.ranks = "1024,2048,4096", "mpi_init,mpi_init_own,rendezvous", ""
    for part in args.parts.split(","):
        if part and (part not in COLUMNS or part == "hostnames"):
            ap.error(f"unknown part {part!r}")
    return args


def run_parts(args: argparse.Namespace) -> Dict[str, Dict[int, Dict[str, float]]]:
    """Every part at every size, ``--reps`` times each; each part's medians by size."""
    sizes = [int(x) for x in args.fake.split(",") if x]
    parts = [p for p in args.parts.split(",") if p]
    if args.hostnames_max:
        parts.insert(parts.index("mpi_init") + 1 if "mpi_init" in parts else 0, "hostnames")
    meds = {}
    for part in parts:
        rows: Dict[int, List[Dict[str, float]]] = {}
        for n in sizes:
            if part == "hostnames" and n > args.hostnames_max:
                continue
            for rep in range(args.reps):
                if part.startswith("mpi_init") or part == "hostnames":
                    r = mpi_init_run(n, part == "hostnames",
                                     0 if part == "mpi_init_own" else args.addr_bytes,
                                     1024 if part == "mpi_init_1024" else 0)
                else:
                    r = store_run(part, n, args.spread, args.chunk, args.seed + rep)
                rows.setdefault(n, []).append(r)
        meds[part] = report(part, rows)
    return meds


def main() -> int:
    args = _options()
    if args.res_options and "RES_OPTIONS" not in os.environ:
        os.environ["RES_OPTIONS"] = args.res_options
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # N sockets here
    # what was imported stays out of the collector's full passes: this process plays all N
    # clients, and its own pauses would be timed as the servers'
    gc.collect()
    gc.freeze()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"host {socket.gethostname()}, {os.cpu_count()} CPUs, python "
          f"{sys.version.split()[0]}, commit {commit}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.1f} at start (wall times on a loaded machine stretch; CPU "
          "times of the server processes do not)")
    print(f"{PER_HOST} simulated ranks per host; arrivals at the store spread over "
          f"{args.spread:g} s; node addresses of {args.addr_bytes} bytes; RES_OPTIONS="
          f"{os.environ.get('RES_OPTIONS', '')!r}")
    meds = run_parts(args)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    print("\ntargets of issue 30 (a wall time is met only as fast as the machine lets it: "
          "see the load)")
    print("\n".join(verdicts(meds)))
    real_ranks(args)
    return 0


def real_ranks(args: argparse.Namespace) -> None:
    """Real processes meeting through ``init_process_group``, beside ``mpiexec``."""
    ranks = [int(x) for x in args.ranks.split(",") if x]
    if not ranks:
        return
    with tempfile.TemporaryDirectory() as d:
        rank = os.path.join(d, "rank.py")
        Path(rank).write_text(textwrap.dedent(RANK))
        under = os.path.join(d, "under.py")
        Path(under).write_text(textwrap.dedent(UNDER_MPIEXEC))
        print("\nreal ranks: seconds from the last rank's call (median of reps)")
        for n in ranks:
            ours, theirs = [], []
            for _ in range(args.reps):  # alternate, so that load hits both
                ours.append(ranks_run(n, rank))
                theirs.append(mpiexec_run(n, under))
            a, b = statistics.median(ours), statistics.median(theirs)
            print(f"  N={n}  init_process_group (rendezvous) {a:.3f} s  |  MPI_Init under "
                  f"mpiexec {b:.3f} s")


if __name__ == "__main__":
    sys.exit(main())
