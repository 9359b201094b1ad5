"""A rank that breaks a group in call s+1 while its peers still finish call s (issue 29).

Call s was a correct call: every member contributed to it, so it completes with the right
values on every member; the failure surfaces in call s+1, on every member, naming s+1, within
the timeout. Rank 0 completes call s and breaks the group in call s+1 (it times out there
alone, it raises before any traffic, it passes another shape, or, in debug mode, an argument
that fails its checks); the other ranks are held in call s until rank 0's notice of s+1 has
reached them (a stand-in for a peer descheduled under load, which is how the race was met):
their last wait of call s does not end before that notice, and a few ticks of the
watchdog's checks after it. Every path (the engine's direct reads, its chunk pipeline, MPI)
and both forms (in place, ``all_reduce_into``).

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_fault_ordering.py``.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import mpitensor.distributed as dist
from mpitensor.distributed import ReduceOp
from mpitensor.distributed.backends.mpi import shm_pipe as P
from mpitensor.distributed.health import watchdog as W
from mpitensor.errors import (
    CollectiveMismatchError,
    DistributedTimeoutError,
    PeerFailedError,
)

from . import arrayimpl as ai
from .test_allreduce_out_of_place import PATHS, _make

N = 1 << 15  # 128 KiB of float32: the agreement check's size, several engine chunks
FAULTS = ("timeout", "fail", "mismatch", "debug")
_HOLD_S = 20.0  # the most a held wait waits for the notice (far beyond the normal time)
_AFTER_S = 0.05  # and how long after it (about 50 of the watchdog's 1 ms ticks)


def _data(rank: int) -> np.ndarray:
    return (np.arange(N) % 7 + rank).astype(np.float32)  # small integers: any order is exact


def _want(p: int) -> np.ndarray:
    return sum(_data(r) for r in range(p)).astype(np.float32)


class _Held:
    """A request that does not complete before a fault notice reached this rank (or
    ``hold`` seconds passed) and ``_AFTER_S`` more have, however early its own completes;
    it keeps testing its own all along (MPI's progress, which the peers need)."""

    def __init__(self, inner, h, hold: float) -> None:
        self.inner, self.h = inner, h
        self.give_up = time.perf_counter() + hold
        self.until = None
        self.done = False

    def Test(self, status=None) -> bool:  # noqa: N802 - MPI's request protocol
        if not self.done:
            self.done = bool(self.inner.Test(status))
        now = time.perf_counter()
        if self.until is None:
            if self.h.faults or self.h.broken is not None or now >= self.give_up:
                self.until = now + _AFTER_S
            return False
        return self.done and now >= self.until

    def __getattr__(self, name):  # before_check, passive: the inner request's
        return getattr(self.inner, name)


class _Comm:
    """The group's communicator, whose next ``Iallreduce`` request is held (``_Held``)."""

    def __init__(self, comm, h, hold: float, held: list) -> None:
        self._comm, self._h, self._hold, self._held = comm, h, hold, held

    def Iallreduce(self, *args):  # noqa: N802 - MPI's name
        req = self._comm.Iallreduce(*args)
        if self._held:
            return req
        self._held.append("mpi")
        return _Held(req, self._h, self._hold)

    def __getattr__(self, name):
        return getattr(self._comm, name)


def _hold_call(g, s: int, hold: float, monkeypatch) -> list:
    """Hold this rank's last wait of call ``s`` (engine) or its request (MPI); the list
    names what was held once the call ran."""
    held: list = []
    monkeypatch.setattr(g, "comm", _Comm(g.comm, g.health, hold, held))
    orig = P.Engine.wait

    def wait(eng, w, t, ranks):
        # the last wait of the call: after it, a member publishes nothing its peers need
        last = w == P.OUT if eng.cma else (w == P.RED and t == eng.step)
        if eng.seq != s or not last or held:
            return orig(eng, w, t, ranks)
        held.append("engine")
        W.wait(eng.h, _Held(P._Steps(eng, w, t, ranks), eng.h, hold), eng.op, eng.seq)

    monkeypatch.setattr(P.Engine, "wait", wait)
    return held


def _call(g, form: str, x: np.ndarray, out=None) -> np.ndarray:
    if form == "in_place":
        dist.all_reduce(x, op=ReduceOp.SUM, group=g)
        return x
    out = np.zeros_like(x) if out is None else out
    g.all_reduce_into(out, x, ReduceOp.SUM)
    return out


def _break(g, form: str, fault: str) -> None:
    """Rank 0's call s+1, which breaks the group (or, in debug mode, fails on every rank)."""
    if fault == "timeout":  # alone in it: rank 0's short timeout
        _call(g, form, _data(0))
    elif fault in ("fail", "debug"):  # a read-only output: ValueError before any traffic
        x = _data(0)
        if form == "in_place":
            x.flags.writeable = False
            _call(g, form, x)
        else:
            out = np.zeros_like(x)
            out.flags.writeable = False
            _call(g, form, x, out)
    else:  # another shape
        _call(g, form, np.ones(N + 1, np.float32))


_OWN = {"timeout": DistributedTimeoutError, "fail": ValueError,
        "mismatch": (CollectiveMismatchError, PeerFailedError), "debug": ValueError}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("form", ["in_place", "out_of_place"])
@pytest.mark.parametrize("path", PATHS)
def test_a_break_in_the_next_call_leaves_this_one_to_complete(path, form, fault, monkeypatch):
    """Call s: the reduction of every rank's data on every rank. Call s+1: rank 0's own
    error; the others an error naming call s+1 (debug mode: CollectiveMismatchError, and the
    group goes on; else PeerFailedError, and every later call on the group raises it too),
    well within the timeout."""
    me, p = dist.get_rank(), dist.get_world_size()
    with ai.debug_mode(fault == "debug"):
        # rank 0's short timeout ends its lonely call s+1; the others' bounds the test
        g = _make(path, monkeypatch, timeout=0.5 if me == 0 and fault == "timeout" else 30)
        _call(g, form, _data(me))  # the engine made, its thresholds measured
        dist.barrier()
        s = g.seq + 1
        held = [] if me == 0 else _hold_call(
            g, s, _HOLD_S if fault in ("timeout", "fail") else 0.3, monkeypatch)
        t0 = time.monotonic()
        got = _call(g, form, _data(me))
        np.testing.assert_array_equal(got, _want(p))  # call s: right on every rank
        if me:
            assert held, "the call was not held"
            if fault in ("timeout", "fail"):  # held until rank 0's notice came
                assert g.health.faults and time.monotonic() - t0 < _HOLD_S
        monkeypatch.undo()  # (the hold and the group's switches)
        if me == 0:
            with pytest.raises(_OWN[fault]) as info:
                _break(g, form, fault)
        else:
            with pytest.raises(CollectiveMismatchError if fault == "debug" else
                               (PeerFailedError, CollectiveMismatchError)) as info:
                _call(g, form, _data(me))
        assert time.monotonic() - t0 < 20  # the timeout: 30 s (rank 0's: 0.5 s)
        if not (me == 0 and fault in ("fail", "debug")):  # (rank 0's own ValueError)
            assert f"#{s + 1} on {g.name}" in str(info.value)
        if fault == "debug":  # nothing was posted: the group goes on
            np.testing.assert_array_equal(_call(g, form, _data(me)), _want(p))
        else:  # every later call raises, naming call s+1
            with pytest.raises(PeerFailedError, match=re.escape(f"#{s + 1} on {g.name}")):
                _call(g, form, _data(me))
        dist.barrier()
        dist.destroy_process_group(g)
