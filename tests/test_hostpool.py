"""HostPool (mpitensor-run --hostfile FILE --nnodes MIN:MAX): which hosts each start takes.

Unit tests with a scripted probe; the real thing (hosts lost and back on a network-namespace
cluster, train.py resuming at the new size) is in ``test_cluster.py``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from mpitensor.distributed.launch import HostEntry, parse_hostfile
from mpitensor.distributed.launch import hostpool as _hostpool
from mpitensor.distributed.launch.hostpool import HostPool, NotEnoughHosts

HOSTS = [HostEntry("n1", 2), HostEntry("n2", 2), HostEntry("n3", 2)]


class Script:
    """A probe whose answers the test sets: host -> (answers, why not); counts the asks."""

    def __init__(self) -> None:
        self.down: Dict[str, str] = {}
        self.asked: List[str] = []
        self.lock = threading.Lock()

    def __call__(self, entry: HostEntry, scratch: str) -> Tuple[bool, str]:
        assert os.path.isdir(scratch)
        with self.lock:
            self.asked.append(entry.host)
        why = self.down.get(entry.host)
        return (why is None), (why or "")


def _pool(probe: Script, low: int, high: int, syntax: str = "mpich", per_node: int = 2,
          **kw: float) -> Tuple[HostPool, List[str]]:
    said: List[str] = []
    return HostPool(HOSTS, syntax, low, high, per_node, probe, say=said.append, **kw), said


def test_every_start_takes_the_hosts_that_answer_in_order() -> None:
    probe = Script()
    pool, said = _pool(probe, 1, 3)
    try:
        path, n = pool.pick(0)
        assert (Path(path).read_text(), n) == ("n1:2\nn2:2\nn3:2\n", 6)
        assert said == ["starting on 3 of 3 host(s) (n1, n2, n3), 6 rank(s)"]
        assert sorted(probe.asked) == ["n1", "n2", "n3"]
        probe.down["n2"] = "exit code 255: no route to host"
        path, n = pool.pick(1)
        assert (Path(path).read_text(), n) == ("n1:2\nn3:2\n", 4)
        assert said[-1] == ("restarting on 2 of 3 host(s) (n1, n3), 4 rank(s); left out, not "
                            "answering: n2 (exit code 255: no route to host)")
        assert parse_hostfile(path)[0] == [HOSTS[0], HOSTS[2]]
        del probe.down["n2"]  # back: taken again
        path, n = pool.pick(2)
        assert n == 6 and said[-1].startswith("restarting on 3 of 3 host(s)")
        said.clear()
        pool.pick(3)  # nothing changed: nothing said
        assert said == []
        assert sorted(os.listdir(pool.dir)) == ["hostfile.3"]  # old ones removed
    finally:
        pool.close()
    assert not os.path.exists(pool.dir)


def test_at_most_max_hosts_the_rest_spare() -> None:
    probe = Script()
    pool, said = _pool(probe, 1, 2, syntax="openmpi", per_node=3)
    try:
        path, n = pool.pick(0)
        assert (Path(path).read_text(), n) == ("n1 slots=2\nn2 slots=2\n", 6)
        assert said == ["starting on 2 of 3 host(s) (n1, n2), 6 rank(s); spare beyond --nnodes "
                        "MAX 2: n3"]
        probe.down["n1"] = "timeout"
        path, n = pool.pick(1)  # the spare steps in
        assert Path(path).read_text() == "n2 slots=2\nn3 slots=2\n"
    finally:
        pool.close()


def test_too_few_hosts_are_asked_again_until_the_join_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hostpool, "RETRY_S", 0.05)
    probe = Script()
    probe.down.update(n2="exit code 255: refused", n3="no answer within 20 s")
    pool, said = _pool(probe, 2, 3, join_timeout=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(NotEnoughHosts) as info:
            pool.pick(0)
        took = time.monotonic() - t0
    finally:
        pool.close()
    assert 0.4 < took < 3.0
    assert str(info.value) == (
        "--nnodes 2:3 needs at least 2 host(s), but only 1 of the hostfile's 3 answered within "
        "--rdzv-conf join_timeout=0.5 s: n2: exit code 255: refused; n3: no answer within 20 s")
    assert said == ["1 of 3 host(s) answer, --nnodes 2:3 needs 2: asking again every 0.05 s for "
                    "up to 0.5 s (n2: exit code 255: refused; n3: no answer within 20 s)"]
    assert probe.asked.count("n1") > 3  # asked round after round


def test_a_host_that_comes_within_the_join_timeout_is_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hostpool, "RETRY_S", 0.05)
    probe = Script()
    probe.down["n2"] = "booting"
    probe.down["n3"] = "booting"
    pool, said = _pool(probe, 2, 3, join_timeout=30)
    threading.Timer(0.3, lambda: probe.down.pop("n3")).start()
    try:
        path, n = pool.pick(0)
    finally:
        pool.close()
    assert n == 4 and said[-1].startswith("starting on 2 of 3 host(s) (n1, n3), 4 rank(s)")


def test_a_probe_that_raises_is_a_host_that_failed() -> None:
    def probe(entry: HostEntry, scratch: str) -> Tuple[bool, str]:
        if entry.host == "n3":
            raise OSError("launcher missing")
        return True, ""

    said: List[str] = []
    pool = HostPool(HOSTS, "mpich", 1, 3, 1, probe, say=said.append)
    try:
        assert pool.pick(0)[1] == 2
    finally:
        pool.close()
    assert said[0].endswith("left out, not answering: n3 (OSError: launcher missing)")


def test_keep_alive_reports_a_host_after_the_asks_in_a_row_fail() -> None:
    probe = Script()
    pool, _ = _pool(probe, 1, 3, keep_alive_interval=0.02, keep_alive_max_attempt=3)
    try:
        pool.pick(0)
        stop, lost = threading.Event(), []
        t = threading.Thread(target=pool.keep_alive, args=(stop, lambda e, why: lost.append(
            (e.host, why))))
        t.start()
        time.sleep(0.15)
        assert lost == []  # all answer: nothing reported
        probe.down["n3"] = "exit code 255"
        t.join(5)
        assert not t.is_alive()
        assert lost == [("n3", "3 keep-alive asks in a row failed, the last: exit code 255")]
        # stopping ends it at once, with nothing reported
        stop2, lost2 = threading.Event(), []
        pool2, _ = _pool(Script(), 1, 3, keep_alive_interval=30)
        pool2.pick(0)
        t2 = threading.Thread(target=pool2.keep_alive, args=(stop2, lambda *a: lost2.append(a)))
        t2.start()
        stop2.set()
        t2.join(2)
        assert not t2.is_alive() and lost2 == []
        pool2.close()
    finally:
        pool.close()


def test_all_answer_asks_the_latest_starts_hosts_once() -> None:
    """What the launcher asks when a job ended in a failure: whether a host is gone (then the
    keep-alive gets its window to name it; see mpitensor/run/supervise.py)."""
    probe = Script()
    pool, _ = _pool(probe, 1, 3)
    try:
        pool.pick(0)
        probe.asked.clear()
        assert pool.all_answer() is True and sorted(probe.asked) == ["n1", "n2", "n3"]
        probe.down["n2"] = "exit code 255: no route to host"
        assert pool.all_answer() is False
        pool.pick(1)  # (n2 left out: the latest start's hosts are n1 and n3)
        probe.asked.clear()
        assert pool.all_answer() is True and sorted(probe.asked) == ["n1", "n3"]
    finally:
        pool.close()


def test_bad_range_is_refused() -> None:
    with pytest.raises(ValueError):
        HostPool(HOSTS, "mpich", 3, 2, 1, Script())
