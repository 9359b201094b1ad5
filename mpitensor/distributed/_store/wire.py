"""The TCPStore wire protocol: length-prefixed binary frames, nothing executable.

A connection starts with :data:`MAGIC`, sent by each side (the server first), so a client
that reached some other service, or a stray client of ours, fails at once with a clear error.
Then the client sends requests and the server answers each in order:

    request  = u32 length | u8 opcode | u32 field count | fields
    reply    = u32 length | u8 status | u32 field count | fields
    field    = u32 length | bytes

All integers are little-endian; ``length`` counts the bytes after itself. Numbers inside
fields (amounts, counters, timeouts in milliseconds) are signed 64-bit. Keys are at most
64 KiB, values at most 64 MiB, a request names at most :data:`MAX_KEYS` keys, a whole frame
is at most :data:`MAX_FRAME` bytes, a reply at most :data:`MAX_REPLY_BODY`; the server
answers anything else (an unknown opcode, a wrong field count, a field of the wrong size)
with a ``REJECTED`` reply and closes that connection only.

Where ``MPITENSOR_SECRET`` is set, the connection first runs the handshake of
``distributed/launch/auth.py`` (the server's challenge comes before :data:`MAGIC`), and the server
parses nothing else a client sends until that client has proven the secret.
"""

from __future__ import annotations

import struct
from typing import List, Optional, Sequence, Tuple

from .common import MAX_KEY_BYTES, MAX_KEYS, MAX_VALUE_BYTES

MAGIC = b"MPTSTOR1"
#: Largest frame either side accepts: one value of the largest size plus room for its key.
MAX_FRAME = MAX_VALUE_BYTES + 2 * MAX_KEY_BYTES + 1024
#: Largest reply a client accepts (a multi_get may return several large values).
MAX_REPLY = 2 ** 32 - 1
#: Most fields one frame may carry (a multi_set of MAX_KEYS pairs, plus its head).
MAX_FIELDS = 2 * MAX_KEYS + 2
#: Largest reply the server builds (beyond it a multi_get/list_keys is answered VALUE_ERROR).
MAX_REPLY_BODY = 1 << 30

_LEN = struct.Struct("<I")
_HEAD = struct.Struct("<BI")
_I64 = struct.Struct("<q")

# opcodes
SET, GET, ADD, CAS, APPEND, CHECK, WAIT, MGET, MSET, DELETE, NUMKEYS, LISTKEYS, JOIN, WORKERS = \
    range(1, 15)
# reply status
OK, TIMEOUT, VALUE_ERROR, REJECTED = range(4)

NAMES = {SET: "set", GET: "get", ADD: "add", CAS: "compare_set", APPEND: "append",
         CHECK: "check", WAIT: "wait", MGET: "multi_get", MSET: "multi_set",
         DELETE: "delete_key", NUMKEYS: "num_keys", LISTKEYS: "list_keys", JOIN: "join",
         WORKERS: "wait_for_workers"}

# Each opcode's fields: a fixed head (K = key, V = value, I = int64), then, for the
# variable-length opcodes, a repeated tail.
_LAYOUT = {
    SET: ("KV", ""), GET: ("IK", ""), ADD: ("KI", ""), CAS: ("KVV", ""), APPEND: ("KV", ""),
    CHECK: ("", "K"), WAIT: ("I", "K"), MGET: ("I", "K"), MSET: ("", "KV"), DELETE: ("K", ""),
    NUMKEYS: ("", ""), LISTKEYS: ("", ""), JOIN: ("", ""), WORKERS: ("II", ""),
}
_LIMIT = {"K": MAX_KEY_BYTES, "V": MAX_VALUE_BYTES}


class ProtocolError(ValueError):
    """A frame that breaks the protocol (the server closes the connection that sent it)."""


def i64(value: int) -> bytes:
    """An int64 field."""
    return _I64.pack(value)


def as_i64(field: bytes) -> int:
    """An int64 field's value."""
    return _I64.unpack(field)[0]


def encode(code: int, fields: Sequence[bytes]) -> bytes:
    """One frame (request or reply): ``code`` is the opcode or the status."""
    parts = [b"", _HEAD.pack(code, len(fields))]
    for f in fields:
        parts.append(_LEN.pack(len(f)))
        parts.append(f)
    body_len = sum(len(p) for p in parts)
    parts[0] = _LEN.pack(body_len)
    return b"".join(parts)


def encode_parts(code: int, fields: Sequence[bytes]) -> Tuple[List[bytes], int]:
    """One frame as a list of buffers and its total size, without copying large fields.

    Small pieces are joined; a field of 64 KiB or more is passed on as is, so a reply that
    returns a stored value refers to it instead of holding a second copy.
    """
    parts: List[bytes] = []
    small: List[bytes] = [b"", _HEAD.pack(code, len(fields))]
    total = _HEAD.size
    for f in fields:
        small.append(_LEN.pack(len(f)))
        total += _LEN.size + len(f)
        if len(f) >= 1 << 16:
            parts.append(b"".join(small))
            parts.append(f)
            small = []
        else:
            small.append(f)
    if small:
        parts.append(b"".join(small))
    if total > MAX_REPLY:
        raise ProtocolError(f"frame of {total} bytes does not fit its 32-bit length")
    parts[0] = _LEN.pack(total) + parts[0]
    return parts, total + _LEN.size


def frame_length(buf: bytes | bytearray, pos: int = 0, limit: int = MAX_FRAME) -> Optional[int]:
    """The body length announced at ``buf[pos:]`` (None until its 4 bytes are there).

    Raises:
        ProtocolError: the announced length is out of bounds.
    """
    if len(buf) - pos < _LEN.size:
        return None
    n = _LEN.unpack_from(buf, pos)[0]
    if n > limit:
        raise ProtocolError(f"frame of {n} bytes exceeds the limit of {limit} bytes")
    if n < _HEAD.size:
        raise ProtocolError(f"frame of {n} bytes is shorter than its header")
    return n


def decode(body: memoryview, max_fields: int = MAX_REPLY) -> Tuple[int, List[bytes]]:
    """A frame body (after the length) as ``(code, fields)``; fields are checked for framing.

    ``max_fields``: the most fields accepted (checked before any is copied).

    Raises:
        ProtocolError: the fields do not add up to the body.
    """
    code, count = _HEAD.unpack_from(body, 0)
    pos = _HEAD.size
    end = len(body)
    if count > (end - pos) // _LEN.size:
        raise ProtocolError(f"frame announces {count} fields in {end} bytes")
    if count > max_fields:
        raise ProtocolError(f"frame of {count} fields exceeds the limit of {max_fields} (at "
                            f"most {MAX_KEYS} keys per request)")
    fields = []
    for _ in range(count):
        if pos + _LEN.size > end:
            raise ProtocolError("frame ends inside a field header")
        n = _LEN.unpack_from(body, pos)[0]
        pos += _LEN.size
        if n > end - pos:
            raise ProtocolError(f"field of {n} bytes runs past the end of its frame")
        fields.append(bytes(body[pos:pos + n]))
        pos += n
    if pos != end:
        raise ProtocolError(f"{end - pos} stray bytes after the last field")
    return code, fields


def check_request(op: int, fields: List[bytes]) -> None:
    """Check a request's opcode, field count and field sizes against its layout.

    Raises:
        ProtocolError: unknown opcode, or fields that do not fit the opcode's layout.
    """
    layout = _LAYOUT.get(op)
    if layout is None:
        raise ProtocolError(f"unknown opcode {op}")
    head, tail = layout
    n_tail = len(fields) - len(head)
    if n_tail < 0 or (tail == "" and n_tail) or (tail and n_tail % len(tail)):
        raise ProtocolError(f"{NAMES[op]} request with {len(fields)} fields")
    if tail and n_tail // len(tail) > MAX_KEYS:
        raise ProtocolError(f"{NAMES[op]} request names {n_tail // len(tail)} keys, over the "
                            f"limit of {MAX_KEYS} keys per request")
    kinds = head + tail * (n_tail // len(tail) if tail else 0)
    for kind, f in zip(kinds, fields):
        if kind == "I":
            if len(f) != _I64.size:
                raise ProtocolError(f"{NAMES[op]}: an integer field of {len(f)} bytes")
        elif len(f) > _LIMIT[kind]:
            what = "key" if kind == "K" else "value"
            raise ProtocolError(f"{NAMES[op]}: {what} of {len(f)} bytes exceeds the limit of "
                                f"{_LIMIT[kind]} bytes")
