"""The TCPStore server: one thread, one selector, every client on non-blocking sockets.

A blocking request (``get``, ``wait``, ``multi_get``, the wait for workers) parks a waiter on
the keys it misses; the operations that write a key wake exactly the waiters parked on it, and
a heap of deadlines answers the rest with ``TIMEOUT``. Nothing polls. A connection whose
request is parked is not read for further requests until that one is answered (its bytes
are buffered), so each client sees its answers in order.

A connection that breaks the protocol gets a ``REJECTED`` reply and is closed; the others do
not notice. A client that disconnects, cleanly or mid-frame, just loses its waiter.

What one connection can make the server hold is bounded: its input buffer (one frame, at most
``wire.MAX_FRAME``, plus one read), and its queued replies (back-pressure: while more than
``_OUT_HIGH`` bytes wait to be sent, the server neither reads from that connection nor serves
its next request, so a client that never reads its replies only fills its own socket).
Replies refer to the stored values instead of copying them. No deadline, however far, is
handed to ``select`` (whose timeout has a ceiling), and an unexpected error in the loop is
logged and survived.

With a shared secret (``MPITENSOR_SECRET``), a new connection is sent the challenge of
``distributed/launch/auth.py`` and nothing else it sends is parsed until its proof checks out; a
connection that has not finished its handshake within ``_HANDSHAKE_S`` is dropped.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Set, Tuple

from ..._base import config as _config
from ..launch import auth as _auth
from . import wire
from .common import _Table

logger = logging.getLogger("mpitensor.distributed.store")

_RECV_CHUNK = 1 << 18
# A client with a parked request may send at most this much more before it is cut off (our
# client never sends while waiting; this only bounds what a misbehaving one can make us hold).
_MAX_PENDING = wire.MAX_FRAME + 4
# While more than this many reply bytes wait to be sent on a connection, it is not read from
# and its next request is not served (back-pressure).
_OUT_HIGH = 256 * 1024
# Seconds a new connection has to send its greeting (and prove the secret, where there is one).
_HANDSHAKE_S = 10.0
# Most bytes a connection may send before its handshake is done (the proof and greeting are
# 80 bytes; our client sends nothing more before it is accepted).
_MAX_UNGREETED = 64 * 1024
# The longest single wait handed to select(): epoll's and poll's timeouts end near 24.8 days.
_MAX_SELECT_WAIT = 60.0
# Buffers handed to one sendmsg().
_IOV = 64
# Most keys the store holds: list_keys of this many holds the loop ~0.1 s on a loaded machine.
_MAX_STORE_KEYS = 1 << 15
# Seconds stop() waits for the thread to finish.
_STOP_GRACE = 5.0
# Seconds a rejected client has to read our answer before its connection is cut.
_LINGER = 2.0
# Seconds the server stops accepting after accept() failed.
_ACCEPT_PAUSE = 0.5
# The requests that write one key (their growth is checked without building a dict).
_ONE_KEY_WRITES = frozenset((wire.SET, wire.CAS, wire.ADD, wire.APPEND, wire.DELETE))


class _Conn:
    """One client connection: its socket, buffers and the request it has parked (if any)."""

    __slots__ = ("sock", "peer", "inbuf", "outq", "outlen", "greeted", "auth", "waiter",
                 "closing", "events", "close_by", "hold", "greet_by")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        # replies not yet sent: buffers (some of them stored values, not copies) and their size
        # (made when a reply is first queued: most never are, and each object the collector
        # tracks that lives as long as its connection brings its next full pass nearer)
        self.outq: Optional[Deque[memoryview]] = None
        self.outlen = 0
        self.greeted = False
        # the handshake in progress where the server has a secret, else None
        self.auth: Optional[_auth.ServerHandshake] = None
        self.waiter: Optional[_Waiter] = None
        self.closing = False
        self.events = selectors.EVENT_READ
        self.close_by = math.inf
        self.greet_by = math.inf  # when its handshake must be done
        # while its buffered requests are served: their replies are queued, and sent together
        self.hold = False


@dataclass(eq=False)  # (compared and hashed by identity: a waiter is a key of _waiters)
class _Waiter:
    """A parked request: which keys it still misses and when it gives up."""

    conn: _Conn
    op: int
    keys: List[bytes]
    missing: Set[bytes]
    deadline: float
    target: int = 0  # the workers a WORKERS request waits for
    active: bool = True


class StoreServer:
    """The server behind a master TCPStore; owns its listening socket once started."""

    def __init__(self, listener: socket.socket, secret: Optional[bytes] = None,
                 max_bytes: Optional[int] = None) -> None:
        self.listener = listener
        self._secret = secret
        # the most bytes (keys and values) the store holds; what it holds now
        self._max_bytes = _config.STORE_MAX_BYTES if max_bytes is None else max_bytes
        self._bytes = 0
        self.port: int = listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._table = _Table()
        # Workers counted by JOIN (None until the first one): torch keeps this as a key, so
        # num_keys counts it once it exists.
        self._joined: Optional[int] = None
        # key -> its waiters, in arrival order (a dict: a waiter that times out leaves in
        # O(1), not by a scan of every other waiter of that key: N ranks waiting for one key
        # with short timeouts made each round O(N^2))
        self._waiters: Dict[bytes, Dict[_Waiter, None]] = {}
        self._worker_waiters: List[_Waiter] = []
        self._deadlines: List[Tuple[float, int, _Waiter]] = []
        self._tick = itertools.count()
        self._ready: Deque[_Conn] = deque()
        self._lingering: List[_Conn] = []
        # (deadline, tick, connection) of the connections still in their handshake
        # the connections still in their handshake, oldest first (all have _HANDSHAKE_S)
        self._handshakes: Deque[_Conn] = deque()
        # While accept() fails (out of descriptors), the listener is left out of the selector
        # until this time, instead of waking the loop over and over.
        self._accept_paused_until = math.inf
        self._conns: Set[_Conn] = set()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"TCPStore-server:{self.port}",
                                        daemon=True)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, close every connection and the listening socket; idempotent."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_STOP_GRACE)
        if not self._thread.is_alive():
            self._close_all()

    def _close_all(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns):
            self._drop(conn)
        for sock in (self.listener, self._wake_r, self._wake_w):
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        self._sel.close()

    # ---------------------------------------------------------------- loop
    def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self._step()
                except Exception:  # a bug here must neither stop the server nor spin
                    logger.exception("TCPStore server on port %d: internal error in its loop; "
                                     "serving on", self.port)
                    time.sleep(0.01)
        finally:
            self._stopping = True
            self._close_all()

    def _step(self) -> None:
        """One turn of the loop: wait for events or the next deadline, then handle them.

        Kept short: while ranks arrive one by one nearly every request is a wake-up of its
        own, with the caches cold, and the master's CPU is mostly these turns."""
        due = self._accept_paused_until
        for c in self._lingering:
            due = min(due, c.close_by)
        if self._deadlines and self._deadlines[0][0] < due:
            due = self._deadlines[0][0]
        if self._handshakes and self._handshakes[0].greet_by < due:
            due = self._handshakes[0].greet_by
        now = time.monotonic()
        for key, mask in self._sel.select(min(_MAX_SELECT_WAIT, max(0.0, due - now))):
            conn = key.data
            if conn == "accept":
                self._accept()
            elif conn == "wake":
                self._drain_wake()
            elif mask == selectors.EVENT_READ:  # (the usual event: straight to the read)
                if conn in self._conns:
                    self._guard(conn, self._read, conn)
            else:
                self._guard(conn, self._on_event, conn, mask)
        if due <= time.monotonic():
            self._expire()
        while self._ready:
            conn = self._ready.popleft()
            self._guard(conn, self._serve, conn)

    def _guard(self, conn: _Conn, fn, *args) -> None:
        """Run one connection's handler; an unexpected error drops that connection only."""
        try:
            fn(*args)
        except Exception:
            logger.exception("TCPStore server: dropping client %s after an internal error",
                             conn.peer)
            self._drop(conn)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: keep serving the others
                logger.warning("TCPStore server on port %d: accept failed (%s); new clients "
                               "wait 0.5 s", self.port, exc)
                self._sel.unregister(self.listener)
                self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}")
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            conn.greet_by = time.monotonic() + _HANDSHAKE_S
            self._handshakes.append(conn)
            if self._secret is not None:
                conn.auth = _auth.ServerHandshake(self._secret)
                self._send(conn, conn.auth.hello)
            else:
                self._send(conn, wire.MAGIC)

    def _on_event(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if mask & selectors.EVENT_READ and conn in self._conns:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away, perhaps mid-request: forget it
            self._drop(conn)
            return
        if conn.closing:
            return
        conn.inbuf += data
        if conn.waiter is not None:
            if len(conn.inbuf) > _MAX_PENDING:
                self._reject(conn, "sent too much while a request was pending")
            return
        self._serve(conn)
        if (not conn.greeted and not conn.closing and conn in self._conns
                and len(conn.inbuf) > _MAX_UNGREETED):
            self._reject(conn, "sent too much before its handshake was done")

    # ---------------------------------------------------------------- requests
    def _serve(self, conn: _Conn) -> None:
        """Answer every complete request buffered for ``conn``, until one parks; the replies
        go out together (one send for requests that came together: a send on loopback is
        most of a request's cost, the receiver's side of TCP included)."""
        buf = conn.inbuf
        pos = 0
        conn.hold = True
        try:
            while (conn.waiter is None and not conn.closing and conn.outlen <= _OUT_HIGH
                   and conn in self._conns):
                if conn.auth is not None:
                    # nothing past the proof is looked at before the proof checks out
                    if (len(buf) - pos < _auth.PROOF_BYTES
                            and not conn.auth.foreign(bytes(buf[pos:pos + len(_auth.MAGIC)]))):
                        break
                    proof = bytes(buf[pos:pos + _auth.PROOF_BYTES])
                    pos += _auth.PROOF_BYTES
                    try:
                        accept = conn.auth.answer(proof)
                    except _auth.AuthError as exc:
                        self._refuse(conn, str(exc))
                        break
                    conn.auth = None
                    self._send(conn, accept + wire.MAGIC)
                    continue
                if not conn.greeted:
                    if len(buf) - pos < len(wire.MAGIC):
                        if not wire.MAGIC.startswith(bytes(buf[pos:])):
                            raise wire.ProtocolError("not an mpitensor TCPStore client")
                        break
                    if bytes(buf[pos:pos + len(wire.MAGIC)]) != wire.MAGIC:
                        raise wire.ProtocolError("not an mpitensor TCPStore client")
                    pos += len(wire.MAGIC)
                    conn.greeted = True
                    continue
                n = wire.frame_length(buf, pos)
                if n is None or len(buf) - pos - 4 < n:
                    break
                # released at once: a view still alive (in a traceback) would pin the buffer
                with memoryview(buf) as view, view[pos + 4:pos + 4 + n] as body:
                    op, fields = wire.decode(body, wire.MAX_FIELDS)
                pos += 4 + n
                wire.check_request(op, fields)
                self._dispatch(conn, op, fields)
        except wire.ProtocolError as exc:
            self._reject(conn, str(exc))
        finally:
            conn.hold = False
            if conn in self._conns:
                if pos:
                    del buf[:pos]
                if conn.outq:
                    self._flush(conn)
                    if (conn.inbuf and conn.waiter is None and not conn.closing
                            and conn.outlen <= _OUT_HIGH and conn not in self._ready):
                        self._ready.append(conn)  # stopped by its held replies, now sent

    def _dispatch(self, conn: _Conn, op: int, f: List[bytes]) -> None:
        """Serve a request, keeping the store within its limits of keys and bytes."""
        if op == wire.MSET:
            self._dispatch_many(conn, op, f, {k: len(v) for k, v in zip(f[0::2], f[1::2])})
            return
        if op not in _ONE_KEY_WRITES:
            self._serve_op(conn, op, f)
            return
        # one key written (most requests that write): plain arithmetic, no dictionaries
        data = self._table.data
        key = f[0]
        old = data.get(key)
        size = (len(f[-1]) if op in (wire.SET, wire.CAS) else 21 if op == wire.ADD
                else len(old or b"") + len(f[1]) if op == wire.APPEND else 0)
        before = 0 if old is None else len(key) + len(old)
        grow = len(key) + size - before
        if grow > 0 and ((old is None and len(data) + 1 > _MAX_STORE_KEYS)
                         or self._bytes + grow > self._max_bytes):
            self._refuse_growth(conn, op)
            return
        try:
            self._serve_op(conn, op, f)
        finally:
            new = data.get(key)
            self._bytes += (0 if new is None else len(key) + len(new)) - before

    def _dispatch_many(self, conn: _Conn, op: int, f: List[bytes],
                       sizes: Dict[bytes, int]) -> None:
        """:meth:`_dispatch` of a request that writes several keys (``sizes``: what each
        would hold at most afterwards, in bytes)."""
        data = self._table.data
        new_keys = sum(k not in data for k in sizes)
        grow = sum(n - len(data[k]) if k in data else len(k) + n for k, n in sizes.items())
        if grow > 0 and (len(data) + new_keys > _MAX_STORE_KEYS
                         or self._bytes + grow > self._max_bytes):
            self._refuse_growth(conn, op)
            return
        before = sum(len(k) + len(data[k]) for k in sizes if k in data)
        try:
            self._serve_op(conn, op, f)
        finally:
            self._bytes += sum(len(k) + len(data[k]) for k in sizes if k in data) - before

    def _refuse_growth(self, conn: _Conn, op: int) -> None:
        data = self._table.data
        self._reply(conn, wire.VALUE_ERROR, [(
            f"{wire.NAMES[op]}: the store holds {len(data)} keys and {self._bytes} bytes; "
            f"this would pass its limit of {_MAX_STORE_KEYS} keys or {self._max_bytes} "
            "bytes (MPITENSOR_STORE_MAX_BYTES on the master); delete keys you no longer "
            "need").encode()])

    def _serve_op(self, conn: _Conn, op: int, f: List[bytes]) -> None:
        t = self._table
        if op == wire.SET:
            t.set(f[0], f[1])
            self._reply(conn, wire.OK)
            self._wake(f[0])
        elif op in (wire.GET, wire.WAIT, wire.MGET):
            self._park(conn, op, f[1:], wire.as_i64(f[0]))
        elif op == wire.ADD:
            try:
                total = t.add(f[0], wire.as_i64(f[1]))
            except ValueError as exc:
                self._reply(conn, wire.VALUE_ERROR, [str(exc).encode()])
                return
            self._reply(conn, wire.OK, [wire.i64(total)])
            self._wake(f[0])
        elif op == wire.CAS:
            out = t.compare_set(f[0], f[1], f[2])
            self._reply(conn, wire.OK, [out])
            self._wake(f[0])
        elif op == wire.APPEND:
            try:
                t.append(f[0], f[1])
            except ValueError as exc:
                self._reply(conn, wire.VALUE_ERROR, [str(exc).encode()])
                return
            self._reply(conn, wire.OK)
            self._wake(f[0])
        elif op == wire.CHECK:
            self._reply(conn, wire.OK, [b"\x01" if not t.missing(f) else b"\x00"])
        elif op == wire.MSET:
            keys = f[0::2]
            for k, v in zip(keys, f[1::2]):
                t.set(k, v)
            self._reply(conn, wire.OK)
            for k in keys:
                self._wake(k)
        elif op == wire.DELETE:
            self._reply(conn, wire.OK, [b"\x01" if t.delete(f[0]) else b"\x00"])
        elif op == wire.NUMKEYS:
            count = len(t.data) + (self._joined is not None)
            self._reply(conn, wire.OK, [wire.i64(count)])
        elif op == wire.LISTKEYS:
            self._reply(conn, wire.OK, list(t.data))
        elif op == wire.JOIN:
            self._joined = (self._joined or 0) + 1
            self._reply(conn, wire.OK, [wire.i64(self._joined)])
            self._wake_workers()
        elif op == wire.WORKERS:
            self._park_workers(conn, wire.as_i64(f[1]), wire.as_i64(f[0]))

    # ---------------------------------------------------------------- waiting
    @staticmethod
    def _deadline(timeout_ms: int) -> float:
        # any int64 gives a finite float here; select() never sees more than _MAX_SELECT_WAIT
        return math.inf if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0

    def _park(self, conn: _Conn, op: int, keys: List[bytes], timeout_ms: int) -> None:
        missing = set(self._table.missing(keys))
        if not missing:
            self._answer(conn, op, keys)
            return
        w = _Waiter(conn, op, keys, missing, self._deadline(timeout_ms))
        if w.deadline <= time.monotonic():
            self._timeout(w)
            return
        conn.waiter = w
        for k in missing:
            self._waiters.setdefault(k, {})[w] = None
        if w.deadline != math.inf:
            heapq.heappush(self._deadlines, (w.deadline, next(self._tick), w))

    def _answer(self, conn: _Conn, op: int, keys: List[bytes]) -> None:
        values = [] if op == wire.WAIT else [self._table.data[k] for k in keys]
        self._reply(conn, wire.OK, values)

    def _wake(self, key: bytes) -> None:
        for w in self._waiters.pop(key, ()):
            if not w.active:
                continue
            w.missing.discard(key)
            if w.missing:
                continue
            # a key seen earlier may have been deleted since: park again on what is missing
            again = set(self._table.missing(w.keys))
            if again:
                w.missing = again
                for k in again:
                    self._waiters.setdefault(k, {})[w] = None
                continue
            self._finish(w)
            self._answer(w.conn, w.op, w.keys)

    def _park_workers(self, conn: _Conn, target: int, timeout_ms: int) -> None:
        w = _Waiter(conn, wire.WORKERS, [], set(), self._deadline(timeout_ms), target)
        if (self._joined or 0) >= target:
            self._reply(conn, wire.OK, [wire.i64(self._joined or 0)])
        elif w.deadline <= time.monotonic():
            self._timeout(w)
        else:
            conn.waiter = w
            self._worker_waiters.append(w)
            if w.deadline != math.inf:
                heapq.heappush(self._deadlines, (w.deadline, next(self._tick), w))

    def _wake_workers(self) -> None:
        keep = []
        for w in self._worker_waiters:
            if not w.active:
                continue
            if (self._joined or 0) >= w.target:
                self._finish(w)
                self._reply(w.conn, wire.OK, [wire.i64(self._joined or 0)])
            else:
                keep.append(w)
        self._worker_waiters = keep

    def _finish(self, w: _Waiter) -> None:
        """Retire a waiter and let its connection's next requests be served."""
        w.active = False
        conn = w.conn
        if conn.waiter is w:
            conn.waiter = None
            if conn.inbuf:
                self._ready.append(conn)

    def _forget(self, w: _Waiter) -> None:
        """Retire a waiter that will not be answered normally and unlink it from its keys."""
        self._finish(w)
        for k in w.missing:
            lst = self._waiters.get(k)
            if lst is not None:
                lst.pop(w, None)
                if not lst:
                    del self._waiters[k]

    def _timeout(self, w: _Waiter) -> None:
        self._forget(w)
        if w.op == wire.WORKERS:
            self._reply(w.conn, wire.TIMEOUT, [wire.i64(self._joined or 0)])
        else:
            self._reply(w.conn, wire.TIMEOUT, [k for k in w.keys if k in w.missing])

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, w = heapq.heappop(self._deadlines)
            if w.active:
                self._timeout(w)
        if self._lingering:
            for conn in [c for c in self._lingering if c.close_by <= now]:
                self._drop(conn)
        while self._handshakes and self._handshakes[0].greet_by <= now:
            conn = self._handshakes.popleft()
            if conn in self._conns and (not conn.greeted or conn.auth is not None):
                logger.warning("TCPStore server: dropping client %s: no handshake within "
                               "%g s", conn.peer, _HANDSHAKE_S)
                self._drop(conn)
        if self._accept_paused_until <= now:
            self._accept_paused_until = math.inf
            self._sel.register(self.listener, selectors.EVENT_READ, "accept")

    # ---------------------------------------------------------------- output
    def _reply(self, conn: _Conn, status: int, fields: Optional[List[bytes]] = None) -> None:
        fields = fields or []
        size = sum(len(f) + 4 for f in fields)
        if size > wire.MAX_REPLY_BODY:
            status, fields = wire.VALUE_ERROR, [
                f"the reply would be {size} bytes, over the limit of {wire.MAX_REPLY_BODY} "
                "bytes; ask for fewer keys per call".encode()]
        parts, _ = wire.encode_parts(status, fields)
        self._send(conn, *parts)

    def _refuse(self, conn: _Conn, reason: str) -> None:
        """Close a connection that failed to authenticate, telling it so first."""
        logger.warning("TCPStore server: refused client %s: %s", conn.peer, reason)
        self._close_after(conn, _auth.REFUSE)

    def _reject(self, conn: _Conn, reason: str) -> None:
        logger.warning("TCPStore server: rejected client %s: %s", conn.peer, reason)
        if conn not in self._conns:
            return
        self._close_after(conn, wire.encode(wire.REJECTED, [reason.encode()[:4096]]))

    def _close_after(self, conn: _Conn, last: bytes) -> None:
        """Send ``last`` (after what is queued), then close; nothing more is read or served."""
        if conn not in self._conns:
            return
        if conn.waiter is not None:
            self._forget(conn.waiter)
        conn.closing = True
        conn.inbuf.clear()
        conn.close_by = time.monotonic() + _LINGER
        self._lingering.append(conn)
        self._send(conn, last)

    def _send(self, conn: _Conn, *parts: bytes) -> None:
        if conn not in self._conns:
            return
        if len(parts) == 1 and not conn.outq and not conn.closing and not conn.hold:
            # nothing queued (the usual case): one send, and no queue, views or selector
            # change unless the kernel takes only part of it
            data = parts[0]
            try:
                sent = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(conn)
                return
            if sent == len(data):
                return
            parts = (memoryview(data)[sent:],)
        for p in parts:
            if p:
                if conn.outq is None:
                    conn.outq = deque()
                conn.outq.append(memoryview(p))
                conn.outlen += len(p)
        if not conn.hold:
            self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        q = conn.outq
        while q:
            try:
                n = conn.sock.sendmsg(list(itertools.islice(q, _IOV)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn)
                return
            conn.outlen -= n
            while n:
                head = q[0]
                if n >= len(head):
                    n -= len(head)
                    q.popleft()
                else:
                    q[0] = head[n:]
                    n = 0
        # back-pressure: a connection whose replies pile up is not read from; the kernel's
        # buffers then fill, and its sender blocks, instead of our memory growing
        events = selectors.EVENT_WRITE if q else 0
        if conn.outlen <= _OUT_HIGH or conn.closing:
            events |= selectors.EVENT_READ
        if events != conn.events:
            conn.events = events
            self._sel.modify(conn.sock, events, conn)
            if (events & selectors.EVENT_READ and conn.inbuf and conn.waiter is None
                    and not conn.closing):
                self._ready.append(conn)  # requests held back by the pressure
        if not q and conn.closing:
            # Half-close and read on until the client hangs up (or _LINGER passes): closing
            # with its unread bytes still queued would reset the connection and could destroy
            # our answer before the client reads it.
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        if conn.closing and conn in self._lingering:
            self._lingering.remove(conn)
        if conn.waiter is not None:
            w = conn.waiter
            self._forget(w)
            if w in self._worker_waiters:
                self._worker_waiters.remove(w)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        # the handshake heap may keep the object a while: let its buffers go now
        conn.inbuf = bytearray()
        conn.outq = None
        conn.outlen = 0
