"""What every store shares: the errors, argument checks, the key-value table and ``Store``.

The table (:class:`_Table`) is the one place that defines what ``set``, ``add``,
``compare_set``, ``append`` and ``delete_key`` do to the data; :class:`HashStore` wraps it in a
lock, the TCP server owns one, and :class:`FileStore` rebuilds one from its file. So the stores
agree by construction, and the parity tests against torch check one definition.
"""

from __future__ import annotations

import math
import re
import threading
import time
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ...errors import DistributedTimeoutError, MpiTensorError

__all__ = [
    "DistError",
    "DistStoreError",
    "DistNetworkError",
    "StoreTimeoutError",
    "Store",
    "HashStore",
    "PrefixStore",
]

#: Longest key any store accepts, in bytes (UTF-8 for ``str`` keys).
MAX_KEY_BYTES = 64 * 1024
#: Largest value any store accepts, in bytes (also what ``append`` may grow a value to).
MAX_VALUE_BYTES = 64 * 1024 * 1024
#: Most keys one call may name (``wait``, ``multi_get``, ``multi_set``, ``check``): the TCP
#: server parks each missing key, and other clients wait while it does.
MAX_KEYS = 1 << 13
#: torch's default store timeout.
DEFAULT_TIMEOUT = timedelta(seconds=300)

_INT64_MIN = -(2 ** 63)
_INT64_MAX = 2 ** 63 - 1
# A timeout this long (about 30 years) means "wait forever"; timedelta.max lands here.
_FOREVER_S = 1e9
# The leading part of a counter value that ``add`` reads, as C's strtoll does (whitespace,
# a sign, digits; the rest is ignored), so values written by torch-style code count the same.
_COUNTER = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")

Key = Union[str, bytes]
Value = Union[str, bytes, bytearray, memoryview]


class DistError(MpiTensorError):
    """Root of the store errors (torch's ``torch.distributed.DistError``)."""


class DistStoreError(DistError):
    """A store operation failed (torch's ``torch.distributed.DistStoreError``)."""


class DistNetworkError(DistError, ConnectionError):
    """A store could not reach its server, or lost the connection to it.

    torch's ``torch.distributed.DistNetworkError``; also a ``ConnectionError``.
    """


class StoreTimeoutError(DistStoreError, DistributedTimeoutError):
    """A store's ``get``/``wait``/``barrier`` (or the wait for workers) ran out of time.

    Both torch's ``DistStoreError`` and mpitensor's :class:`DistributedTimeoutError` (hence also a
    ``TimeoutError``), so either ``except`` clause catches it. ``keys`` lists the keys still
    missing; ``op`` and ``elapsed`` (seconds) are set as in :class:`DistributedTimeoutError`.
    """

    def __init__(self, message: str, op: Optional[str] = None, elapsed: Optional[float] = None,
                 keys: Optional[List[str]] = None) -> None:
        DistributedTimeoutError.__init__(self, message, op=op, elapsed=elapsed)
        self.keys = list(keys or [])


# ---------------------------------------------------------------------------- arguments
def _encoded(obj: Any, byteslike: Any, what: str, kinds: str, limit: int,
             advice: str) -> bytes:
    """``obj`` as bytes (a ``str`` in UTF-8, one of ``byteslike`` as is), at most ``limit``
    bytes long: the one check of every key and value a store is given.

    Raises:
        TypeError: ``obj`` is neither (the message names ``kinds``, what is accepted).
        ValueError: it is longer than ``limit`` bytes (the message ends with ``advice``).
    """
    if isinstance(obj, str):
        raw = obj.encode("utf-8", "surrogateescape")
    elif isinstance(obj, byteslike):
        raw = bytes(obj)
    else:
        raise TypeError(f"a store {what} must be {kinds}, got {type(obj).__name__}: "
                        f"{obj!r:.80}")
    if len(raw) > limit:
        raise ValueError(f"store {what} of {len(raw)} bytes is longer than the limit of "
                         f"{limit} bytes; {advice}")
    return raw


def key_bytes(key: Any, what: str = "key") -> bytes:
    """A key as bytes: ``str`` (UTF-8) or ``bytes``, at most :data:`MAX_KEY_BYTES` long."""
    return _encoded(key, bytes, what, "a str (or bytes)", MAX_KEY_BYTES, "use a shorter key")


def key_list(keys: Any, what: str = "keys") -> List[bytes]:
    """A sequence of keys as bytes; a bare string is refused (it is not a list of keys)."""
    if isinstance(keys, (str, bytes, bytearray)) or not isinstance(keys, Iterable):
        raise TypeError(f"store {what} must be a list of str keys, got "
                        f"{type(keys).__name__}: {keys!r} (write [key] for one key)")
    out = [key_bytes(k, "key") for k in keys]
    if len(out) > MAX_KEYS:
        raise ValueError(f"store {what}: {len(out)} keys in one call, over the limit of "
                         f"{MAX_KEYS}; split the call")
    return out


def value_bytes(value: Any, what: str = "value") -> bytes:
    """A value as bytes: ``str`` (UTF-8) or a bytes-like object, at most 64 MiB."""
    return _encoded(value, (bytes, bytearray, memoryview), what, "str or bytes",
                    MAX_VALUE_BYTES, "split it over several keys")


def amount_int(amount: Any) -> int:
    """``add``'s amount: an integer (``bool`` and NumPy integers included) that fits int64."""
    if isinstance(amount, float) or not hasattr(amount, "__index__"):
        raise TypeError(f"add() amount must be an int, got {type(amount).__name__}: {amount!r}")
    value = amount.__index__()
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise TypeError(f"add() amount {value} does not fit in a signed 64-bit integer")
    return value


def timeout_seconds(timeout: Any) -> float:
    """A timeout as seconds: a ``timedelta`` or a number; ``math.inf`` for "forever"."""
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout must be a datetime.timedelta (or seconds), got "
                        f"{type(timeout).__name__}: {timeout!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"timeout must not be negative, got {timeout!r}")
    return math.inf if seconds >= _FOREVER_S else seconds


def as_timedelta(seconds: float) -> timedelta:
    """Seconds back to a ``timedelta`` (``timedelta.max`` for "forever")."""
    return timedelta.max if math.isinf(seconds) else timedelta(seconds=seconds)


def show_key(key: bytes) -> str:
    """A key for messages and ``list_keys``: text, with undecodable bytes kept reversibly."""
    return key.decode("utf-8", "surrogateescape")


def counter_value(key: bytes, raw: bytes) -> int:
    """The integer ``add`` reads from a stored value (empty counts as 0)."""
    if raw == b"":
        return 0
    match = _COUNTER.match(raw)
    if match is None:
        raise ValueError(f"add({show_key(key)!r}): the stored value {raw[:40]!r} is not an "
                         "integer; add() only works on keys written by add() or set to a "
                         "decimal number")
    value = int(match.group(1))
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"add({show_key(key)!r}): the stored value {raw[:40]!r} does not fit "
                         "in a signed 64-bit integer")
    return value


def wrap_int64(value: int) -> int:
    """Two's-complement wrap-around, as the 64-bit counters of torch's stores do."""
    return (value - _INT64_MIN) % (2 ** 64) + _INT64_MIN


# ---------------------------------------------------------------------------- the table
class _Table:
    """The key-value data and the meaning of each mutating operation (no locking, no waiting:
    the store that owns the table provides both)."""

    def __init__(self) -> None:
        self.data: Dict[bytes, bytes] = {}

    def set(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def add(self, key: bytes, amount: int) -> int:
        old = self.data.get(key)
        total = amount if old is None else wrap_int64(counter_value(key, old) + amount)
        self.data[key] = str(total).encode()
        return total

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        """Set ``desired`` where the key holds ``expected`` (or is missing and ``expected`` is
        empty); return the value now stored, or ``expected`` where a missing key stays missing
        (torch's answer)."""
        old = self.data.get(key)
        if old is None:
            if expected == b"":
                self.data[key] = desired
                return desired
            return expected
        if old == expected:
            self.data[key] = desired
            return desired
        return old

    def append(self, key: bytes, value: bytes) -> None:
        old = self.data.get(key, b"")
        if len(old) + len(value) > MAX_VALUE_BYTES:
            raise ValueError(f"append({show_key(key)[:80]!r}): the value would grow to "
                             f"{len(old) + len(value)} bytes, over the limit of "
                             f"{MAX_VALUE_BYTES} bytes; split it over several keys")
        self.data[key] = old + value

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None

    def missing(self, keys: Sequence[bytes]) -> List[bytes]:
        return [k for k in keys if k not in self.data]


def timeout_message(store: str, op: str, keys: Sequence[bytes], seconds: float,
                    where: str = "") -> str:
    """The text of a store timeout: what, which keys, how long, and what to do."""
    shown = ", ".join(repr(show_key(k)) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
    return (f"{store}.{op} timed out after {seconds:g} s waiting for key(s) {shown}{where}; "
            "make sure another process sets them, or give a longer timeout (the store's "
            "timeout= or set_timeout())")


# ---------------------------------------------------------------------------- Store
class Store:
    """A key-value store shared by processes: the base of torch's store classes.

    Subclasses implement the underscored primitives on ``bytes`` keys and values; the public
    methods check and convert arguments first (``str`` or ``bytes`` keys and values, values
    come back as ``bytes``), so bad arguments raise ``TypeError``/``ValueError`` before any
    traffic. A subclass may instead override the public methods directly, as in torch.

    Example:
        >>> store = HashStore()
        >>> store.set("epoch", "3")
        >>> store.get("epoch")
        b'3'
    """

    def __init__(self, timeout: Any = DEFAULT_TIMEOUT) -> None:
        self._timeout_s = timeout_seconds(timeout)

    # ---------------------------------------------------------------- timeout
    @property
    def timeout(self) -> timedelta:
        """The default timeout of ``get``, ``wait``, ``multi_get`` and ``barrier``."""
        return as_timedelta(self._timeout_s)

    def set_timeout(self, timeout: Any) -> None:
        """Set the default timeout of the waiting methods.

        Args:
            timeout: a ``timedelta`` (or seconds); ``timedelta(0)`` checks once without
                waiting, ``timedelta.max`` waits forever.

        Raises:
            TypeError / ValueError: ``timeout`` is not a duration, or is negative.

        Example:
            >>> store = HashStore()
            >>> store.set_timeout(timedelta(seconds=10))
        """
        self._timeout_s = timeout_seconds(timeout)

    def _wait_seconds(self, timeout: Any) -> float:
        return self._timeout_s if timeout is None else timeout_seconds(timeout)

    # ---------------------------------------------------------------- public API
    def set(self, key: Key, value: Value) -> None:
        """Store ``value`` under ``key``, replacing what was there.

        Args:
            key: ``str`` (or ``bytes``), at most 64 KiB.
            value: ``str`` (stored as UTF-8) or bytes, at most 64 MiB.

        Raises:
            TypeError / ValueError: a key or value of the wrong type or size.

        Example:
            >>> store = HashStore()
            >>> store.set("first_key", "first_value")
        """
        self._set(key_bytes(key), value_bytes(value))

    def get(self, key: Key) -> bytes:
        """Return the value of ``key``, waiting up to the store's timeout for it to be set.

        Args:
            key: the key to read.

        Returns:
            The value, as ``bytes``.

        Raises:
            StoreTimeoutError: the key was not set within the timeout.

        Example:
            >>> store = HashStore()
            >>> store.set("k", "v")
            >>> store.get("k")
            b'v'
        """
        return self._multi_get([key_bytes(key)], self._wait_seconds(None), "get")[0]

    def add(self, key: Key, amount: int) -> int:
        """Add ``amount`` to the counter at ``key`` (created at 0) and return the new value.

        The value is stored as its decimal text (``get`` returns ``b"7"``), atomically for all
        users of the store; counters wrap around as signed 64-bit integers.

        Args:
            key: the counter's key.
            amount: an integer (may be negative or 0).

        Returns:
            The counter after the addition.

        Raises:
            TypeError: ``amount`` is not an integer in int64's range.
            ValueError: the key holds a value that is not a decimal number.

        Example:
            >>> store = HashStore()
            >>> store.add("count", 1)
            1
            >>> store.add("count", 6)
            7
        """
        return self._add(key_bytes(key), amount_int(amount))

    def compare_set(self, key: Key, expected_value: Value, desired_value: Value) -> bytes:
        """Atomically set ``desired_value`` where ``key`` holds ``expected_value``.

        A missing key counts as holding ``""``: with an empty ``expected_value`` it is created.

        Args:
            key: the key.
            expected_value: the value the key must hold for the swap to happen.
            desired_value: the value to store.

        Returns:
            The value now stored (``desired_value`` when the swap happened, else the current
            value); for a missing key and a non-empty ``expected_value``, that
            ``expected_value`` (the key stays missing), as torch answers.

        Example:
            >>> store = HashStore()
            >>> store.compare_set("leader", "", "rank0")
            b'rank0'
            >>> store.compare_set("leader", "", "rank1")
            b'rank0'
        """
        return self._compare_set(key_bytes(key), value_bytes(expected_value, "expected_value"),
                                 value_bytes(desired_value, "desired_value"))

    def append(self, key: Key, value: Value) -> None:
        """Append ``value`` to the bytes at ``key`` (created where missing).

        Example:
            >>> store = HashStore()
            >>> store.append("k", "po"); store.append("k", "tato")
            >>> store.get("k")
            b'potato'
        """
        self._append(key_bytes(key), value_bytes(value))

    def multi_get(self, keys: Sequence[Key]) -> List[bytes]:
        """Return the values of ``keys`` in order, waiting up to the timeout for all of them.

        Raises:
            StoreTimeoutError: some key was not set within the timeout.

        Example:
            >>> store = HashStore()
            >>> store.multi_set(["a", "b"], ["po", "tato"])
            >>> store.multi_get(["a", "b"])
            [b'po', b'tato']
        """
        return self._multi_get(key_list(keys), self._wait_seconds(None), "multi_get")

    def multi_set(self, keys: Sequence[Key], values: Sequence[Value]) -> None:
        """Set each of ``keys`` to the value at the same position of ``values``.

        Raises:
            ValueError: ``keys`` and ``values`` differ in length.

        Example:
            >>> store = HashStore()
            >>> store.multi_set(["a", "b"], ["1", "2"])
        """
        ks = key_list(keys)
        vs = [value_bytes(v) for v in key_values(values)]
        if len(ks) != len(vs):
            raise ValueError(f"multi_set got {len(ks)} keys and {len(vs)} values; pass one "
                             "value per key")
        self._multi_set(ks, vs)

    def wait(self, keys: Sequence[Key], timeout: Optional[timedelta] = None) -> None:
        """Block until every key in ``keys`` is set.

        Args:
            keys: the keys to wait for.
            timeout: how long to wait; ``None`` uses the store's timeout.

        Raises:
            StoreTimeoutError: some key was not set in time (its ``keys`` lists them).

        Example:
            >>> store = HashStore()
            >>> store.set("ready", "1")
            >>> store.wait(["ready"], timedelta(seconds=5))
        """
        self._wait(key_list(keys), self._wait_seconds(timeout))

    def check(self, keys: Sequence[Key]) -> bool:
        """Return whether every key in ``keys`` is set (``True`` for no keys); never waits.

        Example:
            >>> store = HashStore()
            >>> store.check(["missing"])
            False
        """
        return self._check(key_list(keys))

    def delete_key(self, key: Key) -> bool:
        """Delete ``key``; return whether it existed.

        Example:
            >>> store = HashStore()
            >>> store.set("k", "v")
            >>> store.delete_key("k"), store.delete_key("k")
            (True, False)
        """
        return self._delete(key_bytes(key))

    def num_keys(self) -> int:
        """Return the number of keys, counted as torch counts them (see each store)."""
        return self._num_keys()

    def list_keys(self) -> List[str]:
        """Return the keys set by users of the store (internal keys left out)."""
        return [show_key(k) for k in self._list_keys()]

    def barrier(self, key: Key, world_size: int, timeout: Optional[timedelta] = None) -> None:
        """Block until ``world_size`` callers have entered the barrier named ``key``.

        Uses the keys ``<key>/num_members`` (a counter) and ``<key>/last_member``, as torch's
        barrier does; each name serves one barrier.

        Raises:
            StoreTimeoutError: fewer than ``world_size`` callers arrived within the timeout.

        Example:
            >>> store = HashStore()
            >>> store.barrier("start", 1)
        """
        base = key_bytes(key)
        size = amount_int(world_size)
        if size < 1:
            raise ValueError(f"barrier world_size must be at least 1, got {world_size}")
        seconds = self._wait_seconds(timeout)
        arrived = self._add(base + b"/num_members", 1)
        if arrived >= size:
            self._set(base + b"/last_member", b"1")
        self._wait([base + b"/last_member"], seconds)

    def has_extended_api(self) -> bool:
        """Return True: every store here supports ``append``/``multi_get``/``multi_set``."""
        return True

    def clone(self) -> "Store":
        """Return another handle on the same data, for use from another thread."""
        raise NotImplementedError(f"{type(self).__name__} does not implement clone()")

    def close(self) -> None:
        """Release what this handle holds (mpitensor addition; a no-op here)."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------------- primitives
    def _set(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement set()")

    def _add(self, key: bytes, amount: int) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not implement add()")

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        raise NotImplementedError(f"{type(self).__name__} does not implement compare_set()")

    def _append(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement append()")

    def _multi_get(self, keys: List[bytes], seconds: float, op: str) -> List[bytes]:
        raise NotImplementedError(f"{type(self).__name__} does not implement get()")

    def _multi_set(self, keys: List[bytes], values: List[bytes]) -> None:
        for k, v in zip(keys, values):
            self._set(k, v)

    def _get_within(self, key: bytes, seconds: float) -> bytes:
        """``get(key)``, waiting up to ``seconds`` instead of the store's timeout: one request
        to a TCPStore's master; a subclass that overrides the public methods (torch's way)
        gets a ``wait`` and then a ``get``."""
        if type(self).get is Store.get and type(self)._multi_get is not Store._multi_get:
            return self._multi_get([key], seconds, "get")[0]
        self.wait([key], as_timedelta(seconds))
        return self.get(key)

    def _wait(self, keys: List[bytes], seconds: float) -> None:
        self._multi_get(keys, seconds, "wait")

    def _check(self, keys: List[bytes]) -> bool:
        raise NotImplementedError(f"{type(self).__name__} does not implement check()")

    def _delete(self, key: bytes) -> bool:
        raise NotImplementedError(f"{type(self).__name__} does not implement delete_key()")

    def _num_keys(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not implement num_keys()")

    def _list_keys(self) -> List[bytes]:
        raise NotImplementedError(f"{type(self).__name__} does not implement list_keys()")


def key_values(values: Any) -> List[Any]:
    """``multi_set``'s values as a list; a bare string is refused like a bare key."""
    if isinstance(values, (str, bytes, bytearray)) or not isinstance(values, Iterable):
        raise TypeError(f"multi_set values must be a list, got {type(values).__name__}")
    return list(values)


# ---------------------------------------------------------------------------- HashStore
class _SharedTable:
    """A table with the condition its waiters sleep on; shared by a HashStore and its clones."""

    def __init__(self) -> None:
        self.table = _Table()
        self.changed = threading.Condition()


class HashStore(Store):
    """A store inside one process (torch's ``HashStore``): threads share it, processes do not.

    ``get``/``wait`` sleep on a condition variable that every change wakes. ``num_keys``
    counts exactly the keys set.

    Example:
        >>> store = HashStore()
        >>> store.add("n", 2)
        2
        >>> store.get("n")
        b'2'
    """

    def __init__(self) -> None:
        super().__init__()
        self._shared = _SharedTable()

    def clone(self) -> "HashStore":
        """Return another handle on the same data (and the same waiters)."""
        other = HashStore()
        other._shared = self._shared
        other._timeout_s = self._timeout_s
        return other

    def _mutate(self, fn: Any, *args: Any) -> Any:
        with self._shared.changed:
            out = fn(*args)
            self._shared.changed.notify_all()
            return out

    def _set(self, key: bytes, value: bytes) -> None:
        self._mutate(self._shared.table.set, key, value)

    def _add(self, key: bytes, amount: int) -> int:
        return self._mutate(self._shared.table.add, key, amount)

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        return self._mutate(self._shared.table.compare_set, key, expected, desired)

    def _append(self, key: bytes, value: bytes) -> None:
        self._mutate(self._shared.table.append, key, value)

    def _multi_set(self, keys: List[bytes], values: List[bytes]) -> None:
        def put() -> None:
            for k, v in zip(keys, values):
                self._shared.table.set(k, v)
        self._mutate(put)

    def _multi_get(self, keys: List[bytes], seconds: float, op: str) -> List[bytes]:
        table = self._shared.table
        start = time.monotonic()
        with self._shared.changed:
            done = self._shared.changed.wait_for(lambda: not table.missing(keys),
                                                 None if math.isinf(seconds) else seconds)
            if not done:
                missing = table.missing(keys)
                raise StoreTimeoutError(timeout_message("HashStore", op, missing, seconds),
                                        op=op, elapsed=time.monotonic() - start,
                                        keys=[show_key(k) for k in missing])
            return [table.data[k] for k in keys]

    def _check(self, keys: List[bytes]) -> bool:
        with self._shared.changed:
            return not self._shared.table.missing(keys)

    def _delete(self, key: bytes) -> bool:
        return self._mutate(self._shared.table.delete, key)

    def _num_keys(self) -> int:
        with self._shared.changed:
            return len(self._shared.table.data)

    def _list_keys(self) -> List[bytes]:
        with self._shared.changed:
            return list(self._shared.table.data)


# ---------------------------------------------------------------------------- PrefixStore
class PrefixStore(Store):
    """A view of another store that puts ``"<prefix>/"`` in front of every key (torch's).

    ``num_keys`` counts the whole underlying store, as torch's does; ``list_keys`` returns the
    keys under the prefix, without it. The timeout is the underlying store's.

    Args:
        prefix: the text put before each key (``"/"`` is added between).
        store: the store holding the data (any :class:`Store`, a PrefixStore included).

    Example:
        >>> base = HashStore()
        >>> trainer = PrefixStore("trainer", base)
        >>> trainer.set("step", "10")
        >>> base.get("trainer/step")
        b'10'
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"PrefixStore prefix must be a str, got {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore store must be a Store, got {type(store).__name__}")
        self._prefix = prefix
        self._head = key_bytes(prefix, "prefix") + b"/"
        self._store = store

    @property
    def underlying_store(self) -> Store:
        """The store this one wraps."""
        return self._store

    @property
    def _underlying_non_prefix_store(self) -> Store:
        store = self._store
        while isinstance(store, PrefixStore):
            store = store._store
        return store

    @property
    def timeout(self) -> timedelta:
        """The underlying store's timeout."""
        return self._store.timeout

    def set_timeout(self, timeout: Any) -> None:
        """Set the underlying store's timeout (see :meth:`Store.set_timeout`)."""
        self._store.set_timeout(timeout)

    def clone(self) -> "PrefixStore":
        """Return a PrefixStore with the same prefix over a clone of the underlying store."""
        return PrefixStore(self._prefix, self._store.clone())

    def has_extended_api(self) -> bool:
        """Return the underlying store's answer."""
        return self._store.has_extended_api()

    def close(self) -> None:
        """Leave the underlying store open: it may have other users."""

    def _wait_seconds(self, timeout: Any) -> float:
        return timeout_seconds(self._store.timeout if timeout is None else timeout)

    # The underlying store is driven through its public methods, so any Store subclass
    # (one written in Python against torch's API included) can sit underneath.
    def _set(self, key: bytes, value: bytes) -> None:
        self._store.set(self._head + key, value)

    def _add(self, key: bytes, amount: int) -> int:
        return self._store.add(self._head + key, amount)

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        return self._store.compare_set(self._head + key, expected, desired)

    def _append(self, key: bytes, value: bytes) -> None:
        self._store.append(self._head + key, value)

    def _multi_get(self, keys: List[bytes], seconds: float, op: str) -> List[bytes]:
        full = [self._head + k for k in keys]
        try:
            if op == "get":
                return [self._store.get(full[0])]
            if op == "wait":
                self._store.wait(full, as_timedelta(seconds))
                return []
            return self._store.multi_get(full)
        except StoreTimeoutError as exc:
            self._own_keys(exc)
            raise

    def _get_within(self, key: bytes, seconds: float) -> bytes:
        try:
            return self._store._get_within(self._head + key, seconds)
        except StoreTimeoutError as exc:
            self._own_keys(exc)
            raise

    def _own_keys(self, exc: StoreTimeoutError) -> None:
        """The message names the full keys; ``exc.keys`` gives them as this store's user
        wrote them."""
        head = show_key(self._head)
        exc.keys = [k[len(head):] if k.startswith(head) else k for k in exc.keys]

    def _wait(self, keys: List[bytes], seconds: float) -> None:
        self._multi_get(keys, seconds, "wait")

    def _multi_set(self, keys: List[bytes], values: List[bytes]) -> None:
        self._store.multi_set([self._head + k for k in keys], values)

    def _check(self, keys: List[bytes]) -> bool:
        return self._store.check([self._head + k for k in keys])

    def _delete(self, key: bytes) -> bool:
        return self._store.delete_key(self._head + key)

    def _num_keys(self) -> int:
        return self._store.num_keys()

    def _list_keys(self) -> List[bytes]:
        n = len(self._head)
        return [raw[n:] for raw in (key_bytes(k) for k in self._store.list_keys())
                if raw.startswith(self._head)]


def base_and_head(store: Store) -> Tuple[Store, bytes]:
    """The store under ``store``'s PrefixStores (itself where it is none), and what they put
    before a key there: ``PrefixStore("a", PrefixStore("b", s))`` is ``(s, b"b/a/")``."""
    head = b""
    while isinstance(store, PrefixStore):
        head = store._head + head
        store = store._store
    return store, head
