"""A small PMI-1 server: what ``mpiexec`` gives its ranks, for processes no launcher started.

MPICH's ``MPI_Init`` learns its rank, the world's size and its peers' addresses from a process
manager over the PMI-1 wire protocol (text lines such as ``cmd=barrier_in``), on the socket
named by the environment variable ``PMI_FD``. ``mpiexec`` (hydra) is such a manager; this
module is another, small enough to be started by rank 0 of a rendezvous
(:mod:`._rendezvous`). Processes that met through a Store then call ``MPI_Init`` against it
and form one ``MPI_COMM_WORLD``, whose rank is the rank each was given, exactly as under
``mpiexec`` (shared memory between the ranks of a host included).

Why not MPI's own dynamic-process calls: MPICH 5.0.x names the world of every singleton
``"singinit"``, so ``MPI_Comm_accept``/``MPI_Comm_connect`` between two of them fail with
"Local and remote groups in MPI_Intercomm_create must not overlap" (pmodels/mpich#7805).
A world started through this server has a fresh, unique name, which also keeps MPICH's
shared-memory segment names apart from those of other jobs.

The server runs as a helper process (``python -I -S _pmi.py``): ``MPI_Init`` holds Python's
GIL, so a server thread inside rank 0 could not answer rank 0's own requests. It uses the
standard library only. Besides PMI it keeps a *watch* connection from every rank
(:class:`Watch`): when a rank calls ``MPI_Abort``, or its PMI connection closes before
``MPI_Finalize`` (the process died), every other rank is told and ends, as ``mpiexec`` ends a
job whose rank failed; ranks on the helper's host that are still there half a second later
(a watch thread cannot run while its rank holds the GIL inside a blocking MPI call) get
SIGKILL, as ``mpiexec``'s ranks do; then the job's MPICH shared-memory files, which
``MPI_Finalize`` would have removed, are removed from ``/dev/shm``.

Wire, one line per message (``\\n``-terminated, ``key=value`` words):

* each rank's first line, sent by mpitensor before MPICH takes the socket:
  ``cmd=mpitensor-hello rank=R token=T pid=P host=H`` → ``cmd=mpitensor-hello rc=0`` (or
  ``rc=1 msg=...``; ``T`` is the secret rank 0 put in the Store, so that strangers reaching the
  port are dropped);
* then MPICH's PMI-1 requests (``init``, ``get_maxes``, ``get_appnum``, ``get_my_kvsname``,
  ``get_universe_size``, ``put``, ``get``, ``barrier_in``, ``finalize``, ``abort``);
* a watch connection: ``cmd=mpitensor-watch rank=R token=T``, after which the server only
  writes, at most once: ``cmd=mpitensor-end from=R code=N why=WORDS`` (``why`` is the rest of
  the line); the rank writes ``cmd=mpitensor-finalizing`` on it as it enters
  ``MPI_Finalize``. MPICH 5's ``PMI_Finalize`` sends no ``finalize`` here, so without that
  word every rank's end looked like a death, and a rank still running when the others ended
  was killed with exit code 1 ("rank 0 ended without finalizing MPI"; 1 to 3 runs in 60 of a
  3-rank job started with ``multiprocessing``).
"""

from __future__ import annotations

import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["HelperServer", "start_helper", "connect_pmi", "Watch"]

# The limits the server advertises; MPICH splits longer values itself.
_KVSNAME_MAX = 256
_KEY_MAX = 64
_VAL_MAX = 1024
_LINE_MAX = 1 << 16  # a client that sends a longer line is not an MPICH rank: dropped
# After telling the ranks to end, the server lingers this long so the lines get out; the
# ranks of its host still connected after the grace are killed.
_END_LINGER_S = 2.0
_KILL_GRACE_S = 0.5
_SHM_PATIENCE_S = 3.0  # how long a failed job's shared memory may stay mapped by a dying rank
# A single connect or reply from the helper takes at most this long (a timeout may be inf).
_IO_MAX_S = 300.0


def _words(line: str) -> Dict[str, str]:
    """``cmd=put key=a value=b`` -> ``{"cmd": "put", "key": "a", "value": "b"}``."""
    out: Dict[str, str] = {}
    for word in line.split(" "):
        key, sep, value = word.partition("=")
        if sep:
            out[key] = value
    return out


class _Conn:
    """One client connection: a PMI rank, a watch, or not yet known."""

    __slots__ = ("sock", "buf", "kind", "rank", "pid", "finalized", "out")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.kind = "new"  # "pmi" after the hello, "watch" after the watch line
        self.rank = -1
        self.pid = 0  # the rank's process id where it runs on this host, else 0
        self.finalized = False
        self.out = b""


class HelperServer:
    """The PMI-1 server of one world of ``size`` ranks (run by :func:`main` in the helper).

    Args:
        size: the number of ranks that will call ``MPI_Init`` against it.
        token: the secret a client's first line must carry (from the Store, which only the
            rendezvous' members read): strangers reaching the port are dropped.
        init_timeout: seconds within which all ``size`` ranks must have connected and passed
            ``MPI_Init``'s first PMI barrier; past it every connection is closed, so each
            waiting ``MPI_Init`` fails instead of waiting forever.
    """

    def __init__(self, size: int, token: str, init_timeout: float) -> None:
        self.size = size
        self.token = token
        self.kvsname = "mpitensor_" + secrets.token_hex(8)
        self.kvs: Dict[str, str] = {}
        self.deadline = time.monotonic() + init_timeout
        self.barrier: List[_Conn] = []
        self.ranks: Dict[int, _Conn] = {}
        self.watches: List[_Conn] = []
        self.barriers_passed = 0  # MPI_Init's first PMI barrier ends the start-up phase
        self.ending = 0.0  # monotonic time the server stops after ending the job
        self.kill_at = 0.0  # when the ranks of this host that are still alive get SIGKILL
        self.host = socket.gethostname()
        self.shm: set = set()  # MPICH's shared-memory files of this job, removed if it fails
        self.shm_noted = -1e9  # when they were last looked for (see _note_shm)
        self.sel = selectors.DefaultSelector()
        self.listener = self._listen()
        self.sel.register(self.listener, selectors.EVENT_READ, None)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    @staticmethod
    def _listen() -> socket.socket:
        """A listening socket on every interface (IPv6 and IPv4 where the host has both)."""
        if socket.has_dualstack_ipv6():
            try:
                return socket.create_server(("", 0), family=socket.AF_INET6,
                                            dualstack_ipv6=True, backlog=socket.SOMAXCONN)
            except OSError:
                pass  # IPv6 present but unusable (a container without it): IPv4 alone
        return socket.create_server(("", 0), backlog=socket.SOMAXCONN)

    # ------------------------------------------------------------------ the loop
    def serve(self) -> int:
        """Serve until every rank has finalized and closed, or the job ended; the exit code."""
        while True:
            now = time.monotonic()
            if self.kill_at and now >= self.kill_at:
                self._kill_local()
            if self.ending:
                if now >= self.ending:
                    self._remove_shm()
                    return 1
                wait = min(self.ending, self.kill_at or self.ending) - now
            elif not self.barriers_passed:
                if now >= self.deadline:
                    self._close_all()  # MPI_Init fails in every rank that is waiting in it
                    return 1
                wait = self.deadline - now
            elif not self.ranks:
                return 0  # everyone finalized (or left) and closed
            else:
                self._note_shm()
                wait = 1.0
            for key, mask in self.sel.select(timeout=max(0.01, min(wait, 1.0))):
                if key.data is None:
                    self._accept()
                elif mask & selectors.EVENT_READ:
                    self._read(key.data)
                if key.data is not None and mask & selectors.EVENT_WRITE:
                    self._flush(key.data)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sel.register(sock, selectors.EVENT_READ, _Conn(sock))

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(c)
            return
        c.buf += data
        while b"\n" in c.buf:
            raw, c.buf = c.buf.split(b"\n", 1)
            self._handle(c, raw.decode("utf-8", "replace"))
            if c.sock.fileno() < 0:
                return
        if len(c.buf) > _LINE_MAX:
            self._drop(c)

    def _send(self, c: _Conn, line: str) -> None:
        c.out += (line + "\n").encode()
        self._flush(c)

    def _flush(self, c: _Conn) -> None:
        if c.sock.fileno() < 0:
            return
        try:
            sent = c.sock.send(c.out) if c.out else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            c.out = b""
            return
        c.out = c.out[sent:]
        self.sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0),
                        c)

    def _drop(self, c: _Conn) -> None:
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
    def _handle(self, c: _Conn, line: str) -> None:
        w = _words(line)
        cmd = w.get("cmd", "")
        if c.kind == "new":
            self._greet(c, cmd, w)
            return
        if c.kind == "watch":
            if cmd == "mpitensor-finalizing":  # the rank's own word: it is in MPI_Finalize
                pmi = self.ranks.get(c.rank)
                if pmi is not None:
                    pmi.finalized = True
            return  # watches otherwise only listen
        if cmd == "init":
            self._send(c, "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1")
        elif cmd == "get_maxes":
            self._send(c, f"cmd=maxes rc=0 kvsname_max={_KVSNAME_MAX} keylen_max={_KEY_MAX} "
                          f"vallen_max={_VAL_MAX}")
        elif cmd == "get_appnum":
            self._send(c, "cmd=appnum rc=0 appnum=0")
        elif cmd == "get_my_kvsname":
            self._send(c, f"cmd=my_kvsname rc=0 kvsname={self.kvsname}")
        elif cmd == "get_universe_size":
            self._send(c, f"cmd=universe_size rc=0 size={self.size}")
        elif cmd == "put":
            self.kvs[w.get("key", "")] = w.get("value", "")
            self._send(c, "cmd=put_result rc=0 msg=success")
        elif cmd == "get":
            value = self.kvs.get(w.get("key", ""))
            self._send(c, f"cmd=get_result rc=0 msg=success value={value}" if value is not None
                       else "cmd=get_result rc=-1 msg=key_not_found")
        elif cmd == "barrier_in":
            self.barrier.append(c)
            gone = sorted(set(range(self.size)) - set(self.ranks))
            if gone and self.barriers_passed and not self.ending:
                # a rank that has left can never enter it (one that said it was finalizing
                # and died inside MPI_Finalize): the waiters would wait for ever
                self._end(gone[0], 1, "ended inside MPI_Finalize, before the others could "
                                      "finish it")
                return
            self._release_barrier()
        elif cmd == "finalize":
            c.finalized = True
            self._send(c, "cmd=finalize_ack rc=0")
        elif cmd == "abort":
            code = w.get("exitcode", "1")
            self._end(c.rank, int(code) if code.lstrip("-").isdigit() else 1,
                      "called MPI_Abort")
        else:
            self._send(c, f"cmd={cmd or 'unknown'} rc=-1 msg=unsupported_by_mpitensor")

    def _greet(self, c: _Conn, cmd: str, w: Dict[str, str]) -> None:
        rank = w.get("rank", "")
        if (w.get("token") != self.token or not rank.isdigit()
                or not 0 <= int(rank) < self.size):
            self._drop(c)  # not one of ours
            return
        c.rank = int(rank)
        pid = w.get("pid", "")
        if w.get("host") == self.host and pid.isdigit():
            c.pid = int(pid)
        if cmd == "mpitensor-watch":
            c.kind = "watch"
            self.watches.append(c)
        elif cmd == "mpitensor-hello":
            if c.rank in self.ranks or self.barriers_passed:
                self._send(c, f"cmd=mpitensor-hello rc=1 msg=rank_{c.rank}_is_taken")
                return
            c.kind = "pmi"
            self.ranks[c.rank] = c
            self._send(c, "cmd=mpitensor-hello rc=0")
        else:
            self._drop(c)

    def _release_barrier(self) -> None:
        live = sum(1 for c in self.ranks.values() if c.sock.fileno() >= 0)
        if len(self.barrier) == self.size and live == self.size:
            for c in self.barrier:
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
        if c.kind != "pmi":
            return
        self.ranks.pop(c.rank, None)
        waited = c in self.barrier  # it left a barrier that others wait in: they never pass it
        if waited:
            self.barrier.remove(c)
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
            if not self.barriers_passed:
                self._close_all()  # during MPI_Init: make every other MPI_Init fail now
                self.ending = time.monotonic() + 0.01
            else:
                self._end(c.rank, 1, "ended without finalizing MPI (it exited, crashed or "
                                     "was killed)")

    def _end(self, rank: int, code: int, why: str) -> None:
        """Tell every watch that the job ends (once); kill what is left of it on this host a
        moment later; then stop.

        A rank's watch thread cannot act while its main thread holds Python's GIL inside a
        blocking MPI call (``MPI_Finalize``, say), so the ranks on this host that are still
        connected after the grace get SIGKILL, as ``mpiexec`` kills a failed job's ranks.
        """
        if self.ending:
            return
        # the files first: a rank told to end is gone a moment later, and its maps with it
        # (noted after the telling, the files of a two-rank job were left behind 1 run in 12)
        self._note_shm(force=True)
        for w in self.watches:
            self._send(w, f"cmd=mpitensor-end from={rank} code={code} why={why}")
        now = time.monotonic()
        self.kill_at = now + _KILL_GRACE_S
        self.ending = now + _END_LINGER_S

    def _note_shm(self, force: bool = False) -> None:
        """Add the MPICH shared-memory files the local ranks map now to the job's. Noted at
        every PMI barrier, about once a second while the job runs, and when it ends: by the time
        a failure is handled here its ranks may be gone, and their maps with them (once the
        helper, scheduled late, found none and left the job's files behind)."""
        now = time.monotonic()
        if now < self.shm_noted + 1.0 and not force:
            return
        self.shm_noted = now
        for c in self.ranks.values():
            if c.pid:
                self.shm |= _shm_files(c.pid)

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
        self.kill_at = 0.0
        for c in list(self.ranks.values()):
            if c.pid and c.sock.fileno() >= 0:  # connected: the process is alive
                try:
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


def main(argv: Optional[List[str]] = None) -> int:
    """The helper process: ``_pmi.py SIZE INIT_TIMEOUT_S`` with the token on stdin.

    Prints ``PORT KVSNAME`` on stdout once listening, then closes stdout.
    """
    args = sys.argv[1:] if argv is None else argv
    size, init_timeout = int(args[0]), float(args[1])
    token = sys.stdin.readline().strip()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends the ranks; they end us
    server = HelperServer(size, token, init_timeout)
    sys.stdout.write(f"{server.port} {server.kvsname}\n")
    sys.stdout.flush()
    os.close(1)
    return server.serve()


# ---------------------------------------------------------------------- the rank side
def start_helper(size: int, init_timeout: float) -> Tuple["subprocess.Popen[bytes]", int, str,
                                                           str]:
    """Start the helper process; return ``(process, port, kvsname, token)``.

    The helper runs in a session of its own (a Ctrl-C in the terminal reaches the ranks, and
    their sockets closing ends it) with no output of its own; it exits when every rank has
    finalized and closed, when the job ended, or ``init_timeout`` seconds after it started if
    the ranks never all arrived.
    """
    token = secrets.token_hex(16)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(size), repr(init_timeout)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write((token + "\n").encode())
        proc.stdin.close()
        line = proc.stdout.readline().decode().split()
        proc.stdout.close()
        if len(line) != 2 or not line[0].isdigit():
            raise RuntimeError(f"the PMI helper process did not start (exit code "
                               f"{proc.poll()}, said {line!r})")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, int(line[0]), line[1], token


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    delay = 0.01
    while True:
        try:
            sock = socket.create_connection(
                (host, port), timeout=min(_IO_MAX_S, max(0.1, deadline - time.monotonic())))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            if time.monotonic() + delay >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def connect_pmi(host: str, port: int, rank: int, token: str, deadline: float) -> int:
    """Connect to the helper as ``rank`` and return the socket's file descriptor for PMI_FD.

    The descriptor is detached from Python, so that nothing closes it before MPICH's
    ``MPI_Finalize`` has used it.

    Raises:
        ConnectionError: the helper refused the rank (taken) or closed the connection.
        OSError: the helper could not be reached before ``deadline``.
    """
    sock = _connect(host, port, deadline)
    try:
        sock.settimeout(min(_IO_MAX_S, max(0.1, deadline - time.monotonic())))
        sock.sendall(f"cmd=mpitensor-hello rank={rank} token={token} pid={os.getpid()} "
                     f"host={socket.gethostname()}\n".encode())
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(1)  # byte by byte: nothing past the reply may be read here
            if not chunk:
                raise ConnectionError("the PMI helper closed the connection")
            reply += chunk
        words = _words(reply.decode().strip())
        if words.get("rc") != "0":
            raise ConnectionError(f"the PMI helper refused rank {rank}: "
                                  f"{words.get('msg', reply.decode().strip())}")
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

    def __init__(self, host: str, port: int, rank: int, token: str, deadline: float) -> None:
        self.rank = rank
        self.sock = _connect(host, port, deadline)
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
        line = buf.split(b"\n", 1)[0].decode("utf-8", "replace")
        w = _words(line)
        if w.get("cmd") != "mpitensor-end":
            return
        code = int(w["code"]) if w.get("code", "").lstrip("-").isdigit() else 1
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
