"""The hosts of an elastic run (``mpitensor-run --hostfile FILE --nnodes MIN:MAX``).

Before every start of the job (the first one and each restart) :meth:`HostPool.pick` asks every
host of the hostfile whether it can run a rank now (``probe``: in practice a one-rank
``mpiexec`` of ``python -c ""`` on that host alone, through the same launcher options as the
job), all at once. The job then runs on the hosts that answered, in the hostfile's order, at
most MAX of them, through a hostfile of its own; with fewer than MIN it waits, asking again
every few seconds, until ``join_timeout``, and then gives up naming the hosts that did not
answer and why. A host lost in one attempt is left out of the next, and one that answers again
is taken back (up to MAX): the world size follows the hosts, as torchrun's elastic rendezvous
does with its nodes.

While the job runs, :meth:`HostPool.keep_alive` asks its hosts again every
``keep_alive_interval`` seconds. A lost host gives MPI no error to raise (its ranks' peers wait
for messages that never come, and MPICH's launcher waits for its proxy), so a host that fails
``keep_alive_max_attempt`` asks in a row ends the attempt, and the restart goes on without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

from . import HostEntry

#: seconds between two rounds of probes while fewer than MIN hosts answer
RETRY_S = 3.0
#: torchrun's default join timeout (``--rdzv-conf join_timeout=...``)
JOIN_TIMEOUT_S = 600.0
#: torchrun's keep-alive defaults (``--rdzv-conf keep_alive_interval=...,keep_alive_max_attempt=``)
KEEP_ALIVE_INTERVAL_S = 5.0
KEEP_ALIVE_MAX_ATTEMPT = 3

Probe = Callable[[HostEntry, str], Tuple[bool, str]]


class NotEnoughHosts(Exception):
    """Fewer than MIN hosts answered within the join timeout."""


class HostPool:
    """Chooses, before each start, the hosts that answer (see the module docstring).

    Args:
        entries: the hostfile's hosts, in order.
        syntax: the hostfile's syntax (``"mpich"``, ``"openmpi"`` or ``"plain"``): the job's
            own hostfile is written in it.
        low, high: ``--nnodes MIN:MAX``.
        per_node: ranks per host.
        probe: ``probe(entry, scratch_dir) -> (answered, why not)``.
        join_timeout: how long to wait for MIN hosts.
        say: where progress lines go.
    """

    def __init__(self, entries: Sequence[HostEntry], syntax: str, low: int, high: int,
                 per_node: int, probe: Probe, join_timeout: float = JOIN_TIMEOUT_S,
                 say: Callable[[str], None] = lambda line: None,
                 keep_alive_interval: float = KEEP_ALIVE_INTERVAL_S,
                 keep_alive_max_attempt: int = KEEP_ALIVE_MAX_ATTEMPT) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"need 1 <= MIN <= MAX, got {low}:{high}")
        self.entries = list(entries)
        self.syntax = syntax
        self.low, self.high, self.per_node = low, high, per_node
        self.probe = probe
        self.join_timeout = join_timeout
        self.say = say
        self.keep_alive_interval = keep_alive_interval
        self.keep_alive_max_attempt = keep_alive_max_attempt
        self.dir = tempfile.mkdtemp(prefix="mpitensor-run-hosts-")
        self.hosts: List[HostEntry] = []  # those of the latest start
        self.nprocs = 0

    def close(self) -> None:
        """Remove the scratch files."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def _ask_all(self, entries: Optional[Sequence[HostEntry]] = None
                 ) -> List[Tuple[HostEntry, bool, str]]:
        """Probe the hosts (default: all) at once; (entry, answered, why not), in order."""
        entries = self.entries if entries is None else list(entries)
        results: List[Optional[Tuple[bool, str]]] = [None] * len(entries)

        def ask(i: int) -> None:
            with tempfile.TemporaryDirectory(dir=self.dir) as scratch:
                try:
                    results[i] = self.probe(entries[i], scratch)
                except Exception as exc:  # noqa: BLE001 - a probe that breaks: a failed host
                    results[i] = (False, f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=ask, args=(i,), daemon=True)
                   for i in range(len(entries))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [(e, *r) for e, r in zip(entries, results) if r is not None]

    def keep_alive(self, stop: threading.Event,
                   lost: Callable[[HostEntry, str], None]) -> None:
        """Until ``stop`` is set, ask the latest start's hosts every ``keep_alive_interval``
        seconds; call ``lost(host, why)`` (once) for a host that failed
        ``keep_alive_max_attempt`` asks in a row, and return."""
        misses = {e.host: 0 for e in self.hosts}
        while not stop.wait(self.keep_alive_interval):
            for e, ok, why in self._ask_all(self.hosts):
                if stop.is_set():
                    return
                misses[e.host] = 0 if ok else misses[e.host] + 1
                if misses[e.host] >= self.keep_alive_max_attempt:
                    lost(e, f"{misses[e.host]} keep-alive asks in a row failed, the last: {why}")
                    return

    def all_answer(self) -> bool:
        """Whether every host of the latest start answers one ask now."""
        return all(ok for _, ok, _ in self._ask_all(self.hosts))

    def pick(self, attempt: int) -> Tuple[str, int]:
        """Choose the hosts for attempt ``attempt``; return (its hostfile, its rank count).

        Raises:
            NotEnoughHosts: fewer than MIN answered until the join timeout.
        """
        deadline = time.monotonic() + self.join_timeout
        waited = False
        while True:
            answers = self._ask_all()
            alive = [e for e, ok, _ in answers if ok]
            lost = [(e, why) for e, ok, why in answers if not ok]
            if len(alive) >= self.low:
                break
            if time.monotonic() + RETRY_S > deadline:
                raise NotEnoughHosts(
                    f"--nnodes {self.low}:{self.high} needs at least {self.low} host(s), but "
                    f"only {len(alive)} of the hostfile's {len(self.entries)} answered within "
                    f"--rdzv-conf join_timeout={self.join_timeout:g} s: "
                    + "; ".join(f"{e.host}: {why}" for e, why in lost))
            if not waited:
                self.say(f"{len(alive)} of {len(self.entries)} host(s) answer, --nnodes "
                         f"{self.low}:{self.high} needs {self.low}: asking again every "
                         f"{RETRY_S:g} s for up to {self.join_timeout:g} s ("
                         + "; ".join(f"{e.host}: {why}" for e, why in lost) + ")")
                waited = True
            time.sleep(RETRY_S)
        chosen = alive[:self.high]
        nprocs = len(chosen) * self.per_node
        before = [e.host for e in self.hosts]
        if [e.host for e in chosen] != before or lost:
            parts = [f"{'starting' if attempt == 0 else 'restarting'} on {len(chosen)} of "
                     f"{len(self.entries)} host(s) ({', '.join(e.host for e in chosen)}), "
                     f"{nprocs} rank(s)"]
            if lost:
                parts.append("left out, not answering: "
                             + "; ".join(f"{e.host} ({why})" for e, why in lost))
            spare = alive[self.high:]
            if spare:
                parts.append(f"spare beyond --nnodes MAX {self.high}: "
                             + ", ".join(e.host for e in spare))
            self.say("; ".join(parts))
        self.hosts, self.nprocs = chosen, nprocs
        path = os.path.join(self.dir, f"hostfile.{attempt}")
        with open(path, "w") as f:
            for e in chosen:
                f.write(_line(e, self.syntax) + "\n")
        stale = os.path.join(self.dir, f"hostfile.{attempt - 1}")
        if os.path.exists(stale):
            os.unlink(stale)
        return path, nprocs


def _line(e: HostEntry, syntax: str) -> str:
    if e.slots is None:
        return e.host
    return f"{e.host} slots={e.slots}" if syntax == "openmpi" else f"{e.host}:{e.slots}"
