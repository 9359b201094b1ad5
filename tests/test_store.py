"""Key-value stores (``TCPStore``, ``FileStore``, ``HashStore``, ``PrefixStore``).

Three parts: the behaviour of every method on every store; parity with torch's stores (the
same calls on both, results and exception types compared; skipped without torch); and the
faults a TCP server meets (hundreds of clients, races, garbage, oversized frames, a master
that dies, a port in use, nobody listening). Every server, socket, thread and process made
here is closed or joined by the test that made it, with a timeout on each wait.
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import mpitensor.distributed as dist
from mpitensor.distributed._store import wire
from mpitensor.errors import DistributedTimeoutError

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["tcp", "file", "hash", "prefix"]
T = timedelta


def _seconds(s: float) -> timedelta:
    return timedelta(seconds=s)


@contextlib.contextmanager
def _make(kind: str, tmp_path: Path) -> Iterator[dist.Store]:
    """One of our stores, closed afterwards."""
    if kind == "tcp":
        store: dist.Store = dist.TCPStore("127.0.0.1", 0, 1, True, _seconds(10))
    elif kind == "file":
        store = dist.FileStore(str(tmp_path / "filestore"), 1)
    elif kind == "hash":
        store = dist.HashStore()
    else:
        store = dist.PrefixStore("pre", dist.HashStore())
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dist.Store]:
    with _make(request.param, tmp_path) as s:
        yield s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("TCPStore-server")]


@pytest.fixture
def master() -> Iterator[dist.TCPStore]:
    m = dist.TCPStore("127.0.0.1", 0, None, True, _seconds(20))
    try:
        yield m
    finally:
        m.close()


def _open_fds() -> int:
    """Descriptors open in this process, less the ones the session's segment watch
    (tests/launch.py) keeps opening from its own thread: /proc, its files, and /dev/shm (in a
    full run it scans so often that one of them is nearly always open)."""
    if not os.path.isdir("/proc/self/fd"):
        return 0
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while we looked: not left open
            continue
        if target not in ("/proc", "/dev/shm") and not target.startswith(("/proc/",
                                                                          "/dev/shm/")):
            count += 1
    return count


@pytest.fixture(autouse=True)
def _no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test leaves no server thread and no open descriptor behind (torch's TCPStore
    keeps descriptors of its own after its objects are gone: not counted in parity tests)."""
    before = _open_fds()
    yield
    limit = math.inf if "parity" in request.node.name else before
    gc.collect()
    end = time.monotonic() + 5
    while (_server_threads() or _open_fds() > limit) and time.monotonic() < end:
        time.sleep(0.05)  # a finalizer or a thread on its way out
        gc.collect()
    assert _server_threads() == []
    assert _open_fds() <= limit, "file descriptors left open"


def _join_all(threads: List[threading.Thread], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads still running"


# ============================================================================ behaviour
def test_set_get_str_and_bytes(store: dist.Store) -> None:
    store.set("a", "x")
    store.set("b", b"\x00\xff")
    store.set("u", "é")
    store.set(b"raw", bytearray(b"ba"))
    assert store.get("a") == b"x"
    assert store.get("b") == b"\x00\xff"
    assert store.get("u") == "é".encode()
    assert store.get("raw") == b"ba"
    store.set("a", "y")
    assert store.get("a") == b"y"
    store.set("", "empty key")
    assert store.get("") == b"empty key"


def test_add_is_a_decimal_counter(store: dist.Store) -> None:
    assert store.add("c", 5) == 5
    assert store.add("c", -7) == -2
    assert store.add("c", 0) == -2
    assert store.get("c") == b"-2"
    store.set("n", " 12abc")  # read as C's strtoll would: the leading number
    assert store.add("n", 1) == 13
    assert store.get("n") == b"13"
    store.set("e", "")
    assert store.add("e", 4) == 4
    store.set("text", "abc")
    with pytest.raises(ValueError, match="not an integer"):
        store.add("text", 1)
    assert store.get("text") == b"abc"
    assert store.add("big", 2 ** 62) == 2 ** 62
    assert store.add("big", 2 ** 62) == -(2 ** 63)  # wraps like an int64, as torch's
    with pytest.raises(TypeError):
        store.add("c", 1.5)
    with pytest.raises(TypeError):
        store.add("c", 2 ** 63)


def test_compare_set_cases(store: dist.Store) -> None:
    assert store.compare_set("m1", "", "v") == b"v"  # missing + "" : created
    assert store.get("m1") == b"v"
    assert store.compare_set("m2", "q", "v") == b"q"  # missing + other: stays missing
    assert not store.check(["m2"])
    store.set("a", "x")
    assert store.compare_set("a", "x", "y") == b"y"  # match: swapped
    assert store.compare_set("a", "x", "z") == b"y"  # mismatch: current value
    assert store.compare_set("a", "", "z") == b"y"  # present + "": no swap
    assert store.get("a") == b"y"
    store.set("e", "")
    assert store.compare_set("e", "", "w") == b"w"
    assert store.compare_set("a", b"y", b"\xff") == b"\xff"


def test_append_multi_get_multi_set(store: dist.Store) -> None:
    store.append("ap", "po")
    store.append("ap", b"tato")
    assert store.get("ap") == b"potato"
    store.multi_set(["k1", "k2"], ["v1", b"v2"])
    assert store.multi_get(["k1", "k2"]) == [b"v1", b"v2"]
    assert store.multi_get([]) == []
    with pytest.raises(ValueError, match="2 keys and 1 values"):
        store.multi_set(["k1", "k2"], ["v1"])


def test_check_delete_num_keys_list_keys(store: dist.Store) -> None:
    base = store.num_keys()
    expected_base = {"TCPStore": 1, "FileStore": 1}.get(type(store).__name__, 0)
    assert base == expected_base  # torch counts one internal key in TCPStore and FileStore
    store.set("a", "1")
    store.add("b", 1)
    assert store.check(["a", "b"]) and store.check([])
    assert not store.check(["a", "zz"])
    assert store.num_keys() == base + 2
    assert sorted(store.list_keys()) == ["a", "b"]
    assert store.delete_key("a") is True
    assert not store.check(["a"])
    # torch's FileStore answers True for a key that is not there; the others False
    assert store.delete_key("a") is isinstance(store, dist.FileStore)
    assert store.num_keys() == base + 1


def test_timeout_property_and_set_timeout(store: dist.Store) -> None:
    assert store.timeout == (_seconds(10) if isinstance(store, dist.TCPStore) else _seconds(300))
    store.set_timeout(_seconds(0.5))
    assert store.timeout == _seconds(0.5)
    store.set_timeout(2)  # plain seconds are accepted too
    assert store.timeout == _seconds(2)
    store.set_timeout(timedelta.max)
    assert store.timeout == timedelta.max
    with pytest.raises(ValueError):
        store.set_timeout(_seconds(-1))
    with pytest.raises(TypeError):
        store.set_timeout("5")


@pytest.mark.parametrize("how", ["get", "wait", "wait_arg", "multi_get"])
def test_timeout_raises_within_timeout(store: dist.Store, how: str) -> None:
    store.set("present", "1")
    store.set_timeout(_seconds(0.3 if how != "wait_arg" else 100))
    calls: Dict[str, Callable[[], Any]] = {
        "get": lambda: store.get("missing"),
        "wait": lambda: store.wait(["present", "missing"]),
        "wait_arg": lambda: store.wait(["present", "missing"], _seconds(0.3)),
        "multi_get": lambda: store.multi_get(["present", "missing"]),
    }
    start = time.monotonic()
    with pytest.raises(dist.StoreTimeoutError) as info:
        calls[how]()
    took = time.monotonic() - start
    assert 0.29 <= took < 1.5, took
    err = info.value
    assert isinstance(err, dist.DistStoreError) and isinstance(err, DistributedTimeoutError)
    assert isinstance(err, TimeoutError) and isinstance(err, RuntimeError)
    assert err.keys == ["missing"] and "missing'" in str(err)
    store.set_timeout(_seconds(0))  # zero: look once, do not wait
    start = time.monotonic()
    with pytest.raises(dist.StoreTimeoutError):
        store.get("missing")
    assert time.monotonic() - start < 0.5
    assert store.get("present") == b"1"  # still usable after timeouts


def test_waiters_are_woken_by_writes(store: dist.Store) -> None:
    store.set_timeout(_seconds(20))
    other = store.clone()
    results: Dict[str, Any] = {}

    def waiter(name: str, fn: Callable[[], Any]) -> None:
        t0 = time.monotonic()
        try:
            results[name] = (fn(), time.monotonic() - t0)
        except Exception as exc:  # pragma: no cover - reported below
            results[name] = (exc, 0.0)

    w_other = other.clone() if not isinstance(store, dist.HashStore) else other
    threads = [threading.Thread(target=waiter, args=("get", lambda: other.get("k"))),
               threading.Thread(target=waiter, args=("wait", lambda: w_other.wait(["k", "n"])))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    store.set("k", "v")
    time.sleep(0.1)
    store.add("n", 3)
    _join_all(threads, 20)
    assert results["get"][0] == b"v" and 0.2 < results["get"][1] < 5
    assert results["wait"][0] is None and results["wait"][1] < 5
    for s in {id(other): other, id(w_other): w_other}.values():
        s.close()


def test_barrier(store: dist.Store) -> None:
    store.set_timeout(_seconds(20))
    handles = [store.clone() for _ in range(3)]
    errors: List[BaseException] = []

    def enter(s: dist.Store) -> None:
        try:
            s.barrier("start", 3)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=enter, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    _join_all(threads, 20)
    assert not errors
    assert sorted(store.list_keys()) == ["start/last_member", "start/num_members"]
    assert store.get("start/num_members") == b"3"
    with pytest.raises(dist.StoreTimeoutError):
        store.barrier("lonely", 2, _seconds(0.2))
    for h in handles:
        h.close()


def test_clone_shares_data(store: dist.Store) -> None:
    other = store.clone()
    other.set("from_clone", "1")
    assert store.get("from_clone") == b"1"
    assert type(other) is type(store)
    other.close()


def test_bad_arguments_fail_before_any_traffic(store: dist.Store) -> None:
    with pytest.raises(TypeError):
        store.set("k", 5)
    with pytest.raises(TypeError):
        store.set(None, "v")
    with pytest.raises(TypeError, match="list"):
        store.check("abc")  # a bare string is not a list of keys
    with pytest.raises(TypeError, match="list"):
        store.wait("abc")
    with pytest.raises(ValueError, match="65536"):
        store.set("k" * (64 * 1024 + 1), "v")
    with pytest.raises(ValueError, match="limit"):
        store.set("k", b"\0" * (64 * 1024 * 1024 + 1))
    with pytest.raises(ValueError):
        store.barrier("b", 0)
    assert store.check(["k"]) is False


def test_prefix_store_maps_keys() -> None:
    base = dist.HashStore()
    p = dist.PrefixStore("pre", base)
    p.set("a", "1")
    p.add("c", 2)
    p.multi_set(["m"], ["x"])
    assert sorted(base.list_keys()) == ["pre/a", "pre/c", "pre/m"]
    assert sorted(p.list_keys()) == ["a", "c", "m"]
    assert p.num_keys() == 3  # the whole underlying store, as torch counts
    nested = dist.PrefixStore("p2", p)
    nested.set("x", "y")
    assert base.get("pre/p2/x") == b"y"
    assert nested.underlying_store is p and nested._underlying_non_prefix_store is base
    base.set_timeout(_seconds(1))
    assert p.timeout == _seconds(1)
    p.set_timeout(_seconds(0.2))
    assert base.timeout == _seconds(0.2)
    with pytest.raises(dist.StoreTimeoutError):
        nested.get("nope")
    with pytest.raises(TypeError):
        dist.PrefixStore("p", object())  # type: ignore[arg-type]


def test_prefix_store_over_tcp(master: dist.TCPStore) -> None:
    p = dist.PrefixStore("job", master)
    p.set("a", "1")
    assert master.get("job/a") == b"1"
    assert p.compare_set("a", "1", "2") == b"2"
    assert p.list_keys() == ["a"]
    assert p.num_keys() == master.num_keys() == 1


def test_hash_store_is_shared_by_threads_only() -> None:
    h = dist.HashStore()
    assert h.num_keys() == 0 and h.has_extended_api()
    c = h.clone()
    c.set("x", "1")
    assert h.get("x") == b"1"
    assert dist.HashStore().check(["x"]) is False


def test_exports() -> None:
    for name in ("Store", "TCPStore", "FileStore", "HashStore", "PrefixStore", "DistError",
                 "DistStoreError", "DistNetworkError", "StoreTimeoutError"):
        assert name in dist.__all__ and hasattr(dist, name)
    for cls in (dist.TCPStore, dist.FileStore, dist.HashStore, dist.PrefixStore):
        assert issubclass(cls, dist.Store)
    assert issubclass(dist.DistNetworkError, dist.DistError)
    assert issubclass(dist.DistStoreError, dist.MpiTensorError)


# ============================================================================ races
@pytest.mark.parametrize("kind", ["tcp", "file", "hash"])
def test_compare_set_race_has_one_winner(kind: str, tmp_path: Path) -> None:
    n = 16
    with _make(kind, tmp_path) as store:
        handles = [store.clone() for _ in range(n)]
        start = threading.Barrier(n)
        got: List[Any] = [None] * n

        def race(i: int) -> None:
            start.wait(10)
            got[i] = handles[i].compare_set("leader", "", f"rank{i}")

        threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        _join_all(threads, 30)
        winner = store.get("leader")
        assert all(g == winner for g in got), got
        assert sum(g == f"rank{i}".encode() for i, g in enumerate(got)) == 1
        for h in handles:
            h.close()


def test_tcp_200_clients_add_concurrently(master: dist.TCPStore) -> None:
    n_clients, per_client = 200, 5
    clients = [dist.TCPStore("127.0.0.1", master.port, None, False, _seconds(30))
               for _ in range(n_clients)]
    try:
        assert len(_server_threads()) == 1  # one thread serves all 200 connections
        start = threading.Barrier(n_clients)
        seen: List[List[int]] = [[] for _ in range(n_clients)]

        def work(i: int) -> None:
            start.wait(30)
            for _ in range(per_client):
                seen[i].append(clients[i].add("counter", 1))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n_clients)]
        for t in threads:
            t.start()
        _join_all(threads, 60)
        total = n_clients * per_client
        assert master.get("counter") == str(total).encode()
        # every add saw a distinct intermediate value: the increments never interleaved
        assert sorted(v for s in seen for v in s) == list(range(1, total + 1))
    finally:
        for c in clients:
            c.close()


def _file_worker(path: str, rank: int, n_adds: int, out: Any) -> None:
    store = dist.FileStore(path, -1)
    store.set_timeout(_seconds(30))
    store.wait(["go"])
    values = [store.add("count", 1) for _ in range(n_adds)]
    leader = store.compare_set("leader", "", f"rank{rank}")
    store.append("log", f"{rank},")
    out.put((rank, values, leader))
    store.close()


def test_filestore_processes_add_safely(tmp_path: Path) -> None:
    path = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    out = ctx.Queue()
    n_procs, n_adds = 8, 25
    store = dist.FileStore(path, -1)
    procs = [ctx.Process(target=_file_worker, args=(path, r, n_adds, out))
             for r in range(n_procs)]
    try:
        for p in procs:
            p.start()
        store.set("go", "1")
        results = [out.get(timeout=60) for _ in range(n_procs)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():  # pragma: no cover - only on failure
                p.kill()
                p.join(5)
    assert all(p.exitcode == 0 for p in procs)
    total = n_procs * n_adds
    assert store.get("count") == str(total).encode()
    assert sorted(v for _, vals, _ in results for v in vals) == list(range(1, total + 1))
    leaders = {leader for _, _, leader in results}
    assert leaders == {store.get("leader")}
    assert sorted(store.get("log").decode().strip(",").split(",")) == sorted(
        str(r) for r in range(n_procs))
    store.close()


# ============================================================================ FileStore
def test_filestore_removes_file_after_world_size_users(tmp_path: Path) -> None:
    path = tmp_path / "fs2"
    a = dist.FileStore(str(path), 2)
    b = dist.FileStore(str(path), 2)
    a.set("k", "v")
    assert b.get("k") == b"v" and a.path == str(path)
    a.close()
    a.close()  # idempotent: still one user left
    assert path.exists()
    del b
    gc.collect()  # the last user's finalizer removes the file, as torch's FileStore does
    assert not path.exists()
    kept = tmp_path / "kept"
    c = dist.FileStore(str(kept))  # world_size -1: the file stays, with its keys
    c.set("a", "b")
    c.close()
    assert kept.exists()
    d = dist.FileStore(str(kept))
    assert d.get("a") == b"b" and d.num_keys() == 2
    d.close()


def test_filestore_survives_a_writer_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "torn"
    s = dist.FileStore(str(path))
    s.set("a", "1")
    with open(path, "ab") as f:  # a record whose writer died halfway
        f.write(struct.pack("<BIQ", ord("S"), 3, 100) + b"key" + b"partial")
    other = dist.FileStore(str(path))
    assert other.get("a") == b"1" and not other.check(["key"])
    other.set("b", "2")
    assert s.get("b") == b"2" and s.num_keys() == 3
    s.close()
    other.close()


def test_filestore_refuses_other_files_and_missing_dirs(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"\x09\x00\x00\x00refcount/")
    with pytest.raises(dist.DistStoreError, match="not an mpitensor FileStore"):
        dist.FileStore(str(foreign))
    with pytest.raises(dist.DistStoreError, match="directory"):
        dist.FileStore(str(tmp_path / "no" / "such" / "dir"))
    assert dist.FileStore(str(tmp_path / "fresh")).has_extended_api() is False


# ============================================================================ TCP faults
def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert s.recv(len(wire.MAGIC), socket.MSG_WAITALL) == wire.MAGIC
    return s


def _read_reply(sock: socket.socket) -> Tuple[int, List[bytes]]:
    head = sock.recv(4, socket.MSG_WAITALL)
    n = struct.unpack("<I", head)[0]
    return wire.decode(memoryview(sock.recv(n, socket.MSG_WAITALL)))


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_tcp_garbage_and_broken_clients_leave_others_alone(master: dist.TCPStore) -> None:
    port = master.port
    good = dist.TCPStore("127.0.0.1", port, None, False, _seconds(5))
    waiting = dist.TCPStore("127.0.0.1", port, None, False, _seconds(20))
    result: Dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.setdefault("v", waiting.get("later")))
    t.start()
    with _raw(port) as s:  # not our protocol at all
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        status, fields = _read_reply(s)
        assert status == wire.REJECTED and b"not an mpitensor" in fields[0]
        assert _closed_by_peer(s)
    with _raw(port) as s:  # our greeting, then an unknown opcode
        s.sendall(wire.MAGIC + wire.encode(200, [b"x"]))
        status, fields = _read_reply(s)
        assert status == wire.REJECTED and b"unknown opcode" in fields[0]
        assert _closed_by_peer(s)
    with _raw(port) as s:  # a SET with a missing field
        s.sendall(wire.MAGIC + wire.encode(wire.SET, [b"k"]))
        assert _read_reply(s)[0] == wire.REJECTED
    with _raw(port) as s:  # fields that overrun their frame
        s.sendall(wire.MAGIC + struct.pack("<IBII", 9, wire.SET, 1, 1000))
        assert _read_reply(s)[0] == wire.REJECTED
    with _raw(port) as s:  # gone in the middle of a request
        s.sendall(wire.MAGIC + wire.encode(wire.SET, [b"k", b"v" * 100])[:30])
    with _raw(port) as s:  # gone while its get was parked
        s.sendall(wire.MAGIC + wire.encode(wire.GET, [wire.i64(-1), b"later"]))
    good.set("later", "now")
    _join_all([t], 10)
    assert result["v"] == b"now"
    assert good.add("alive", 1) == 1 and master.get("alive") == b"1"
    assert not master.check(["k"])
    assert len(_server_threads()) == 1
    good.close()
    waiting.close()


def test_tcp_oversized_requests_are_rejected(master: dist.TCPStore) -> None:
    with _raw(master.port) as s:  # a frame larger than any request may be
        s.sendall(wire.MAGIC + struct.pack("<I", wire.MAX_FRAME + 1))
        status, fields = _read_reply(s)
        assert status == wire.REJECTED and b"exceeds the limit" in fields[0]
        assert _closed_by_peer(s)
    with _raw(master.port) as s:  # a frame within bounds, with a key beyond them
        s.sendall(wire.MAGIC + wire.encode(wire.SET, [b"k" * (64 * 1024 + 1), b"v"]))
        status, fields = _read_reply(s)
        assert status == wire.REJECTED and b"key of 65537 bytes" in fields[0]
    # our client refuses them before sending; the connection stays usable
    with pytest.raises(ValueError):
        master.set("k", b"\0" * (64 * 1024 * 1024 + 1))
    with pytest.raises(ValueError, match="split"):
        master.multi_set(["a", "b"], [b"\0" * (40 << 20), b"\0" * (40 << 20)])
    master.set("ok", "1")
    assert master.get("ok") == b"1"


def test_tcp_large_value_round_trip(master: dist.TCPStore) -> None:
    blob = os.urandom(8 << 20)
    client = dist.TCPStore("127.0.0.1", master.port, None, False, _seconds(10))
    client.set("blob", blob)
    assert master.get("blob") == blob
    client.close()


def test_tcp_unreachable_master_names_host_and_port() -> None:
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(dist.DistNetworkError, match=f"127.0.0.1:{port}") as info:
        dist.TCPStore("127.0.0.1", port, None, False, _seconds(0.5))
    assert 0.45 < time.monotonic() - start < 3.0
    assert "within 0.5 s" in str(info.value)


def test_tcp_port_in_use_names_the_port() -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(dist.DistNetworkError, match=f"port {port}.*already in use"):
            dist.TCPStore("127.0.0.1", port, None, True, _seconds(5))
        assert time.monotonic() - start < 1.0
    assert len(_server_threads()) == 0


def _client_before_master(port: int, got: Dict[str, Any]) -> threading.Thread:
    """A client thread started 0.3 s before its master, waiting for key "hello" (into
    ``got["v"]``)."""
    def client() -> None:
        c = dist.TCPStore("127.0.0.1", port, None, False, _seconds(10))
        got["v"] = c.get("hello")
        c.close()

    t = threading.Thread(target=client)
    t.start()
    time.sleep(0.3)
    return t


def test_tcp_client_may_start_before_master() -> None:
    port = _free_port()
    got: Dict[str, Any] = {}
    t = _client_before_master(port, got)
    m = dist.TCPStore("127.0.0.1", port, None, True, _seconds(10))
    m.set("hello", "world")
    _join_all([t], 15)
    m.close()
    assert got["v"] == b"world"


def test_tcp_client_connected_to_itself_lets_the_master_have_its_port(monkeypatch) -> None:
    """A client started before its master may be given, by the kernel, the master's port as
    its own for its connect (TCP's simultaneous open: a socket connected to itself), which
    would hold the port the master is about to listen on. The client lets it go and tries
    again; the master, started after, gets its port, and the client its value."""
    from mpitensor.distributed._store import tcp

    port = _free_port()
    real = socket.create_connection
    tricks: List[socket.socket] = []

    def connect(address: Any, timeout: Any = None, *args: Any) -> socket.socket:
        if tricks or address[1] != port:
            return real(address, timeout, *args)
        sock = socket.socket()  # what the kernel may hand out: the destination port itself
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.connect(("127.0.0.1", port))
        tricks.append(sock)
        return sock

    monkeypatch.setattr(tcp.socket, "create_connection", connect)
    got: Dict[str, Any] = {}
    t = _client_before_master(port, got)
    assert tricks and tricks[0].fileno() == -1  # connected to itself, then closed
    start = time.monotonic()
    m = dist.TCPStore("127.0.0.1", port, None, True, _seconds(10))
    m.set("hello", "world")
    _join_all([t], 15)
    m.close()
    assert got["v"] == b"world"
    assert time.monotonic() - start < 5


def test_tcp_wait_for_workers() -> None:
    port = _free_port()
    made: List[dist.TCPStore] = []

    def worker() -> None:
        time.sleep(0.2)
        made.append(dist.TCPStore("127.0.0.1", port, 3, False, _seconds(10)))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    m = dist.TCPStore("127.0.0.1", port, 3, True, _seconds(10))  # returns once 3 joined
    _join_all(threads, 15)
    assert m.num_keys() == 1 and m.list_keys() == []
    for s in made + [m]:
        s.close()
    start = time.monotonic()
    with pytest.raises(dist.StoreTimeoutError, match="only 1 of world_size=2"):
        dist.TCPStore("127.0.0.1", 0, 2, True, _seconds(0.3))
    assert time.monotonic() - start < 2.0
    assert len(_server_threads()) == 0  # the failed master stopped its server
    lone = dist.TCPStore("127.0.0.1", 0, 2, True, _seconds(0.3), wait_for_workers=False)
    assert lone.num_keys() == 0
    lone.close()
    with pytest.raises(ValueError, match="world_size cannot be 0"):
        dist.TCPStore("127.0.0.1", 0, 0, True)
    with pytest.raises(ValueError, match="port"):
        dist.TCPStore("127.0.0.1", 0, None, False)


_MASTER_SCRIPT = """
import sys, time
from datetime import timedelta
from mpitensor.distributed import TCPStore
m = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60))
print(m.port, flush=True)
time.sleep(120)
"""


def test_tcp_master_killed_mid_get_raises_quickly() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _MASTER_SCRIPT], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        port = int(proc.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, None, False, _seconds(60))
        client.set("k", "v")
        killer = threading.Timer(0.5, proc.kill)
        killer.start()
        start = time.monotonic()
        with pytest.raises(dist.DistNetworkError, match=f"127.0.0.1:{port}.*exited or crashed"):
            client.get("never")
        assert time.monotonic() - start < 5.0
        killer.join(5)
        with pytest.raises(dist.DistNetworkError, match=f"127.0.0.1:{port}"):
            client.set("k", "v2")  # one reconnect attempt, refused at once
        client.close()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


def test_tcp_waiting_uses_no_cpu(master: dist.TCPStore) -> None:
    client = dist.TCPStore("127.0.0.1", master.port, None, False, _seconds(1))
    cpu = time.process_time()
    with pytest.raises(dist.StoreTimeoutError):
        client.get("never")
    assert time.process_time() - cpu < 0.2  # parked, not polling (server thread included)
    client.close()


def test_tcp_close_and_collection_stop_the_server() -> None:
    m = dist.TCPStore("127.0.0.1", 0, None, True, _seconds(5))
    port = m.port
    client = dist.TCPStore("127.0.0.1", port, None, False, _seconds(5))
    assert len(_server_threads()) == 1
    m.close()
    assert len(_server_threads()) == 0
    with pytest.raises(dist.DistNetworkError):
        client.get("x")
    with pytest.raises(dist.DistStoreError, match="closed"):
        m.get("x")
    client.close()
    m2 = dist.TCPStore("127.0.0.1", 0, None, True, _seconds(5))
    assert len(_server_threads()) == 1
    del m2
    gc.collect()
    assert len(_server_threads()) == 0


def test_tcp_close_wakes_a_parked_get(master: dist.TCPStore) -> None:
    client = dist.TCPStore("127.0.0.1", master.port, None, False, _seconds(60))
    other = dist.TCPStore("127.0.0.1", master.port, None, False, _seconds(60))
    caught: Dict[str, Any] = {}

    def park(name: str, store: dist.TCPStore) -> None:
        t0 = time.monotonic()
        try:
            store.get("never")
        except Exception as exc:
            caught[name] = (exc, time.monotonic() - t0)

    threads = [threading.Thread(target=park, args=("own", client)),
               threading.Thread(target=park, args=("master", other))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    client.close()  # this handle: its own waiter gets an error, not a 60 s wait
    _join_all(threads[:1], 10)
    master.close()  # the server: every connected client is told
    _join_all(threads[1:], 10)
    assert isinstance(caught["own"][0], dist.DistStoreError) and caught["own"][1] < 5
    assert isinstance(caught["master"][0], dist.DistNetworkError)
    assert caught["master"][1] < 5
    other.close()


def test_tcp_attributes_and_clone(master: dist.TCPStore) -> None:
    assert master.host == "127.0.0.1" and 0 < master.port < 65536
    assert master.libuvBackend is False
    c = master.clone()
    assert c.host == "127.0.0.1" and c.port == master.port
    c.set("a", "1")
    assert master.get("a") == b"1"
    assert "master" in repr(master) and "client" in repr(c)
    c.close()


def test_tcp_master_listen_fd() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    m = dist.TCPStore("127.0.0.1", port, None, True, _seconds(5),
                      master_listen_fd=listener.detach())
    client = dist.TCPStore("127.0.0.1", port, None, False, _seconds(5))
    client.set("via", "fd")
    assert m.port == port and m.get("via") == b"fd"
    client.close()
    m.close()


# ============================================================================ torch parity
# Which of our classes answers for each exception class torch raises.
_EXC = {"DistStoreError": dist.DistStoreError, "DistNetworkError": dist.DistNetworkError,
        "RuntimeError": RuntimeError, "ValueError": ValueError, "TypeError": TypeError}

Step = Tuple[str, Callable[[Any], Any]]

_COMMON_STEPS: List[Step] = [
    ("timeout", lambda s: s.timeout),
    ("num_keys0", lambda s: s.num_keys()),
    ("set str", lambda s: s.set("a", "x")),
    ("set bytes", lambda s: s.set("b", b"\x00\xff")),
    ("get a", lambda s: s.get("a")),
    ("get b", lambda s: s.get("b")),
    ("num_keys", lambda s: s.num_keys()),
    ("add 5", lambda s: s.add("c", 5)),
    ("add -7", lambda s: s.add("c", -7)),
    ("get counter", lambda s: s.get("c")),
    ("add wraps", lambda s: (s.add("big", 2 ** 62), s.add("big", 2 ** 62))),
    ("add float", lambda s: s.add("c", 1.5)),
    ("add huge", lambda s: s.add("c", 2 ** 63)),
    ("check both", lambda s: s.check(["a", "c"])),
    ("check one missing", lambda s: s.check(["a", "zz"])),
    ("check none", lambda s: s.check([])),
    ("check str", lambda s: s.check("a")),
    ("cas missing ''", lambda s: (s.compare_set("m1", "", "v"), s.get("m1"))),
    ("cas missing q", lambda s: (s.compare_set("m2", "q", "v"), s.check(["m2"]))),
    ("cas match", lambda s: s.compare_set("a", "x", "y")),
    ("cas mismatch", lambda s: s.compare_set("a", "x", "z")),
    ("cas present ''", lambda s: (s.compare_set("a", "", "z"), s.get("a"))),
    ("cas empty value", lambda s: (s.set("e", ""), s.compare_set("e", "", "w"))),
    ("cas bytes", lambda s: s.compare_set("a", b"y", b"\xff")),
    ("append", lambda s: (s.append("ap", "po"), s.append("ap", b"tato"), s.get("ap"))),
    ("multi_set/get", lambda s: (s.multi_set(["k1", "k2"], ["v1", b"v2"]),
                                 s.multi_get(["k1", "k2"]), s.multi_get([]))),
    ("delete", lambda s: s.delete_key("a")),
    ("num_keys after", lambda s: s.num_keys()),
    ("wait present", lambda s: s.wait(["k1"])),
    ("wait empty", lambda s: s.wait([])),
    ("set int value", lambda s: s.set("i", 5)),
    ("set None key", lambda s: s.set(None, "v")),
    ("bytes key", lambda s: (s.set(b"kb", "v"), s.get("kb"))),
    ("empty key", lambda s: (s.set("", "v"), s.get(""))),
    ("unicode", lambda s: (s.set("ü", "é"), s.get("ü"))),
    ("add onto numbers", lambda s: [(s.set(f"n{i}", v), s.add(f"n{i}", 1))[1] for i, v in
                                    enumerate(["12", " 12", "+5", "1.5", "12abc", "0x10", "-0",
                                               "1_0"])]),
    ("set_timeout", lambda s: (s.set_timeout(_seconds(0.25)), s.timeout)),
    ("wait missing", lambda s: s.wait(["zz"], _seconds(0.2))),
    ("get missing", lambda s: s.get("zz")),
]
_BARRIER: Step = ("barrier", lambda s: (s.barrier("bar", 1), s.get("bar/num_members")))
# Beyond the common steps, per store (where torch's stores differ from each other; torch's
# TCPStore has a barrier of its own, on other keys).
_EXTRA_STEPS: Dict[str, List[Step]] = {
    "tcp": [("delete again", lambda s: s.delete_key("a")),
            ("list_keys", lambda s: sorted(s.list_keys())),
            ("has_extended_api", lambda s: s.has_extended_api()),
            ("multi_get missing", lambda s: s.multi_get(["k1", "zz"]))],
    "hash": [_BARRIER, ("delete again", lambda s: s.delete_key("a")),
             ("list_keys", lambda s: sorted(s.list_keys())),
             ("has_extended_api", lambda s: s.has_extended_api()),
             ("add onto text", lambda s: (s.set("t", "x"), s.add("t", 1))),
             ("add onto empty", lambda s: (s.set("t2", ""), s.add("t2", 1)))],
    "file": [_BARRIER, ("delete again (True in torch)", lambda s: s.delete_key("a")),
             ("has_extended_api", lambda s: s.has_extended_api()),
             ("add onto text", lambda s: (s.set("t", "x"), s.add("t", 1))),
             ("add onto empty", lambda s: (s.set("t2", ""), s.add("t2", 1)))],
    "prefix": [_BARRIER, ("delete again", lambda s: s.delete_key("a")),
               ("list_keys", lambda s: sorted(s.list_keys())),
               ("underlying keys", lambda s: sorted(s.underlying_store.list_keys()))],
}


def _run_steps(store: Any, steps: List[Step]) -> List[Tuple[str, Any]]:
    out = []
    for _, fn in steps:
        try:
            out.append(("ok", fn(store)))
        except Exception as exc:
            out.append(("exc", exc))
    return out


def _compare(steps: List[Step], theirs: List[Tuple[str, Any]],
             ours: List[Tuple[str, Any]]) -> None:
    for (name, _), (tk, tv), (ok, ov) in zip(steps, theirs, ours):
        if tk == "ok":
            assert ok == "ok", f"{name}: torch returned {tv!r}, we raised {ov!r}"
            assert ov == tv, f"{name}: torch {tv!r}, ours {ov!r}"
        else:
            expected = _EXC[type(tv).__name__]
            assert ok == "exc", f"{name}: torch raised {tv!r}, we returned {ov!r}"
            assert isinstance(ov, expected), f"{name}: torch {tv!r}, ours {ov!r}"


def _torch_store(tdist: Any, kind: str, tmp_path: Path) -> Any:
    if kind == "tcp":
        return tdist.TCPStore("127.0.0.1", 0, 1, True, _seconds(10))
    if kind == "file":
        return tdist.FileStore(str(tmp_path / "torch_filestore"), 1)
    if kind == "hash":
        return tdist.HashStore()
    return tdist.PrefixStore("pre", tdist.HashStore())


@pytest.mark.parametrize("kind", KINDS)
def test_parity_with_torch(kind: str, tmp_path: Path) -> None:
    tdist = pytest.importorskip("torch.distributed")
    steps = _COMMON_STEPS + _EXTRA_STEPS[kind]
    theirs_store = _torch_store(tdist, kind, tmp_path)
    if kind != "tcp":  # torch's default is 300 s; start both from the TCPStore's 10 s
        theirs_store.set_timeout(_seconds(10))
    theirs = _run_steps(theirs_store, steps)
    del theirs_store
    with _make(kind, tmp_path) as ours_store:
        if kind != "tcp":
            ours_store.set_timeout(_seconds(10))
        ours = _run_steps(ours_store, steps)
    _compare(steps, theirs, ours)


def test_parity_tcp_num_keys_with_world_size() -> None:
    tdist = pytest.importorskip("torch.distributed")

    def run(mod: Any) -> List[int]:
        counts = []
        for ws, wfw in [(None, True), (-1, True), (1, True), (1, False), (2, False)]:
            m = mod.TCPStore("127.0.0.1", 0, ws, True, _seconds(5), wait_for_workers=wfw)
            c = mod.TCPStore("127.0.0.1", m.port, ws, False, _seconds(5),
                             wait_for_workers=wfw)
            counts.append(m.num_keys())
            m.set("a", "1")
            counts.append(c.num_keys())
            del c, m
        return counts

    assert run(dist) == run(tdist)


def test_parity_tcp_errors() -> None:
    tdist = pytest.importorskip("torch.distributed")

    def errors(mod: Any) -> List[type]:
        out = []
        calls = [
            lambda: mod.TCPStore("127.0.0.1", 0, 0, True, _seconds(1)),
            lambda: mod.TCPStore("127.0.0.1", _free_port(), None, False, _seconds(0.3)),
            lambda: mod.TCPStore("127.0.0.1", 0, 2, True, _seconds(0.3)),
        ]
        for call in calls:
            try:
                call()
                out.append(type(None))
            except Exception as exc:
                out.append(type(exc))
        with socket.socket() as holder:
            holder.bind(("0.0.0.0", 0))
            holder.listen()
            try:
                mod.TCPStore("127.0.0.1", holder.getsockname()[1], None, True, _seconds(1))
                out.append(type(None))
            except Exception as exc:
                out.append(type(exc))
        return out

    theirs, ours = errors(tdist), errors(dist)
    for t, o in zip(theirs, ours):
        assert issubclass(o, _EXC[t.__name__]), (theirs, ours)


def test_parity_filestore_cleanup(tmp_path: Path) -> None:
    tdist = pytest.importorskip("torch.distributed")

    def lifecycle(mod: Any, tag: str) -> List[bool]:
        seen = []
        for ws in (1, 2, -1):
            path = str(tmp_path / f"{tag}{ws}")
            a = mod.FileStore(path, ws)
            b = mod.FileStore(path, ws) if ws == 2 else None
            a.set("k", "v")
            del a
            gc.collect()
            seen.append(os.path.exists(path))
            del b
            gc.collect()
            seen.append(os.path.exists(path))
        return seen

    assert lifecycle(dist, "ours") == lifecycle(tdist, "torch") == [False, False, True, False,
                                                                   True, True]


def test_parity_prefix_store_barrier_keys() -> None:
    tdist = pytest.importorskip("torch.distributed")

    def keys(mod: Any) -> List[str]:
        base = mod.HashStore()
        p = mod.PrefixStore("pre", base)
        p.barrier("b", 1)
        p.multi_set(["m1"], ["1"])
        return sorted(base.list_keys())

    assert keys(dist) == keys(tdist)


def test_tcp_requests_sent_together_are_answered_in_order() -> None:
    """``TCPStore._requests`` (the rendezvous's claim, count and wait in one exchange): the
    replies come in order; an error reply is raised once every reply was read, so the
    connection stays usable; ``until`` stops reading (a parked get left unread) and drops the
    connection, and the next request makes a new one."""
    with dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5),
                       wait_for_workers=False) as m:
        c = dist.TCPStore("127.0.0.1", m.port, None, False, timedelta(seconds=5))
        claim = [(wire.CAS, [b"rank/1", b"", b"b"]), (wire.ADD, [b"arrived", wire.i64(1)])]
        assert c._requests(claim) == [(wire.OK, [b"b"]), (wire.OK, [wire.i64(1)])]
        m.set("text", "x")
        with pytest.raises(ValueError):
            c._requests([(wire.ADD, [b"text", wire.i64(1)]), (wire.SET, [b"after", b"1"])])
        assert c.get("after") == b"1"
        seen = []
        got = c._requests(claim + [(wire.GET, [wire.i64(60_000), b"never"])], 60.0,
                          until=lambda r: seen.append(len(r)) or len(r) == 2)
        assert got == [(wire.OK, [b"b"]), (wire.OK, [wire.i64(2)])] and seen == [1, 2]
        assert c.add("arrived", 0) == 2  # on a new connection, at once
        assert c._requests(claim[1:] + [(wire.GET, [wire.i64(5_000), b"after"])], 5.0,
                           until=lambda r: False) == [(wire.OK, [wire.i64(3)]),
                                                      (wire.OK, [b"1"])]
        c.close()


def test_tcp_pipelined_requests_past_the_reply_limit_are_all_answered() -> None:
    """Requests that came in one read are answered together (one send), which stops where
    their replies pass the connection's limit of queued bytes; once sent, the rest are
    served without waiting for more from the client: 64 gets of 16 KiB sent at once (1 MiB
    of replies, four times the limit) all come back, in order."""
    value = bytes(range(256)) * 64
    with dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10),
                       wait_for_workers=False) as m:
        m.set("v", value)
        with socket.create_connection(("127.0.0.1", m.port), timeout=10) as s:
            assert s.recv(len(wire.MAGIC), socket.MSG_WAITALL) == wire.MAGIC
            gets = b"".join(wire.encode(wire.GET, [wire.i64(1000), b"v"]) for _ in range(64))
            s.sendall(wire.MAGIC + gets)
            one = wire.encode(wire.OK, [value])
            got = b""
            while len(got) < 64 * len(one):
                chunk = s.recv(1 << 20)
                assert chunk, f"closed after {len(got)} bytes"
                got += chunk
            assert got == one * 64
