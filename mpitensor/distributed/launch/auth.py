"""Mutual authentication by a shared secret: challenge and response with HMAC-SHA256.

Every process of one job gets the same secret through ``MPITENSOR_SECRET`` (``mpitensor-run``
makes a random one where none is set). A connection proves, in both directions, that each
side knows it; the secret itself never goes on the wire::

    server -> client   HELLO   = MAGIC | server nonce (32 bytes)                    40 bytes
    client -> server   PROOF   = MAGIC | client nonce (32) | HMAC(secret, "client"...) 72 bytes
    server -> client   ACCEPT  = 0x01  | HMAC(secret, "server" | nonces)           33 bytes
                  or   REFUSE  = 0x00, and the server closes the connection        1 byte

Both MACs cover both nonces, and the two directions use different labels, so a proof seen on
the wire cannot be replayed (the server's nonce is new on each connection) nor reflected (a
server's answer is no client's proof). Comparisons use :func:`hmac.compare_digest`. This
authenticates the peer; it does not encrypt nor protect later traffic against a
man-in-the-middle who can rewrite packets (see ``docs/launching.md``, the threat model).

API:

* :func:`secret_from_env` -- the secret of this process, or ``None`` (no authentication).
* :func:`server_handshake` / :func:`client_handshake` -- the whole exchange on a connected
  blocking socket, bounded by a timeout; return ``None`` or raise :class:`AuthError`.
* :class:`ServerHandshake` -- the server's side in pieces, for an event loop: send
  :attr:`~ServerHandshake.hello`, collect :data:`PROOF_BYTES` bytes, and call
  :meth:`~ServerHandshake.answer`, which returns the bytes to send (ACCEPT) or raises
  :class:`AuthError` (then send :data:`REFUSE` and close). Nothing the peer sent after its
  proof may be parsed before ``answer`` returned.

Example (a pair of connected sockets)::

    >>> a, b = socket.socketpair()
    >>> t = threading.Thread(target=server_handshake, args=(a, b"s3cret", 5.0)); t.start()
    >>> client_handshake(b, b"s3cret", 5.0); t.join()
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time
from typing import Optional

from ..._base import config as _config
from ...errors import MpiTensorError

__all__ = ["AuthError", "secret_from_env", "server_handshake", "client_handshake",
           "ServerHandshake", "MAGIC", "HELLO_BYTES", "PROOF_BYTES", "ACCEPT_BYTES", "REFUSE",
           "ENV_VAR"]

#: The environment variable that holds the shared secret.
ENV_VAR = _config.ENV_SECRET
#: First bytes of the server's hello and of the client's proof (a version tag).
MAGIC = b"MPTAUTH1"
_NONCE = 32
_MAC = hashlib.sha256().digest_size
HELLO_BYTES = len(MAGIC) + _NONCE
PROOF_BYTES = len(MAGIC) + _NONCE + _MAC
ACCEPT_BYTES = 1 + _MAC
_ACCEPT = b"\x01"
#: The server's answer to a wrong proof (then it closes the connection).
REFUSE = b"\x00"
_CLIENT_LABEL = b"mpitensor-auth-v1 client"
_SERVER_LABEL = b"mpitensor-auth-v1 server"


class AuthError(MpiTensorError):
    """A peer failed to prove that it knows the shared secret (``MPITENSOR_SECRET``), or the
    two sides disagree on whether there is one."""


def secret_from_env() -> Optional[bytes]:
    """The shared secret of this process: ``MPITENSOR_SECRET`` as UTF-8 bytes, or ``None``.

    Unset or empty means "no authentication". Read at each call, so a process that sets the
    variable before it creates its stores is covered.

    Example:
        >>> os.environ["MPITENSOR_SECRET"] = "s3cret"; secret_from_env()
        b's3cret'
    """
    return _config.env_secret()


def _mac(secret: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, label + server_nonce + client_nonce, hashlib.sha256).digest()


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise TypeError(f"the shared secret must be non-empty bytes, got {type(secret).__name__}")


class ServerHandshake:
    """The server's side of one connection's handshake, for a non-blocking event loop.

    Args:
        secret: the shared secret (non-empty bytes).

    Example:
        >>> hs = ServerHandshake(b"s3cret")
        >>> sock.sendall(hs.hello)                       # then collect PROOF_BYTES bytes
        >>> sock.sendall(hs.answer(proof))               # AuthError: send REFUSE, close
    """

    __slots__ = ("_secret", "_nonce", "hello")

    def __init__(self, secret: bytes) -> None:
        _check_secret(secret)
        self._secret = bytes(secret)
        self._nonce = os.urandom(_NONCE)
        #: the bytes to send first
        self.hello: bytes = MAGIC + self._nonce

    @staticmethod
    def foreign(start: bytes) -> bool:
        """Whether the first bytes a peer sent can no longer begin a proof: a peer that
        speaks another protocol (or answers nothing but its own request) is told at once,
        not after the greeting time-out."""
        head = bytes(start[:len(MAGIC)])
        return not MAGIC.startswith(head)

    def answer(self, proof: bytes) -> bytes:
        """Check the client's proof (exactly :data:`PROOF_BYTES` bytes); return ACCEPT.

        Raises:
            AuthError: the proof is malformed or wrong (the peer lacks the secret).
        """
        if len(proof) != PROOF_BYTES or not hmac.compare_digest(proof[:len(MAGIC)], MAGIC):
            raise AuthError("the peer did not answer the authentication challenge (it is not "
                            f"an mpitensor process, or runs without {ENV_VAR})")
        client_nonce = bytes(proof[len(MAGIC):len(MAGIC) + _NONCE])
        want = _mac(self._secret, _CLIENT_LABEL, self._nonce, client_nonce)
        if not hmac.compare_digest(bytes(proof[len(MAGIC) + _NONCE:]), want):
            raise AuthError(f"the peer's proof is wrong: its {ENV_VAR} differs from ours")
        return _ACCEPT + _mac(self._secret, _SERVER_LABEL, self._nonce, client_nonce)


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str) -> bytes:
    chunks = []
    while n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AuthError(f"authentication timed out waiting for the peer's {what}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n)
        except socket.timeout:
            raise AuthError(f"authentication timed out waiting for the peer's {what}") from None
        if not chunk:
            raise AuthError(f"the peer closed the connection during authentication (waiting "
                            f"for its {what}); check that {ENV_VAR} is the same on both sides")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def server_handshake(sock: socket.socket, secret: bytes, timeout: float) -> None:
    """Run the server's side on a connected blocking socket, within ``timeout`` seconds.

    On a wrong proof the peer gets :data:`REFUSE` before this raises; the caller closes.

    Raises:
        AuthError: the peer failed to authenticate, closed, or took longer than ``timeout``.
        OSError: the connection broke.
    """
    deadline = time.monotonic() + timeout
    hs = ServerHandshake(secret)
    sock.settimeout(timeout)
    sock.sendall(hs.hello)
    proof = _recv_exact(sock, PROOF_BYTES, deadline, "proof")
    try:
        reply = hs.answer(proof)
    except AuthError:
        try:
            sock.sendall(REFUSE)
        except OSError:
            pass
        raise
    sock.sendall(reply)


def client_handshake(sock: socket.socket, secret: bytes, timeout: float,
                     hello: Optional[bytes] = None) -> None:
    """Run the client's side on a connected blocking socket, within ``timeout`` seconds.

    Args:
        sock: connected to the server.
        secret: the shared secret.
        timeout: seconds for the whole exchange.
        hello: the server's first :data:`HELLO_BYTES` bytes where the caller already read
            them (to tell an authenticating server from another), else ``None``.

    Raises:
        AuthError: the server does not authenticate, refused our proof (the secrets differ),
            failed to prove it knows the secret, or did not answer within ``timeout``.
        OSError: the connection broke.
    """
    _check_secret(secret)
    deadline = time.monotonic() + timeout
    if hello is None:
        hello = _recv_exact(sock, HELLO_BYTES, deadline, "challenge")
    if len(hello) != HELLO_BYTES or not hello.startswith(MAGIC):
        raise AuthError(f"the server did not send an authentication challenge, but {ENV_VAR} "
                        "is set here: set it to the same value in every process of the job "
                        "(or unset it everywhere)")
    server_nonce = hello[len(MAGIC):]
    client_nonce = os.urandom(_NONCE)
    proof = MAGIC + client_nonce + _mac(secret, _CLIENT_LABEL, server_nonce, client_nonce)
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    sock.sendall(proof)
    first = _recv_exact(sock, 1, deadline, "verdict")
    if first != _ACCEPT:
        raise AuthError(f"the server refused our proof: {ENV_VAR} differs between this "
                        "process and the server's; give every process of the job the same value")
    theirs = _recv_exact(sock, _MAC, deadline, "proof")
    want = _mac(secret, _SERVER_LABEL, server_nonce, client_nonce)
    if not hmac.compare_digest(theirs, want):
        raise AuthError(f"the server failed to prove that it knows {ENV_VAR}: it is not the "
                        "server of this job (check the address and port)")
