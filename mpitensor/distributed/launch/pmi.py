"""A small PMI-1 server: what ``mpiexec`` gives its ranks, for processes no launcher started.

MPICH's ``MPI_Init`` learns its rank, the world's size and its peers' addresses from a process
manager over the PMI-1 wire protocol (text lines such as ``cmd=barrier_in``), on the socket
named by the environment variable ``PMI_FD``. ``mpiexec`` (hydra) is such a manager; this
module is another, small enough to be started by rank 0 of a rendezvous
(:mod:`.rendezvous`). Processes that met through a Store then call ``MPI_Init`` against it
and form one ``MPI_COMM_WORLD``, whose rank is the rank each was given, exactly as under
``mpiexec`` (shared memory between the ranks of a host included).

Why not MPI's own dynamic-process calls: MPICH 5.0.x names the world of every singleton
``"singinit"``, so ``MPI_Comm_accept``/``MPI_Comm_connect`` between two of them fail with
"Local and remote groups in MPI_Intercomm_create must not overlap" (pmodels/mpich#7805).
A world started through this server has a fresh, unique name, which also keeps MPICH's
shared-memory segment names apart from those of other jobs.

The server runs as a helper process (``python -I -S pmi.py``): ``MPI_Init`` holds Python's
GIL, so a server thread inside rank 0 could not answer rank 0's own requests. It uses the
standard library only. Besides PMI it keeps a *watch* connection from every rank
(:class:`Watch`): when a rank calls ``MPI_Abort``, or its PMI connection closes before
``MPI_Finalize`` (the process died), every other rank is told and ends, as ``mpiexec`` ends a
job whose rank failed; ranks on the helper's host that are still there half a second later
(a watch thread cannot run while its rank holds the GIL inside a blocking MPI call) get
SIGKILL, as ``mpiexec``'s ranks do; then the job's MPICH shared-memory files, which
``MPI_Finalize`` would have removed, are removed from ``/dev/shm``.

What a client writes is never trusted (``tests/test_pmi_hostile.py``): the helper listens on
the address the ranks use (loopback when all are local) and on a local socket in Linux's
abstract namespace, where the kernel names the peer (``SO_PEERCRED``); it signals only
processes named so, never a pid from a line. A connection must greet within
:data:`_GREET_S` seconds, at most :data:`_NEW_MAX` more than two per rank wait to, and
running out of descriptors makes room or rests instead of spinning. Lines are strict ASCII;
a bad one is answered with an error or drops its connection. With ``MPITENSOR_SECRET`` set
every connection first proves it (``auth``); MPICH cannot, so the rank's Python does, then
hands the socket to MPICH.

Wire, one line per message (``\\n``-terminated, ``key=value`` words):

* with ``MPITENSOR_SECRET``, first the challenge and response of ``auth``;
* each rank's first line, sent by mpitensor before MPICH takes the socket:
  ``cmd=mpitensor-hello rank=R token=T`` → ``cmd=mpitensor-hello rc=0`` (or ``rc=1 msg=...``
  and the connection closed; ``T`` is the token rank 0 put in the Store, so that strangers
  reaching the port are dropped; older ranks' ``pid=`` and ``host=`` words are ignored);
* then MPICH's PMI-1 requests (``init``, ``get_maxes``, ``get_appnum``, ``get_my_kvsname``,
  ``get_universe_size``, ``put``, ``get``, ``barrier_in``, ``finalize``, ``abort``);
  ``get`` of ``PMI_process_mapping`` is answered from the ranks' hosts, as hydra does;
  ``get_maxes`` answers a ``vallen_max`` of 32 KiB, so that MPICH puts a host's address as
  one key, not ten (:mod:`.pmi_kvs`, which holds the key-value space);
* a watch connection: ``cmd=mpitensor-watch rank=R token=T``, after which the server only
  writes, at most once: ``cmd=mpitensor-end from=R code=N why=WORDS`` (``why`` is the rest of
  the line); the rank writes ``cmd=mpitensor-finalizing`` on it as it enters
  ``MPI_Finalize``. MPICH 5's ``PMI_Finalize`` sends no ``finalize`` here, so without that
  word every rank's end looked like a death, and a rank still running when the others ended
  was killed with exit code 1 ("rank 0 ended without finalizing MPI"; 1 to 3 runs in 60 of a
  3-rank job started with ``multiprocessing``).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Dict, List, NamedTuple, Optional

__all__ = ["HelperServer", "Helper", "start_helper", "connect_pmi", "Watch", "process_mapping"]


def _sibling(name: str):  # type: ignore[no-untyped-def]
    """The module ``name`` of this folder. The helper runs as ``python -I -S pmi.py``,
    without the package's ``__init__`` (which imports NumPy): its parents are registered
    here as bare namespaces, so that ``auth``, ``pmi_kvs`` and what they import (``_config``,
    ``errors``: standard library only) load from their files."""
    import importlib

    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    import types

    here = os.path.dirname(os.path.abspath(__file__))
    dist_dir = os.path.dirname(here)
    for pkg_name, path in (("mpitensor", os.path.dirname(dist_dir)),
                           ("mpitensor.distributed", dist_dir),
                           ("mpitensor.distributed.launch", here)):
        if pkg_name not in sys.modules:
            pkg = types.ModuleType(pkg_name)
            pkg.__path__ = [path]  # type: ignore[attr-defined]
            sys.modules[pkg_name] = pkg
    return importlib.import_module(f"mpitensor.distributed.launch.{name}")


if __package__:
    from . import pmi_kvs as _kvs
else:  # the helper's own process
    _kvs = _sibling("pmi_kvs")

process_mapping = _kvs.process_mapping
_uint, _sint, _words = _kvs.uint, _kvs.sint, _kvs.words
_LINE_MAX = _kvs.LINE_MAX
# After telling the ranks to end, the server lingers this long so the lines get out; the
# ranks of its host still connected after the grace are killed.
_END_LINGER_S = 2.0
_KILL_GRACE_S = 0.5
_SHM_PATIENCE_S = 3.0  # how long a failed job's shared memory may stay mapped by a dying rank
_SHM_NOTE_S = 2.0  # how often /dev/shm is looked at while the job runs (see _note_shm)
# A single connect or reply from the helper takes at most this long (a timeout may be inf).
_IO_MAX_S = 300.0
# A connection must send its first line within this many seconds of being accepted (ours
# send it at once); at most this many connections may be waiting for theirs at one time.
_GREET_S = 5.0
_NEW_MAX = 64  # beyond two per rank (a PMI and a watch connection each, all at once at scale)
_YOUNG_S = 0.5  # a connection younger than this is not dropped for the cap: its line may come
_ACCEPT_BURST = 256  # connections taken per wake-up of the listener
_PAUSE_S = 0.25  # the listener rests this long when no descriptor is left to accept with
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _Conn:
    """One client connection: a PMI rank, a watch, or not yet known."""

    __slots__ = ("sock", "buf", "kind", "rank", "pid", "pidfd", "finalized", "out", "born",
                 "auth", "local", "writing")

    def __init__(self, sock: socket.socket, local: bool) -> None:
        self.sock = sock
        self.buf = b""
        self.kind = "new"  # "pmi" after the hello, "watch" after the watch line
        self.rank = -1
        # the peer's process where the kernel vouched for it (SO_PEERCRED on the local
        # socket), else 0; never a number the peer wrote
        self.pid = 0
        self.pidfd = -1
        self.finalized = False
        self.out = b""
        self.born = time.monotonic()
        self.auth = None  # the handshake in progress where a secret is set
        self.local = local
        self.writing = False  # whether the selector also waits until it can write


class HelperServer:
    """The PMI-1 server of one world of ``size`` ranks (run by :func:`main` in the helper).

    Args:
        size: the number of ranks that will call ``MPI_Init`` against it.
        token: the secret a client's first line must carry (from the Store, which only the
            rendezvous' members read): strangers reaching the port are dropped.
        init_timeout: seconds within which all ``size`` ranks must have connected and passed
            ``MPI_Init``'s first PMI barrier; past it every connection is closed, so each
            waiting ``MPI_Init`` fails instead of waiting forever.
        bind: the address to listen on (the one the ranks reach: the master's, or loopback
            when every rank is on this host); ``""``: every interface.
        mapping: the ``PMI_process_mapping`` to answer (see :func:`process_mapping`).
        secret: where set (``MPITENSOR_SECRET``), every connection first proves that it
            knows it (``auth``'s challenge and response), before any line is read.
        unix: the name of a local socket to listen on too (Linux's abstract namespace): the
            ranks of this host connect there, and the kernel tells who they are.
        local_pids: rank -> process id of the ranks on this host, as they claimed their rank
            in the rendezvous: where the local socket exists, such a rank is served only on
            it and only to that process (a stranger holding the token cannot take it).
    """

    def __init__(self, size: int, token: str, init_timeout: float, bind: str = "127.0.0.1",
                 mapping: Optional[str] = None, secret: Optional[bytes] = None,
                 unix: Optional[str] = None,
                 local_pids: Optional[Dict[int, int]] = None) -> None:
        self.size = size
        self.token = token
        self.local_pids = dict(local_pids or {})
        self.secret = secret
        self.kvsname = "mpitensor_" + secrets.token_hex(8)
        self.kvs = _kvs.Kvs(size, mapping)
        self.static = self._static_replies()
        self.deadline = time.monotonic() + init_timeout
        self.barrier: Dict[int, _Conn] = {}  # the ranks in the barrier now
        self.ranks: Dict[int, _Conn] = {}
        self.watches: List[_Conn] = []
        self.new: Dict[_Conn, None] = {}  # not yet greeted, oldest first
        self.new_max = _NEW_MAX + 2 * size
        self.barriers_passed = 0
        self.watched: set = set()  # the ranks that connected a watch: they passed MPI_Init
        self.ending = 0.0  # monotonic time the server stops after ending the job
        self.kill_at = 0.0  # when the ranks of this host that are still alive get SIGKILL
        self.last_word = ""  # what the watches were told when the job ended
        self.paused = 0.0  # until when the listeners rest (no descriptor left)
        self.shm: set = set()  # MPICH's shared-memory files of this job, removed if it fails
        self.shm_noted = -1e9  # when /dev/shm was last looked at (see _note_shm)
        self.shm_seen: frozenset = frozenset()
        self.sel = selectors.DefaultSelector()
        self.listeners: List[socket.socket] = [self._listen(bind)]
        self.unix = None
        if unix:
            try:
                self.unix = self._listen_unix(unix)
                self.listeners.append(self.unix)
            except OSError:
                self.unix = None  # no local socket here: every rank uses TCP
        for lst in self.listeners:
            lst.setblocking(False)
            self.sel.register(lst, selectors.EVENT_READ, None)

    @property
    def started(self) -> bool:
        """Whether every rank passed ``MPI_Init``: a PMI barrier passed by all, or all
        connected their watch (which each does once ``MPI_Init`` returned). Where the
        process mapping puts every rank on one host MPICH's ``MPI_Init`` needs no barrier
        here, and the first one comes in ``MPI_Finalize``."""
        return self.barriers_passed > 0 or len(self.watched) >= self.size

    @property
    def port(self) -> int:
        return self.listeners[0].getsockname()[1]

    @staticmethod
    def _listen(bind: str) -> socket.socket:
        """A listening socket on ``bind`` (``""``: every interface, IPv6 and IPv4 where the
        host has both)."""
        if bind:
            family = socket.AF_INET6 if ":" in bind else socket.AF_INET
            return socket.create_server((bind, 0), family=family, backlog=socket.SOMAXCONN)
        if socket.has_dualstack_ipv6():
            try:
                return socket.create_server(("", 0), family=socket.AF_INET6,
                                            dualstack_ipv6=True, backlog=socket.SOMAXCONN)
            except OSError:
                pass  # IPv6 present but unusable (a container without it): IPv4 alone
        return socket.create_server(("", 0), backlog=socket.SOMAXCONN)

    @staticmethod
    def _listen_unix(name: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + name)  # abstract: no file to leave behind
            sock.listen(socket.SOMAXCONN)
        except OSError:
            sock.close()
            raise
        return sock

    # ------------------------------------------------------------------ the loop
    def serve(self) -> int:
        """Serve until every rank has finalized and closed, or the job ended; the exit code."""
        while True:
            now = time.monotonic()
            if self.kill_at and now >= self.kill_at:
                self._kill_local()
            if self.paused and now >= self.paused:
                self.paused = 0.0
                for lst in self.listeners:
                    self.sel.register(lst, selectors.EVENT_READ, None)
            self._expire(now)
            if self.ending:
                if now >= self.ending:
                    self._remove_shm()
                    return 1
                wait = min(self.ending, self.kill_at or self.ending) - now
            elif not self.started:
                if now >= self.deadline:
                    self._close_all()  # MPI_Init fails in every rank that is waiting in it
                    return 1
                wait = self.deadline - now
            elif not self.ranks:
                return 0  # everyone finalized (or left) and closed
            else:
                self._note_shm()
                wait = _SHM_NOTE_S
            if self.new:
                wait = min(wait, next(iter(self.new)).born + _GREET_S - now)
            if self.paused:
                wait = min(wait, self.paused - now)
            for key, mask in self.sel.select(timeout=max(0.01, min(wait, 1.0))):
                if key.data is None:
                    self._accept(key.fileobj)  # type: ignore[arg-type]
                    continue
                c = key.data
                if c.sock.fileno() < 0:
                    continue  # dropped while an earlier event of this wake-up was handled
                if mask & selectors.EVENT_READ:
                    self._read(c)
                if mask & selectors.EVENT_WRITE and c.sock.fileno() >= 0:
                    self._flush(c)

    def _expire(self, now: float) -> None:
        """Drop the connections that have not greeted within :data:`_GREET_S`."""
        while self.new:
            c = next(iter(self.new))
            if c.born + _GREET_S > now:
                return
            self._drop(c)

    def _accept(self, listener: socket.socket) -> None:
        """Take every pending connection (up to a burst); with no descriptor left, drop the
        oldest un-greeted one or, with none, let the listeners rest a moment (a readable
        listener that cannot be accepted from would otherwise wake the loop at once, for
        ever)."""
        for _ in range(_ACCEPT_BURST):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS:
                    if self.new:
                        self._drop(next(iter(self.new)))
                        continue
                    self._pause()
                return
            self._admit(sock, local=listener is self.unix)

    def _pause(self) -> None:
        self.paused = time.monotonic() + _PAUSE_S
        for lst in self.listeners:
            try:
                self.sel.unregister(lst)
            except (KeyError, ValueError):
                pass

    def _admit(self, sock: socket.socket, local: bool) -> None:
        now = time.monotonic()
        while len(self.new) >= self.new_max:
            # the oldest waiting connection goes; one whose first line is already here is
            # read first, so a rank among a crowd of idle connections still gets through. A
            # young one stays: every rank of a large job connects at once, and its line may
            # not be here yet (a flood of young ones meets the descriptor limit instead)
            oldest = next(iter(self.new))
            if oldest.born + _YOUNG_S > now:
                break
            self._read(oldest)
            if oldest in self.new:
                self._drop(oldest)
        sock.setblocking(False)
        c = _Conn(sock, local)
        if local:
            if not self._vouch(c):
                sock.close()
                return
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.new[c] = None
        self.sel.register(sock, selectors.EVENT_READ, c)
        if self.secret is not None:
            c.auth = _auth().ServerHandshake(self.secret)
            self._send_raw(c, c.auth.hello)

    def _vouch(self, c: _Conn) -> bool:
        """Ask the kernel who is at the other end of a local connection; only a process of
        this user is served. Its process id (and a pidfd, which a reused id cannot fool) is
        what :meth:`_kill_local` may signal later."""
        try:
            pid, uid, _gid = struct.unpack("3i", c.sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        except (OSError, AttributeError):
            return False
        if uid != os.getuid() or pid <= 0:
            return False
        c.pid = pid
        if hasattr(os, "pidfd_open"):
            try:
                c.pidfd = os.pidfd_open(pid)
            except OSError:
                c.pid = 0  # gone already
        return True

    def _read(self, c: _Conn) -> None:
        """Read what ``c`` sent and answer every complete line in it, in one send."""
        try:
            data = c.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(c)
            return
        c.buf = c.buf + data if c.buf else data
        if c.auth is not None:
            if not self._authenticate(c):
                return
        if b"\n" not in c.buf:
            if len(c.buf) > _LINE_MAX:
                self._lost(c)
            return
        *lines, c.buf = c.buf.split(b"\n")
        for raw in lines:
            try:
                if not raw.isascii() or len(raw) > _LINE_MAX:
                    self._bad(c, "the line is not ASCII")
                else:
                    self._handle(c, raw)
            except Exception:  # noqa: BLE001 - no line may end the helper: its sender goes
                self._lost(c)
            if c.sock.fileno() < 0:
                return
        if c.out:
            self._flush(c)
        if len(c.buf) > _LINE_MAX:
            self._lost(c)

    def _authenticate(self, c: _Conn) -> bool:
        """Collect the peer's proof and answer it; ``True`` once it is accepted."""
        auth = _auth()
        if len(c.buf) < auth.PROOF_BYTES and not c.auth.foreign(c.buf):
            return False
        proof, c.buf = c.buf[:auth.PROOF_BYTES], c.buf[auth.PROOF_BYTES:]
        try:
            self._send_raw(c, c.auth.answer(proof))
        except auth.AuthError:
            try:
                c.sock.send(auth.REFUSE)
            except OSError:
                pass
            self._drop(c)
            return False
        c.auth = None
        return True

    def _bad(self, c: _Conn, why: str) -> None:
        """A malformed line: a connection that has not greeted is dropped; a rank's gets an
        error reply (MPICH never sends one)."""
        if c.kind == "pmi":
            self._queue(c, f"cmd=error rc=-1 msg={why.replace(' ', '_')}\n".encode())
        else:
            self._lost(c)

    def _send(self, c: _Conn, line: str) -> None:
        self._send_raw(c, (line + "\n").encode("ascii", "replace"))

    def _send_raw(self, c: _Conn, data: bytes) -> None:
        self._queue(c, data)
        self._flush(c)

    @staticmethod
    def _queue(c: _Conn, data: bytes) -> None:
        """Add ``data`` to what goes to ``c`` (sent when the lines read with it are done)."""
        c.out = c.out + data if c.out else data

    def _flush(self, c: _Conn) -> None:
        if c.sock.fileno() < 0:
            return
        out = c.out
        if out:
            try:
                sent = c.sock.send(out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                c.out = b""
                return
            c.out = out[sent:] if sent < len(out) else b""
            if len(c.out) > _LINE_MAX * 4:  # a peer that never reads its replies
                self._lost(c)
                return
        if c.writing != bool(c.out):  # (one system call less per reply when it is not)
            c.writing = bool(c.out)
            self.sel.modify(c.sock, selectors.EVENT_READ
                            | (selectors.EVENT_WRITE if c.writing else 0), c)

    def _drop(self, c: _Conn) -> None:
        self.new.pop(c, None)
        if c.pidfd >= 0:
            try:
                os.close(c.pidfd)
            except OSError:
                pass
            c.pidfd = -1
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def _close_all(self) -> None:
        for key in list(self.sel.get_map().values()):
            if key.data is not None:
                self._drop(key.data)

    # ------------------------------------------------------------------ requests
    def _static_replies(self) -> Dict[bytes, bytes]:
        """The reply to each request whose answer never changes, encoded once."""
        return {b"init": b"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n",
                b"get_maxes": (f"cmd=maxes rc=0 kvsname_max={_kvs.KVSNAME_MAX} keylen_max="
                               f"{_kvs.KEY_MAX} vallen_max={_kvs.VAL_MAX}\n").encode(),
                b"get_appnum": b"cmd=appnum rc=0 appnum=0\n",
                b"get_my_kvsname": f"cmd=my_kvsname rc=0 kvsname={self.kvsname}\n".encode(),
                b"get_universe_size": f"cmd=universe_size rc=0 size={self.size}\n".encode()}

    def _handle(self, c: _Conn, line: bytes) -> None:
        """One ASCII line of ``c``: its reply is queued (see :meth:`_queue`)."""
        if c.kind != "pmi":
            text = line.decode("ascii")
            w = _words(text)
            if c.kind == "new":
                self._greet(c, w.get("cmd", ""), w)
            elif w.get("cmd") == "mpitensor-finalizing":  # a watch: the rank is finalizing
                pmi = self.ranks.get(c.rank)
                if pmi is not None:
                    pmi.finalized = True
            return  # watches otherwise only listen
        bw = _kvs.bwords(line)
        cmd = bw.get(b"cmd", b"")
        if cmd == b"get":  # (most requests at scale: the first ranks' node addresses)
            self._queue(c, self.kvs.get(bw.get(b"key", b"")))
            return
        reply = self.static.get(cmd)
        if reply is not None:
            self._queue(c, reply)
        elif cmd == b"put":
            self._queue(c, self.kvs.put(bw.get(b"key", b""), bw.get(b"value", b"")))
        elif cmd == b"barrier_in":
            self._barrier_in(c)
        elif not _kvs.WORD.match(cmd.decode("ascii")):
            self._bad(c, "malformed command")
        elif cmd == b"finalize":
            c.finalized = True
            self._queue(c, b"cmd=finalize_ack rc=0\n")
        elif cmd == b"abort":
            code = _sint(bw.get(b"exitcode", b"").decode("ascii"))
            self._end(c.rank, 1 if code is None else code, "called MPI_Abort")
        else:
            self._queue(c, b"cmd=" + (cmd or b"unknown")
                        + b" rc=-1 msg=unsupported_by_mpitensor\n")

    def _barrier_in(self, c: _Conn) -> None:
        if c.rank in self.barrier:
            self._queue(c, b"cmd=barrier_out rc=-1 msg=already_in_the_barrier\n")
            return
        self.barrier[c.rank] = c
        if len(self.ranks) < self.size and self.started and not self.ending:
            # a rank that has left can never enter it (one that said it was finalizing
            # and died inside MPI_Finalize): the waiters would wait for ever
            gone = min(set(range(self.size)) - set(self.ranks))
            self._end(gone, 1, "ended inside MPI_Finalize, before the others could "
                               "finish it")
            return
        self._release_barrier()

    def _greet(self, c: _Conn, cmd: str, w: Dict[str, str]) -> None:
        rank = _uint(w.get("rank"))
        token = w.get("token", "")
        if (not secrets.compare_digest(token.encode(), self.token.encode())
                or rank is None or not rank < self.size):
            self._drop(c)  # not one of ours
            return
        # the hello's pid= and host= words (older ranks send them) are not believed: a pid
        # signalled later is one the kernel vouched for (_vouch)
        want = self.local_pids.get(rank) if self.unix is not None else None
        if want is not None and (not c.local or c.pid != want):
            # a rank of this host, but not the process that claimed it in the rendezvous
            if cmd == "mpitensor-hello":
                self._send(c, f"cmd=mpitensor-hello rc=1 msg=rank_{rank}_was_claimed_by_"
                              f"another_process")
            self._drop(c)
            return
        if cmd == "mpitensor-watch":
            self.new.pop(c, None)
            c.kind, c.rank = "watch", rank
            self.watches.append(c)
            if rank in self.ranks:  # (a watch of a rank nobody said hello for starts nothing)
                self.watched.add(rank)
            if self.ending and self.last_word:  # the job ended before this rank watched
                self._send(c, self.last_word)
        elif cmd == "mpitensor-hello":
            if rank in self.ranks or self.started:
                self._send(c, f"cmd=mpitensor-hello rc=1 msg=rank_{rank}_is_taken")
                self._drop(c)
                return
            self.new.pop(c, None)
            c.kind, c.rank = "pmi", rank
            self.ranks[rank] = c
            self._send(c, "cmd=mpitensor-hello rc=0")
        else:
            self._drop(c)

    def _release_barrier(self) -> None:
        # every rank in self.barrier is connected: _lost takes a closed one out of both
        if len(self.barrier) == self.size:
            for c in list(self.barrier.values()):  # (a send may drop a peer that never reads)
                self._send(c, "cmd=barrier_out rc=0")
            self.barrier.clear()
            self.barriers_passed += 1
            self._note_shm(force=True)

    def _lost(self, c: _Conn) -> None:
        """A connection closed: a rank that never finalized means the job cannot go on."""
        self._drop(c)
        if c.kind == "watch":
            if c in self.watches:
                self.watches.remove(c)
            return
        if c.kind != "pmi" or self.ranks.get(c.rank) is not c:
            return
        del self.ranks[c.rank]
        waited = self.barrier.pop(c.rank, None) is not None  # others wait for it in vain
        if not c.finalized and not self.ending:
            # its watch may hold its last word, "finalizing", unread: the two connections
            # are read in no particular order
            for w in [w for w in self.watches if w.rank == c.rank]:
                self._read(w)
        if c.finalized and (waited or self.barrier) and not self.ending:
            # finalizing, yet gone while ranks wait in a barrier it never completed (MPICH's
            # MPI_Finalize passes one with every rank): it died inside MPI_Finalize
            self._end(c.rank, 1, "ended inside MPI_Finalize, before the others could finish it")
        elif not c.finalized and not self.ending:
            if not self.started:
                # during MPI_Init: make every other MPI_Init fail now (their PMI connections
                # close); ranks already past it are told to end through their watches
                if self.watches:
                    self._end(c.rank, 1, "ended during MPI_Init (it exited, crashed or was "
                                         "killed)")
                    for other in list(self.ranks.values()):
                        self._drop(other)
                else:
                    self._close_all()
                    self.ending = time.monotonic() + 0.01
            else:
                self._end(c.rank, 1, "ended without finalizing MPI (it exited, crashed or "
                                     "was killed)")

    def _end(self, rank: int, code: int, why: str) -> None:
        """Tell every watch that the job ends (once); kill what is left of it on this host a
        moment later; then stop.

        A rank's watch thread cannot act while its main thread holds Python's GIL inside a
        blocking MPI call (``MPI_Finalize``, say), so the ranks on this host that are still
        connected after the grace get SIGKILL, as ``mpiexec`` kills a failed job's ranks:
        only those whose process the kernel named (:meth:`_vouch`).
        """
        if self.ending:
            return
        # the files first: a rank told to end is gone a moment later, and its maps with it
        # (noted after the telling, the files of a two-rank job were left behind 1 run in 12)
        self._note_shm(force=True)
        self.last_word = f"cmd=mpitensor-end from={rank} code={code} why={why}"
        for w in list(self.watches):
            self._send(w, self.last_word)
        now = time.monotonic()
        self.kill_at = now + _KILL_GRACE_S
        self.ending = now + _END_LINGER_S

    def _vouched(self) -> List[_Conn]:
        """The connected ranks and watches whose process the kernel named."""
        return [c for c in list(self.ranks.values()) + self.watches
                if c.pid and c.sock.fileno() >= 0]

    def _note_shm(self, force: bool = False) -> None:
        """Add the MPICH shared-memory files the local ranks map now to the job's.

        Looked for at every PMI barrier, every :data:`_SHM_NOTE_S` seconds while the job
        runs, and when it ends: by the time a failure is handled here its ranks may be gone,
        and their maps with them (once the helper, scheduled late, found none and left the
        job's files behind). A look is one listing of ``/dev/shm``; the ranks' maps are read
        only when MPICH files appeared there since the last look (or when it ends)."""
        now = time.monotonic()
        if now < self.shm_noted + _SHM_NOTE_S and not force:
            return
        self.shm_noted = now
        try:
            names = frozenset(n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_"))
        except OSError:
            names = frozenset()
        if not names or (names <= self.shm_seen and not force):
            self.shm_seen = names
            return
        self.shm_seen = names
        for pid in {c.pid for c in self._vouched()}:
            self.shm |= _shm_files(pid)

    def _remove_shm(self, patience: float = _SHM_PATIENCE_S) -> None:
        """Remove the shared-memory files of a failed job, which ``MPI_Finalize`` would have
        removed (``mpiexec`` leaves them in ``/dev/shm``), once no process maps them.

        A rank that raised may still be on its way out (its abort handler drains its output)
        and map the files when the job's end is declared: a file still in use is looked at
        again every 0.1 s for up to ``patience`` seconds (once, it was left behind)."""
        left = set(self.shm)
        deadline = time.monotonic() + patience
        while left:
            in_use: set = set()
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    in_use |= _shm_files(int(entry))
            for path in left - in_use:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            left &= in_use
            if not left or time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _kill_local(self) -> None:
        """SIGKILL the ranks of this host still connected: only processes the kernel named
        on the local socket (never a number a client wrote), through their pidfd where the
        system has them (a reused process id is then not hit)."""
        self.kill_at = 0.0
        for c in self._vouched():
            try:
                if c.pidfd >= 0:
                    signal.pidfd_send_signal(c.pidfd, signal.SIGKILL)
                else:
                    os.kill(c.pid, signal.SIGKILL)
            except OSError:
                pass


def _shm_files(pid: int) -> set:
    """The MPICH shared-memory files (``/dev/shm/mpich_shm_*``) process ``pid`` maps."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split(None, 5)[5].strip() for line in f
                    if "/dev/shm/mpich_shm_" in line and len(line.split(None, 5)) == 6}
    except OSError:
        return set()


_AUTH = None


def _auth():  # type: ignore[no-untyped-def]
    """The ``auth`` module (loaded at first use: only where a secret is set)."""
    global _AUTH
    if _AUTH is None:
        _AUTH = _sibling("auth")
    return _AUTH


def main(argv: Optional[List[str]] = None) -> int:
    """The helper process: ``pmi.py SIZE INIT_TIMEOUT_S``; on stdin the token's line, then
    one line of JSON settings (``bind``, ``mapping``, ``unix``); ``MPITENSOR_SECRET`` from
    the environment.

    Prints ``PORT KVSNAME`` on stdout once listening, then closes stdout.
    """
    args = sys.argv[1:] if argv is None else argv
    size, init_timeout = int(args[0]), float(args[1])
    token = sys.stdin.readline().strip()
    settings = json.loads(sys.stdin.readline() or "{}")
    secret = _auth().secret_from_env()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends the ranks; they end us
    try:  # two connections and a pidfd per local rank: the soft limit (often 1024) is low
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, OSError, ValueError):
        pass
    server = HelperServer(size, token, init_timeout, bind=settings.get("bind", "127.0.0.1"),
                          mapping=settings.get("mapping"),
                          secret=secret, unix=settings.get("unix"),
                          local_pids={int(r): int(pid) for r, pid in
                                      (settings.get("local_pids") or {}).items()})
    sys.stdout.write(f"{server.port} {server.kvsname} {'unix' if server.unix else '-'}\n")
    sys.stdout.flush()
    os.close(1)
    return server.serve()


# ---------------------------------------------------------------------- the rank side
class Helper(NamedTuple):
    """A started helper: its process, where it listens, and what the ranks need to know."""

    proc: "subprocess.Popen[bytes]"
    port: int
    kvsname: str
    token: str
    unix: str  # the local socket's name, or "" where there is none


def start_helper(size: int, init_timeout: float, bind: str = "127.0.0.1",
                 mapping: Optional[str] = None,
                 local_pids: Optional[Dict[int, int]] = None) -> Helper:
    """Start the helper process, listening on ``bind`` (and on a local socket).

    ``local_pids`` (rank -> pid of the ranks on this host, from the rendezvous) binds each
    such rank to its process: see :class:`HelperServer`.

    The helper runs in a session of its own (a Ctrl-C in the terminal reaches the ranks, and
    their sockets closing ends it) with no output of its own; it exits when every rank has
    finalized and closed, when the job ended, or ``init_timeout`` seconds after it started if
    the ranks never all arrived. ``MPITENSOR_SECRET``, where set, reaches it through the
    environment.
    """
    token = secrets.token_hex(16)
    unix = "mpitensor-pmi-" + secrets.token_hex(12)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(size), repr(init_timeout)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write((token + "\n" + json.dumps({
            "bind": bind, "mapping": mapping, "unix": unix,
            "local_pids": {str(r): int(pid) for r, pid in (local_pids or {}).items()}})
            + "\n").encode())
        proc.stdin.close()
        line = proc.stdout.readline().decode().split()
        proc.stdout.close()
        if len(line) != 3 or _uint(line[0]) is None:
            raise RuntimeError(f"the PMI helper process did not start (exit code "
                               f"{proc.poll()}, said {line!r})")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return Helper(proc, int(line[0]), line[1], token, unix if line[2] == "unix" else "")


def _connect(host: str, port: int, deadline: float, unix: str = "") -> socket.socket:
    """Connect to the helper: on its local socket where ``unix`` names one that this
    process reaches (same host, same network namespace), else over TCP; then authenticate
    where ``MPITENSOR_SECRET`` is set."""
    sock = None
    if unix:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(min(_IO_MAX_S, max(0.1, deadline - time.monotonic())))
            sock.connect("\0" + unix)
        except OSError:
            sock.close()
            sock = None  # another host, or another network namespace: TCP
    delay = 0.01
    while sock is None:
        try:
            sock = socket.create_connection(
                (host, port), timeout=min(_IO_MAX_S, max(0.1, deadline - time.monotonic())))
            # given the port itself: nobody listens there (_store/tcp.py's _self_connected,
            # written again here: this file runs as the helper with the standard library only)
            if sock.getsockname() == sock.getpeername():
                sock.close()
                sock = None
                raise ConnectionRefusedError(errno.ECONNREFUSED, "connected to itself")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            if time.monotonic() + delay >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    secret = _auth().secret_from_env()
    if secret:
        try:
            _auth().client_handshake(sock, secret,
                                     min(_IO_MAX_S, max(0.1, deadline - time.monotonic())))
        except BaseException:
            sock.close()
            raise
    return sock


def connect_pmi(host: str, port: int, rank: int, token: str, deadline: float,
                unix: str = "") -> int:
    """Connect to the helper as ``rank`` and return the socket's file descriptor for PMI_FD.

    The descriptor is detached from Python, so that nothing closes it before MPICH's
    ``MPI_Finalize`` has used it. MPICH's simple PMI then reads and writes it as it would
    the one ``mpiexec`` gives: a local (Unix) socket or an authenticated one alike.

    Raises:
        ConnectionError: the helper refused the rank (taken) or closed the connection.
        OSError: the helper could not be reached before ``deadline``.
        AuthError: ``MPITENSOR_SECRET`` differs from rank 0's (or only one side has it).
    """
    sock = _connect(host, port, deadline, unix)
    try:
        sock.settimeout(min(_IO_MAX_S, max(0.1, deadline - time.monotonic())))
        sock.sendall(f"cmd=mpitensor-hello rank={rank} token={token}\n".encode())
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(1)  # byte by byte: nothing past the reply may be read here
            if not chunk:
                raise ConnectionError("the PMI helper closed the connection")
            reply += chunk
        text = reply.decode("ascii", "replace").strip()
        words = _words(text)
        if words.get("rc") != "0":
            raise ConnectionError(f"the PMI helper refused rank {rank}: "
                                  f"{words.get('msg', text)}")
        sock.settimeout(None)
        return sock.detach()
    except BaseException:
        sock.close()
        raise


class Watch:
    """This rank's watch connection: ends the process when the helper says the job ends.

    A daemon thread reads the one line the helper may send (another rank called
    ``MPI_Abort``, or died without finalizing); it prints why on stderr, prefixed
    ``[rank R]``, and ends this process with the job's exit code, as ``mpiexec`` ends the
    ranks of a failed job. The connection closing without that line (the helper ended
    normally) ends nothing.
    """

    def __init__(self, host: str, port: int, rank: int, token: str, deadline: float,
                 unix: str = "") -> None:
        self.rank = rank
        self.sock = _connect(host, port, deadline, unix)
        self.sock.settimeout(None)
        self.sock.sendall(f"cmd=mpitensor-watch rank={rank} token={token}\n".encode())
        self.thread = threading.Thread(target=self._run, name="mpitensor-pmi-watch",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        buf = b""
        try:
            while b"\n" not in buf:
                chunk = self.sock.recv(4096)
                if not chunk:
                    return
                buf += chunk
        except OSError:
            return
        line = buf.split(b"\n", 1)[0].decode("ascii", "replace")
        w = _words(line)
        if w.get("cmd") != "mpitensor-end":
            return
        code = _sint(w.get("code"))
        code = 1 if code is None else code
        who = w.get("from", "?")
        if who != str(self.rank):
            why = line.split(" why=", 1)[1] if " why=" in line else "failed"
            try:
                sys.stdout.flush()
                sys.stderr.write(f"[rank {self.rank}] ending: rank {who} {why}; the job "
                                 "cannot continue (as under mpiexec)\n")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not stop the exit
                pass
        os._exit(code if 0 < code < 256 else 1)

    def finalizing(self) -> None:
        """Tell the helper that this rank is finalizing MPI (MPICH's ``PMI_Finalize`` sends
        nothing the helper could see): its connections closing after this are its normal
        end, not a failure to report to the other ranks."""
        try:
            self.sock.sendall(b"cmd=mpitensor-finalizing\n")
        except OSError:
            pass

    def close(self) -> None:
        """Stop watching (the helper then ends nothing in this process)."""
        try:
            self.sock.close()
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
