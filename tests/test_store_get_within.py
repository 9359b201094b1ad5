"""``Store._get_within``: a get that waits for its key up to a given time, in one request.

The rendezvous waits for each key this way (``launch/rendezvous.py``: ``_wait``): one request
to a TCPStore's master however long the wait, where a wait and then a get were two. It must
wait for the time given, not the store's own timeout; raise ``StoreTimeoutError`` naming the
key as the caller wrote it (a PrefixStore's prefix left out); and, on a store written
torch's way (public methods overridden), still work, by a wait and a get.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Iterator, List

import pytest

import mpitensor.distributed as dist
from mpitensor.distributed._store import wire

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["tcp", "file", "hash", "prefix"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dist.Store]:
    kind = request.param
    if kind == "tcp":
        s: dist.Store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
    elif kind == "file":
        s = dist.FileStore(str(tmp_path / "filestore"), 1)
    elif kind == "hash":
        s = dist.HashStore()
    else:
        s = dist.PrefixStore("pre", dist.TCPStore("127.0.0.1", 0, 1, True,
                                                  timedelta(seconds=10)))
    try:
        yield s
    finally:
        s.close()
        if isinstance(s, dist.PrefixStore):
            s.underlying_store.close()


def test_waits_for_the_time_given_not_the_stores_timeout(store: dist.Store) -> None:
    other = store.clone()  # (one handle per thread: a TCPStore's is one connection)
    store.set_timeout(timedelta(seconds=0.05))  # far shorter than the wait below
    timer = threading.Timer(0.3, other.set, args=("late", "v"))
    timer.start()
    try:
        assert store._get_within(b"late", 20.0) == b"v"
    finally:
        timer.join(10)
        other.close()
        if isinstance(other, dist.PrefixStore):
            other.underlying_store.close()


def test_a_key_never_set_times_out_naming_it(store: dist.Store) -> None:
    with pytest.raises(dist.StoreTimeoutError) as info:
        store._get_within(b"never", 0.2)
    assert info.value.keys == ["never"]


class _Counting(dist.TCPStore):
    """A TCPStore client that notes the opcode of each request it sends."""

    ops: List[int]

    def _request(self, op, fields, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.ops.append(op)
        return super()._request(op, fields, *args, **kwargs)


def test_one_request_to_a_tcp_master_through_a_prefix() -> None:
    master = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
    client = _Counting("127.0.0.1", master.port, None, False, timedelta(seconds=10))
    client.ops = []
    timer = threading.Timer(0.2, master.set, args=("mpitensor/init/mode", "pmi"))
    try:
        s = dist.PrefixStore("mpitensor/init", client)
        timer.start()
        assert s._get_within(b"mode", 20.0) == b"pmi"
        assert client.ops == [wire.GET]
    finally:
        timer.join(10)  # (its set's reply may come after the get's)
        client.close()
        master.close()


class _TorchStyle(dist.Store):
    """A store written against torch's API: public methods only, over a HashStore."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = dist.HashStore()
        self.calls: List[str] = []

    def set(self, key, value) -> None:  # type: ignore[no-untyped-def, override]
        self.inner.set(key, value)

    def get(self, key):  # type: ignore[no-untyped-def, override]
        self.calls.append("get")
        return self.inner.get(key)

    def wait(self, keys, timeout=None) -> None:  # type: ignore[no-untyped-def, override]
        self.calls.append(f"wait {timeout.total_seconds():g}")
        self.inner.wait(keys, timeout)


def test_a_store_written_torchs_way_waits_then_gets() -> None:
    base = _TorchStyle()
    s = dist.PrefixStore("p", base)
    base.set("p/k", "v")
    assert s._get_within(b"k", 7.0) == b"v"
    assert base.calls == ["wait 7", "get"]
    with pytest.raises(dist.StoreTimeoutError) as info:
        s._get_within(b"missing", 0.1)
    assert info.value.keys == ["missing"]
