"""The TCPStore server: one thread, one selector, every client on non-blocking sockets.

A blocking request (``get``, ``wait``, ``multi_get``, the wait for workers) parks a waiter on
the keys it misses; the operations that write a key wake exactly the waiters parked on it, and
a heap of deadlines answers the rest with ``TIMEOUT``. Nothing polls. A connection whose
request is parked is not read for further requests until that one is answered (its bytes
are buffered), so each client sees its answers in order.

A connection that breaks the protocol gets a ``REJECTED`` reply and is closed; the others do
not notice. A client that disconnects, cleanly or mid-frame, just loses its waiter.
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
from typing import Deque, Dict, List, Optional, Set, Tuple

from . import wire
from .common import _Table

logger = logging.getLogger("mpitensor.distributed.store")

_RECV_CHUNK = 1 << 18
# A client with a parked request may send at most this much more before it is cut off (our
# client never sends while waiting; this only bounds what a misbehaving one can make us hold).
_MAX_PENDING = 2 * wire.MAX_FRAME + 64
# Seconds stop() waits for the thread to finish.
_STOP_GRACE = 5.0
# Seconds a rejected client has to read our answer before its connection is cut.
_LINGER = 2.0
# Seconds the server stops accepting after accept() failed.
_ACCEPT_PAUSE = 0.5


class _Conn:
    """One client connection: its socket, buffers and the request it has parked (if any)."""

    __slots__ = ("sock", "peer", "inbuf", "outbuf", "greeted", "waiter", "closing", "writing",
                 "close_by")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.greeted = False
        self.waiter: Optional[_Waiter] = None
        self.closing = False
        self.writing = False
        self.close_by = math.inf


class _Waiter:
    """A parked request: which keys it still misses and when it gives up."""

    __slots__ = ("conn", "op", "keys", "missing", "deadline", "target", "active")

    def __init__(self, conn: _Conn, op: int, keys: List[bytes], missing: Set[bytes],
                 deadline: float, target: int = 0) -> None:
        self.conn = conn
        self.op = op
        self.keys = keys
        self.missing = missing
        self.deadline = deadline
        self.target = target
        self.active = True


class StoreServer:
    """The server behind a master TCPStore; owns its listening socket once started."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.port: int = listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._table = _Table()
        # Workers counted by JOIN (None until the first one): torch keeps this as a key, so
        # num_keys counts it once it exists.
        self._joined: Optional[int] = None
        self._waiters: Dict[bytes, List[_Waiter]] = {}
        self._worker_waiters: List[_Waiter] = []
        self._deadlines: List[Tuple[float, int, _Waiter]] = []
        self._tick = itertools.count()
        self._ready: Deque[_Conn] = deque()
        self._lingering: List[_Conn] = []
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
                due = min([c.close_by for c in self._lingering] + [self._accept_paused_until])
                if self._deadlines:
                    due = min(due, self._deadlines[0][0])
                wait = None if due == math.inf else max(0.0, due - time.monotonic())
                for key, mask in self._sel.select(wait):
                    tag = key.data
                    if tag == "accept":
                        self._accept()
                    elif tag == "wake":
                        self._drain_wake()
                    else:
                        self._guard(tag, self._on_event, tag, mask)
                self._expire()
                while self._ready:
                    conn = self._ready.popleft()
                    self._guard(conn, self._serve, conn)
        except Exception:  # pragma: no cover - a bug here must not die silently
            logger.exception("TCPStore server on port %d stopped on an internal error",
                             self.port)
        finally:
            self._stopping = True
            self._close_all()

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

    # ---------------------------------------------------------------- requests
    def _serve(self, conn: _Conn) -> None:
        """Answer every complete request buffered for ``conn``, until one parks."""
        buf = conn.inbuf
        pos = 0
        try:
            while conn.waiter is None and not conn.closing and conn in self._conns:
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
                # a copy, not a view: a view still alive (in a traceback) would pin the buffer
                op, fields = wire.decode(memoryview(bytes(buf[pos + 4:pos + 4 + n])))
                pos += 4 + n
                wire.check_request(op, fields)
                self._dispatch(conn, op, fields)
        except wire.ProtocolError as exc:
            self._reject(conn, str(exc))
        finally:
            if pos and conn in self._conns:
                del buf[:pos]

    def _dispatch(self, conn: _Conn, op: int, f: List[bytes]) -> None:
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
            t.append(f[0], f[1])
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
            self._waiters.setdefault(k, []).append(w)
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
                    self._waiters.setdefault(k, []).append(w)
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
                try:
                    lst.remove(w)
                except ValueError:
                    pass
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
        if self._accept_paused_until <= now:
            self._accept_paused_until = math.inf
            self._sel.register(self.listener, selectors.EVENT_READ, "accept")

    # ---------------------------------------------------------------- output
    def _reply(self, conn: _Conn, status: int, fields: Optional[List[bytes]] = None) -> None:
        self._send(conn, wire.encode(status, fields or []))

    def _reject(self, conn: _Conn, reason: str) -> None:
        logger.warning("TCPStore server: rejected client %s: %s", conn.peer, reason)
        if conn not in self._conns:
            return
        if conn.waiter is not None:
            self._forget(conn.waiter)
        conn.closing = True
        conn.inbuf.clear()
        conn.close_by = time.monotonic() + _LINGER
        self._lingering.append(conn)
        self._send(conn, wire.encode(wire.REJECTED, [reason.encode()]))

    def _send(self, conn: _Conn, data: bytes) -> None:
        if conn not in self._conns:
            return
        conn.outbuf += data
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.outbuf:
            try:
                n = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn)
                return
            del conn.outbuf[:n]
        want_write = bool(conn.outbuf)
        if want_write != conn.writing:
            conn.writing = want_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._sel.modify(conn.sock, events, conn)
        if not conn.outbuf and conn.closing:
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
