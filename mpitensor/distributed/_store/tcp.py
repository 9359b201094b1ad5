"""``TCPStore``: a store served by the master process over TCP (torch's ``TCPStore``).

The master (``is_master=True``) starts a :class:`~.server.StoreServer` thread and then, like
every other user, talks to it as a client over one TCP connection. Clients retry connecting
until the timeout, so they may start before the master. Each handle sends one request at a
time (a lock serializes threads sharing it; :meth:`TCPStore.clone` gives a thread its own
connection).
"""

from __future__ import annotations

import errno
import math
import os
import socket
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Callable, List, Optional, Tuple

from ..launch import auth as _auth
from . import wire
from .common import (
    DEFAULT_TIMEOUT,
    DistNetworkError,
    DistStoreError,
    Store,
    StoreTimeoutError,
    amount_int,
    show_key,
    timeout_message,
)
from .server import StoreServer

__all__ = ["TCPStore"]

# Seconds a client waits for a reply beyond the server's own deadline before it gives up on
# a server that is alive but stuck (a dead one is noticed at once: its socket closes).
_REPLY_GRACE = 10.0
# Seconds the requests that never wait (set, add, ...) may take at least.
_MIN_IO_TIMEOUT = 30.0
# Retry delays while the master is not listening yet: start short, back off to this.
_MAX_RETRY_DELAY = 0.5
# Linux's "more is coming" flag: the kernel holds the bytes until the next send, or 0.2 s
_MORE = getattr(socket, "MSG_MORE", 0)


def _io_deadline(seconds: float) -> Optional[float]:
    return None if math.isinf(seconds) else time.monotonic() + seconds


def _recv_exact(sock: socket.socket, n: int, deadline: Optional[float]) -> bytes:
    """Read exactly ``n`` bytes; ``EOFError`` if the peer closes first, ``socket.timeout`` at
    the deadline."""
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            sock.settimeout(left)
        else:
            sock.settimeout(None)
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("connection closed by the server")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _self_connected(sock: socket.socket) -> bool:
    """Whether ``sock`` is connected to itself: a connect to a port of this host where nothing
    listens yet may be given that very port as its own (TCP's simultaneous open), and would
    then hold the port its master is about to listen on (the master fails: port in use)."""
    try:
        return sock.getsockname() == sock.getpeername()
    except OSError:
        return False


def _keepalive(sock: socket.socket) -> None:
    """Let the kernel notice a master host that vanished without closing the connection."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _listen(port: int, listen_fd: Optional[int]) -> socket.socket:
    """The master's listening socket: on every interface (as torch's), IPv6 and IPv4 where
    the host has both."""
    if listen_fd is not None:
        sock = socket.socket(fileno=listen_fd)
        sock.listen(socket.SOMAXCONN)
        return sock
    try:
        if socket.has_dualstack_ipv6():
            try:
                return socket.create_server(("", port), family=socket.AF_INET6,
                                            dualstack_ipv6=True, backlog=socket.SOMAXCONN)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise
                # IPv6 present but unusable here (a container without it): IPv4 alone
        return socket.create_server(("", port), backlog=socket.SOMAXCONN)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise DistNetworkError(
                f"TCPStore master cannot listen on port {port}: the address is already in use "
                "(another TCPStore master, an earlier run that is still exiting, or another "
                "program holds it); choose another port (MASTER_PORT), or pass port=0 to get "
                "a free one and read it from .port") from None
        raise DistNetworkError(f"TCPStore master cannot listen on port {port}: {exc}") from exc


class TCPStore(Store):
    """A store held by a server in the master process and reached over TCP (torch's TCPStore).

    Create it with ``is_master=True`` in one process (it serves the data from a background
    thread for as long as that object lives) and with ``is_master=False`` everywhere else.
    Values are ``bytes``; ``get``/``wait`` block in the server until the keys are set or the
    timeout passes, and raise :class:`StoreTimeoutError` then. A client whose master exits
    gets :class:`DistNetworkError` at once.

    Args:
        host_name: the master's host name or address (the master itself listens on every
            interface, as torch's does).
        port: the master's port; ``0`` on the master picks a free one (read it from
            :attr:`port`).
        world_size: the number of store users (master included), or ``None`` for any number.
            With ``wait_for_workers``, each user counts itself in and the master's
            constructor waits until ``world_size`` have.
        is_master: whether this process runs the server.
        timeout: how long constructors wait for the master/the workers, and the default
            timeout of ``get``/``wait``.
        wait_for_workers: see ``world_size``.
        multi_tenant: accepted for torch compatibility and ignored: one server per master
            object (a second master on a used port fails with a clear error).
        master_listen_fd: a listening socket's file descriptor to serve on instead of binding
            ``port`` (the store takes it over).
        use_libuv: accepted for torch compatibility and ignored (the server uses Python's
            ``selectors``).

    Raises:
        ValueError: ``world_size`` is 0, ``port`` is out of range, or a client got port 0.
        DistNetworkError: the master's port is taken, or the master could not be reached
            within ``timeout`` (the message names host and port).
        StoreTimeoutError: the master's wait for ``world_size`` workers ran out of time.

    Example:
        >>> master = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30))
        >>> worker = TCPStore("127.0.0.1", master.port, 2, False)   # in another process
        >>> master.set("first_key", "first_value")
        >>> worker.get("first_key")
        b'first_value'
    """

    def __init__(self, host_name: str, port: int, world_size: Optional[int] = None,
                 is_master: bool = False, timeout: timedelta = DEFAULT_TIMEOUT,
                 wait_for_workers: bool = True, multi_tenant: bool = False,
                 master_listen_fd: Optional[int] = None, use_libuv: bool = True) -> None:
        super().__init__(timeout)
        if not isinstance(host_name, str) or not host_name:
            raise TypeError(f"TCPStore host_name must be a non-empty str, got {host_name!r}")
        port = amount_int(port)
        if not 0 <= port <= 65535:
            raise ValueError(f"TCPStore port must be in 0..65535, got {port}")
        if world_size is not None:
            world_size = amount_int(world_size)
            if world_size == 0:
                raise ValueError("TCPStore world_size cannot be 0; pass None (or -1) for "
                                 "any number of users")
            if world_size < 0:
                world_size = None
        if not is_master and port == 0:
            raise ValueError("a TCPStore client (is_master=False) needs the master's port; "
                             "port=0 only lets a master pick a free one")
        self._host = host_name
        self._world_size = world_size
        self._is_master = bool(is_master)
        server = None
        connect_to = host_name
        secret = _auth.secret_from_env()
        if is_master:
            listener = _listen(port, master_listen_fd)
            server = StoreServer(listener, secret)
            server.start()
            port = server.port
            # The master reaches its own server over loopback: its host_name may name an
            # interface that routes elsewhere.
            bound = listener.getsockname()[0]
            connect_to = "127.0.0.1" if bound in ("", "0.0.0.0", "::") else bound
        self._init_handle(server, connect_to, port, secret)
        try:
            self._sock = self._holder[0] = self._connect(self._timeout_s, retry=True)
            if world_size is not None and wait_for_workers:
                self._request(wire.JOIN, [])
                if is_master:
                    self._wait_for_workers(world_size)
        except BaseException:
            self.close()
            raise

    def _init_handle(self, server: Optional[StoreServer], connect_to: str, port: int,
                     secret: Optional[bytes]) -> None:
        """The per-handle state: lock, socket slot, and the finalizer that releases them."""
        self._server = server
        # MPITENSOR_SECRET as it was when the store was made (clones and reconnects keep it)
        self._secret = secret
        self._connect_to = connect_to
        self._port = port
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._closed = False
        # The finalizer sees the socket through this list, never through the store object,
        # so an abandoned store is still collected (and its server stopped).
        self._holder: List[Optional[socket.socket]] = [None]
        self._closer = weakref.finalize(self, _close_handle, server, self._holder, os.getpid())

    # ---------------------------------------------------------------- attributes
    @property
    def host(self) -> str:
        """The master's host name, as given."""
        return self._host

    @property
    def port(self) -> int:
        """The master's port (the one picked when the master got port 0)."""
        return self._port

    @property
    def libuvBackend(self) -> bool:  # noqa: N802 - torch's name
        """Return False: the server is Python's ``selectors``, not libuv."""
        return False

    def clone(self) -> "TCPStore":
        """Return a new client connection to the same master (one per thread, as in torch)."""
        other = TCPStore.__new__(TCPStore)
        Store.__init__(other, self.timeout)
        other._host, other._world_size, other._is_master = self._host, None, False
        other._init_handle(None, self._connect_to, self._port, self._secret)
        other._sock = other._holder[0] = other._connect(other._timeout_s, retry=True)
        return other

    def close(self) -> None:
        """Close this handle's connection; on the master, also stop the server.

        Clients still connected then get :class:`DistNetworkError`. Runs when the object is
        garbage collected; idempotent.
        """
        # Not under the lock: a thread may be parked in get() on this handle. Shutting the
        # socket down wakes it (with an error) instead of waiting for its timeout.
        self._closed = True
        sock = self._holder[0]
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._closer()

    # ---------------------------------------------------------------- connection
    def _where(self) -> str:
        return f"{self._host}:{self._port}"

    def _connect(self, seconds: float, retry: bool) -> socket.socket:
        """Connect and check the greeting; with ``retry``, keep trying until ``seconds``."""
        deadline = _io_deadline(seconds)
        delay = 0.01
        last: Any = None
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            # each attempt gets at least a moment, so a zero timeout still tries once
            attempt = 10.0 if left is None else min(max(left, 0.5), 10.0)
            sock: Optional[socket.socket] = None
            try:
                sock = socket.create_connection((self._connect_to, self._port),
                                                timeout=attempt)
            except OSError as exc:  # refused, unreachable, unknown host (gaierror), timeout
                last = exc
            if sock is not None and _self_connected(sock):
                sock.close()  # the port is free again for the master that will listen there
                sock, last = None, "connected to itself: nothing listens there yet"
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    _keepalive(sock)
                    greeting = self._greet(sock, time.monotonic() + attempt)
                except (OSError, EOFError) as exc:
                    sock.close()
                    last = exc
                except BaseException:
                    sock.close()
                    raise
                else:
                    if greeting != wire.MAGIC:
                        sock.close()
                        raise DistNetworkError(
                            f"{self._where()} answered, but is not an mpitensor TCPStore "
                            "master; check MASTER_ADDR/MASTER_PORT")
                    # held back for the first request (at most 0.2 s where none follows):
                    # greeting and request reach the master together, one wake-up of its
                    # loop a connection fewer (a rendezvous of N ranks: N fewer)
                    sock.sendall(wire.MAGIC, _MORE)
                    return sock
            left = None if deadline is None else deadline - time.monotonic()
            if not retry or (left is not None and left <= 0):
                break
            time.sleep(delay if left is None else min(delay, left))
            delay = min(delay * 2, _MAX_RETRY_DELAY)
        waited = "" if not retry else f" within {seconds:g} s"
        raise DistNetworkError(
            f"could not connect to the TCPStore master at {self._where()}{waited} (last "
            f"error: {last}); check that the master process (is_master=True) is running and "
            "that host and port (MASTER_ADDR/MASTER_PORT) are right") from None

    def _greet(self, sock: socket.socket, deadline: float) -> bytes:
        """Read the server's greeting, authenticating first where either side has a secret.

        Returns the store greeting (checked by the caller).

        Raises:
            AuthError: one side has a secret and the other none, or the secrets differ.
        """
        first = _recv_exact(sock, len(wire.MAGIC), deadline)
        if first == _auth.MAGIC:
            if self._secret is None:
                raise _auth.AuthError(
                    f"the TCPStore master at {self._where()} requires a shared secret: set "
                    f"{_auth.ENV_VAR} in this process to the master's value (mpitensor-run "
                    "passes one to the processes it starts)")
            hello = first + _recv_exact(sock, _auth.HELLO_BYTES - len(first), deadline)
            try:
                _auth.client_handshake(sock, self._secret, max(deadline - time.monotonic(),
                                                               0.001), hello)
            except _auth.AuthError as exc:
                raise _auth.AuthError(f"TCPStore master at {self._where()}: {exc}") from None
            return _recv_exact(sock, len(wire.MAGIC), deadline)
        if self._secret is not None and first == wire.MAGIC:
            raise _auth.AuthError(
                f"the TCPStore master at {self._where()} does not authenticate, but "
                f"{_auth.ENV_VAR} is set in this process: set it to the same value in every "
                "process of the job, the master's included (or unset it everywhere)")
        return first

    def _request(self, op: int, fields: List[bytes],
                 wait_s: Optional[float] = None) -> Tuple[int, List[bytes]]:
        """Send one request and return ``(status, fields)`` of its reply.

        ``wait_s``: the server-side wait of a blocking request (None: it does not block).
        """
        return self._requests([(op, fields)], wait_s)[0]

    def _requests(self, reqs: List[Tuple[int, List[bytes]]], wait_s: Optional[float] = None,
                  until: Optional[Callable[[List[Tuple[int, List[bytes]]]], bool]] = None
                  ) -> List[Tuple[int, List[bytes]]]:
        """Send requests together (one segment: one wake-up of the master's loop, not one
        each) and return their replies, in order; only the last may block (``wait_s``).

        ``until(replies so far)``, asked after each reply but the last: True stops reading
        there, and the connection is dropped (the next request makes a fresh one), since the
        replies left unread (a parked ``get`` among them) would pair with later requests.
        Raises as for one request, for the first reply that failed, once all were read.
        """
        frames = [wire.encode(op, fields) for op, fields in reqs]
        for (op, _), frame in zip(reqs, frames):
            if len(frame) - 4 > wire.MAX_FRAME:
                raise ValueError(f"TCPStore.{wire.NAMES[op]}: the request of {len(frame)} "
                                 f"bytes exceeds the limit of {wire.MAX_FRAME} bytes; split it")
        op = reqs[0][0]  # named by the errors below: the request whose reply failed
        if wait_s is None:
            reply_s = max(self._timeout_s, _MIN_IO_TIMEOUT)
        else:
            reply_s = wait_s + _REPLY_GRACE
        replies: List[Tuple[int, List[bytes]]] = []
        with self._lock:
            if self._closed:
                raise DistStoreError(f"TCPStore.{wire.NAMES[op]}: this handle on "
                                     f"{self._where()} was closed")
            sock = self._sock
            if sock is None:
                # the last request lost its connection: one fresh attempt, without retrying
                sock = self._connect(min(self._timeout_s, 5.0), retry=False)
                self._sock = self._holder[0] = sock
            deadline = _io_deadline(reply_s)
            try:
                sock.settimeout(None if deadline is None else reply_s)
                sock.sendall(frames[0] if len(frames) == 1 else b"".join(frames))
                for req in reqs:
                    op = req[0]  # (named by the errors below: the reply that failed)
                    n = wire.frame_length(_recv_exact(sock, 4, deadline), 0, wire.MAX_REPLY)
                    if n is None:
                        raise wire.ProtocolError("short reply header")
                    replies.append(wire.decode(memoryview(_recv_exact(sock, n, deadline))))
                    if len(replies) < len(reqs) and (
                            replies[-1][0] == wire.REJECTED  # (the master closes then)
                            or (until is not None and until(replies))):
                        self._lose()
                        break
            except socket.timeout:
                self._lose()
                raise StoreTimeoutError(
                    f"TCPStore.{wire.NAMES[op]}: no reply from the master at {self._where()} "
                    f"within {reply_s:g} s; the master process is alive but not answering "
                    "(stopped in a debugger, or overloaded)", op=wire.NAMES[op],
                    elapsed=reply_s) from None
            except (OSError, EOFError, wire.ProtocolError) as exc:
                self._lose()
                if self._closed:
                    raise DistStoreError(f"TCPStore.{wire.NAMES[op]}: this handle on "
                                         f"{self._where()} was closed meanwhile") from None
                raise DistNetworkError(
                    f"TCPStore.{wire.NAMES[op]}: lost the connection to the master at "
                    f"{self._where()} ({exc}); the master process has probably exited or "
                    "crashed (the store lives as long as the master's TCPStore object): "
                    "check its output") from None
        for (op, _), (status, out) in zip(reqs, replies):
            if status == wire.REJECTED:
                raise DistStoreError(
                    f"TCPStore.{wire.NAMES[op]}: the master at {self._where()} rejected the "
                    f"request: {out[0].decode(errors='replace')}")
            if status == wire.VALUE_ERROR:
                raise ValueError(out[0].decode(errors="replace"))
        return replies

    def _lose(self) -> None:
        """Drop a connection whose request/reply pairing can no longer be trusted."""
        if self._sock is not None:
            self._sock.close()
        self._sock = self._holder[0] = None

    def _wait_for_workers(self, world_size: int) -> None:
        start = time.monotonic()
        status, out = self._request(wire.WORKERS, [self._ms(self._timeout_s),
                                                   wire.i64(world_size)], self._timeout_s)
        if status == wire.TIMEOUT:
            joined = wire.as_i64(out[0])
            raise StoreTimeoutError(
                f"TCPStore master on port {self._port}: only {joined} of world_size="
                f"{world_size} store users connected within {self._timeout_s:g} s; start the "
                "other processes with the same host, port and world_size (or pass "
                "wait_for_workers=False)", op="wait_for_workers",
                elapsed=time.monotonic() - start)

    @staticmethod
    def _ms(seconds: float) -> bytes:
        return wire.i64(-1 if math.isinf(seconds) else int(math.ceil(seconds * 1000)))

    # ---------------------------------------------------------------- primitives
    def _set(self, key: bytes, value: bytes) -> None:
        self._request(wire.SET, [key, value])

    def _add(self, key: bytes, amount: int) -> int:
        return wire.as_i64(self._request(wire.ADD, [key, wire.i64(amount)])[1][0])

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        return self._request(wire.CAS, [key, expected, desired])[1][0]

    def _append(self, key: bytes, value: bytes) -> None:
        self._request(wire.APPEND, [key, value])

    def _multi_get(self, keys: List[bytes], seconds: float, op: str) -> List[bytes]:
        code = {"get": wire.GET, "wait": wire.WAIT}.get(op, wire.MGET)
        start = time.monotonic()
        status, out = self._request(code, [self._ms(seconds)] + keys, seconds)
        if status == wire.TIMEOUT:
            raise StoreTimeoutError(
                timeout_message("TCPStore", op, out, seconds, f" (master {self._where()})"),
                op=op, elapsed=time.monotonic() - start, keys=[show_key(k) for k in out])
        return out

    def _wait(self, keys: List[bytes], seconds: float) -> None:
        self._multi_get(keys, seconds, "wait")

    def _multi_set(self, keys: List[bytes], values: List[bytes]) -> None:
        fields: List[bytes] = []
        for k, v in zip(keys, values):
            fields += (k, v)
        self._request(wire.MSET, fields)

    def _check(self, keys: List[bytes]) -> bool:
        return self._request(wire.CHECK, keys)[1][0] == b"\x01"

    def _delete(self, key: bytes) -> bool:
        return self._request(wire.DELETE, [key])[1][0] == b"\x01"

    def _num_keys(self) -> int:
        return wire.as_i64(self._request(wire.NUMKEYS, [])[1][0])

    def _list_keys(self) -> List[bytes]:
        return self._request(wire.LISTKEYS, [])[1]

    def __repr__(self) -> str:
        role = "master" if self._is_master else "client"
        return f"TCPStore({role} of {self._where()})"


def _close_handle(server: Optional[StoreServer], holder: List[Optional[socket.socket]],
                  pid: int) -> None:
    """Close a handle's socket and stop its server (the finalizer)."""
    sock = holder[0]
    holder[0] = None
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass
    # A forked child inherits the object but not the server thread: only the creator stops it.
    if server is not None and os.getpid() == pid:
        server.stop()
