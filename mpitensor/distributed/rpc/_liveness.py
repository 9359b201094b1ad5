"""Noticing a worker that died without a word (SIGKILL, the OOM killer, a crash).

A worker that leaves through ``shutdown`` or its exit hook tells the others; one killed
outright sends nothing, and MPI tells nothing either: under the MPICH wheel a message to a dead
rank on the same node is queued in shared memory as if it were alive, and a receive from it
simply never completes (``MPI_ERR_PROC_FAILED`` needs ULFM, which this MPICH does not offer in a
usable form; see docs/launching.md). Under plain ``mpiexec`` hydra ends the whole job soon
after a rank dies of a signal (measured here: 0.5-1.2 s, with or without
``-disable-auto-cleanup``), but jobs whose launcher keeps the survivors running (a wrapper
between hydra and the rank, ``srun --no-kill``, elastic launchers) would wait for every
call's deadline, 60 s by default. Two side channels close that gap, both driven by the
progress thread, and only for peers this worker waits on (calls awaiting replies; every live
peer during a graceful shutdown), every :data:`CHECK_EVERY_S`:

* **the process table** for peers in this process's PID namespace on this boot (known from
  the identities exchanged by ``init_rpc``): ``/proc/<pid>/stat`` gone, a zombie, or a different
  start time (the pid reused) means the peer is dead. Definitive and cheap (about 10 µs);
* **a heartbeat** for the others (other hosts, or where ``/proc`` is unreadable): a peer that
  has sent nothing for :data:`PING_AFTER_S` gets a ``PING``, which its progress thread answers
  at once with a ``PONG`` whatever its workers are doing; a peer silent for
  :data:`SILENCE_S` after a ping is presumed dead. A live process cannot be silent that long
  unless it holds Python's GIL for seconds in one C call.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Tuple

__all__: list = []  # private: used by _agent

CHECK_EVERY_S = 0.2  # how often the peers waited on are checked
PING_AFTER_S = 1.0  # a peer waited on and silent this long is pinged (heartbeat peers)
SILENCE_S = 5.0  # a pinged peer silent this long is presumed dead
PID_CHECK = True  # use the process table where it can (tests turn it off to try the heartbeat)

Identity = Tuple[str, int, int]  # (PID namespace and boot, pid, start time in clock ticks)


def identity() -> Optional[Identity]:
    """This process as a peer on the same host can check it; None where /proc cannot tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        space = f"{boot}/{os.readlink('/proc/self/ns/pid')}"
        pid = os.getpid()
        start = _stat(pid)[1]
    except (OSError, ValueError, IndexError):
        return None
    return (space, pid, start)


def _stat(pid: int) -> Tuple[bytes, int]:
    """(state letter, start time) from ``/proc/<pid>/stat`` (raises OSError if it is gone)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()  # the name in (...) may hold spaces
    return fields[0], int(fields[19])


def pid_dead(pid: int, start: int) -> bool:
    """Whether the process ``pid`` that started at ``start`` has died (False if unsure)."""
    try:
        state, started = _stat(pid)
    except FileNotFoundError:
        return True
    except (OSError, ValueError, IndexError):
        return False  # unreadable (hidepid, say): say nothing rather than something wrong
    return state in (b"Z", b"X") or started != start


class PeerWatch:
    """The liveness state of the peers, kept by whichever thread drives the agent's progress.

    ``seen[r]`` is set by the receiving code for every message from ``r``; :meth:`check` reads
    and clears it.
    """

    def __init__(self, rank: int, identities: List[Optional[Identity]]) -> None:
        mine = identities[rank]
        self.local: Dict[int, Tuple[int, int]] = {}
        if mine is not None and PID_CHECK:
            self.local = {r: (ident[1], ident[2]) for r, ident in enumerate(identities)
                          if r != rank and ident is not None and ident[0] == mine[0]}
        self.seen = [0] * len(identities)
        self.quiet_since: Dict[int, float] = {}
        self.pinged: Dict[int, float] = {}
        self.next_at = 0.0

    def check(self, now: float, targets: Iterable[int]) -> Tuple[List[int], List[Tuple[int, str]]]:
        """Check the peers in ``targets``: (peers to ping now, [(dead peer, why)])."""
        self.next_at = now + CHECK_EVERY_S
        pings: List[int] = []
        dead: List[Tuple[int, str]] = []
        watched = set()
        for r in targets:
            local = self.local.get(r)
            if local is not None:
                if pid_dead(*local):
                    dead.append((r, f"its process (pid {local[0]}, on this host) is gone: "
                                    "killed (SIGKILL, the OOM killer) or crashed"))
                continue
            watched.add(r)
            if self.seen[r]:
                self.seen[r] = 0
                self.quiet_since[r] = now
                self.pinged.pop(r, None)
                continue
            quiet = self.quiet_since.setdefault(r, now)
            ping = self.pinged.get(r)
            if ping is None:
                if now - quiet >= PING_AFTER_S:
                    self.pinged[r] = now
                    pings.append(r)
            elif now - ping >= SILENCE_S:
                dead.append((r, f"it answered no liveness probe for {now - ping:.1f} s "
                                "(sent nothing at all): its process or its host is presumed "
                                "dead"))
        for r in [r for r in self.quiet_since if r not in watched]:
            del self.quiet_since[r]  # no longer waited on: start afresh next time
            self.pinged.pop(r, None)
        return pings, dead
