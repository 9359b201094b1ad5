"""The launcher's line to its ranks: each rank reports how it ends, the launcher notes the order.

Under ``--max-restarts`` the launcher listens on an abstract Unix socket (its name in
``MPITENSOR_RUN_WATCH``); each rank's bootstrap connects (:class:`_WatchLink`), says its rank
and how it ends, and the connection's end says when. :class:`_RankWatch` keeps the order, so
that a failed attempt names the rank that failed first. Only processes descending from the
launcher are heard (the kernel names the peer: ``SO_PEERCRED``).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

from .._base import config as _config
from .._base import procfs
from .options import PROG

# the launcher's socket for one attempt (a Linux abstract socket name): each rank's bootstrap
# connects, says its rank, reports how it ends, and the connection's end tells when it ended
_WATCH_VAR = _config.ENV_RUN_WATCH
# carried by every process of one attempt (mpiexec, its proxies, the ranks, their children), so
# that the launcher can find and end any of them still running before the next attempt starts
_ATTEMPT_VAR = _config.ENV_RUN_ATTEMPT


def _say(msg: str) -> None:
    sys.stderr.write(f"{PROG}: {msg}\n")
    sys.stderr.flush()


class _WatchLink:
    """A rank's connection to the launcher's :class:`_RankWatch` (the rank side).

    Open for the rank's whole life: the kernel closes it when the process ends, however it
    ends, in the same instant as it closes the rank's connections to mpiexec. Children forked
    by the rank close their copy at once, so that it never outlives the rank.
    """

    def __init__(self, name: str, rank: int) -> None:
        self._sock: Optional[socket.socket] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(5.0)
        self._sock.connect("\0" + name)
        self._sock.sendall(f"rank {rank}\n".encode())
        os.register_at_fork(after_in_child=self._drop)

    @classmethod
    def open(cls, name: Optional[str], rank: Optional[int]) -> Optional[_WatchLink]:
        """Connect, or None where the launcher cannot be reached (another host, not Linux)."""
        if not name or rank is None:
            return None
        try:
            return cls(name, rank)
        except OSError:
            return None

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def ended(self, code: int, how: str) -> None:
        """Tell the launcher how this rank ends (``run_target``'s ``on_end``); never raises."""
        if self._sock is None:
            return
        try:
            self._sock.sendall(f"end {code} {time.time():.6f} {how}\n".encode())
        except OSError:
            pass


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _our_peer(conn: socket.socket) -> Optional[Tuple[int, bytes]]:
    """The process at the other end of ``conn`` (its pid and start time) when it is this
    launcher's descendant, else None.

    An abstract socket has no permissions: any local process can find its name (in
    /proc/net/unix) and connect. The kernel's record of who connected (SO_PEERCRED) cannot be
    forged; only the ranks (the launcher's descendants, through mpiexec) pass.
    """
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except (OSError, AttributeError):
        return None
    pid, uid, _ = _PEERCRED.unpack(raw)
    fields = procfs.stat(pid) if pid > 0 else []
    if uid != os.getuid() or len(fields) < 20 or not procfs.descends_from(pid, os.getpid()):
        return None
    return pid, fields[19]


class _RankWatch(threading.Thread):
    """The launcher's side of the ranks' :class:`_WatchLink`: how and in what order they end.

    A rank that raises or calls ``sys.exit`` says so (``end CODE TIME HOW``) before it goes; a
    rank killed by a signal or ended by ``os._exit`` says nothing, and its connection just
    closes. Its connection is not always the first to close: on a busy machine, a rank whose
    main thread called ``os._exit(1)`` had its descriptors closed by its last thread to go,
    which had to wait for a core, while mpiexec had already SIGKILLed the other rank (seen
    in 1 of 40 attempts of two ranks on two busy cores; the killed rank was named, and
    mpiexec's exit code was that SIGKILL's; and once in a fresh-clone CI run a rank that
    SIGKILLed itself was seen to end after mpiexec's SIGKILL of the other). So when a
    connection closes, the ranks still connected are looked up in /proc, where a dying
    process's status shows before its descriptors close: one found exiting by itself is
    given its code (``procfs.own_code``) and counted as ending then, and so is one dying by a
    signal where the rank whose connection closed went without a word (:meth:`_gone`). When
    this thread looks late, it may see several ranks end in the same instant, and then it
    cannot tell which one came first (:meth:`failed_first`). Ranks on other hosts cannot
    connect and are not seen. A connection from any other process (checked with the kernel's
    peer credentials) is closed unread.
    """

    def __init__(self, nprocs: Optional[int]) -> None:
        super().__init__(name="mpitensor-run-watch", daemon=True)
        self.address = f"mpitensor-run-{uuid.uuid4().hex}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address)  # abstract: no file to remove, no path limit
        self._listener.listen(max(nprocs or 0, 64))
        self._listener.setblocking(False)
        self._halt = threading.Event()
        self.connected: Set[int] = set()
        self.ends: Dict[int, Tuple[int, float, str]] = {}  # rank -> (code, time, how)
        self.batches: List[List[int]] = []  # ranks seen to fail (or end), a batch per look
        self.exited: Set[int] = set()  # ranks found exiting with a code they did not say
        self._alive: Dict[int, Tuple[int, bytes]] = {}  # rank -> (pid, start time)

    def run(self) -> None:
        # connection -> [rank or None, bytes so far, (pid, start time)]
        conns: Dict[socket.socket, List[Any]] = {}
        try:
            while not self._halt.is_set():
                ready, _, _ = select.select([self._listener, *conns], [], [], 0.05)
                batch: List[int] = []
                for sock in ready:
                    if sock is self._listener:
                        try:
                            conn, _ = self._listener.accept()
                        except OSError:
                            continue
                        peer = _our_peer(conn)
                        if peer is None:
                            conn.close()  # a stranger: not a word of it reaches the report
                            continue
                        conn.setblocking(False)
                        conns[conn] = [None, b"", peer]
                        continue
                    state = conns[sock]
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data:
                        state[1] += data
                        *lines, state[1] = state[1].split(b"\n")
                        for line in lines:
                            self._message(state, line.decode(errors="replace"), batch)
                    else:  # the rank is gone
                        if state[0] is not None:
                            self._gone(state[0], batch)
                        del conns[sock]
                        sock.close()
                if batch:
                    self.batches.append(sorted(set(batch)))
        except Exception:  # noqa: BLE001 - the watch only improves the messages
            pass
        finally:
            for sock in conns:
                sock.close()
            self._listener.close()

    def _message(self, state: List[Any], line: str, batch: List[int]) -> None:
        words = line.split(" ", 4)
        if words[0] == "rank" and len(words) == 2 and words[1].isdigit():
            state[0] = int(words[1])
            self.connected.add(state[0])
            self._alive[state[0]] = state[2]
        elif words[0] == "end" and state[0] is not None and len(words) >= 3:
            try:
                code, when = int(words[1]), float(words[2])
            except ValueError:
                return
            self.ends[state[0]] = (code, when, " ".join(words[3:]) or "exit")
            if code != 0:
                batch.append(state[0])

    def _gone(self, rank: int, batch: List[int]) -> None:
        """Rank ``rank``'s connection closed: it ended. Any rank still connected that is
        exiting by itself with a code (``os._exit``, which says nothing) is given that code
        and counted as ending now too: it may have begun to exit first (see the class doc).
        Where ``rank`` itself went without a word, so does one found dying by a signal: it
        may have been killed first, and the look then names neither alone
        (:meth:`failed_first`). A rank that said how it ends was heard before this look."""
        now = time.time()
        said = rank in self.ends
        for other, peer in list(self._alive.items()):
            if other not in self.ends:
                status = procfs.exit_status(*peer)
                if not status:
                    continue  # running (0), or reaped already (None): its close says when
                code = procfs.own_code(status)
                if code is not None:
                    self.ends[other] = (code, now, "exit")
                    self.exited.add(other)
                if other != rank and (code is not None or not said):
                    batch.append(other)
        self._alive.pop(rank, None)
        batch.append(rank)

    def stop(self) -> None:
        """End the watch (after mpiexec has exited) and wait for it."""
        self._halt.set()
        self.join(timeout=2.0)

    def failed_first(self) -> List[int]:
        """The ranks of the first look that saw a rank fail: one rank, or several seen to fail
        in the same instant; a rank that said it ended well (code 0) is not a failure.

        Beside a rank found exiting with a code of its own, ranks that ended without a word
        in the same instant are taken for mpiexec's cleanup (it SIGKILLs every rank the moment
        one fails) and left out."""
        for batch in self.batches:
            failed = [r for r in batch if self.ends.get(r, (1,))[0] != 0]
            if failed:
                exited = [r for r in failed if r in self.exited]
                silent = [r for r in failed if r not in self.ends]
                if exited and len(exited) + len(silent) == len(failed):
                    return exited
                return failed
        return []

