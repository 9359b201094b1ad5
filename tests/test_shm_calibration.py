"""The shared-memory engine's cost model (``shm_coll._calibrate``): its decisions from timed
pairs, without MPI (the timing and the exchange are replaced by scripted times).

What the model promises: a size's ratio of engine to MPI time is the median of its pairs'
ratios (one wild pair does not move it); a point left in doubt (median near the margin, pairs
on both sides of it) is timed once more, and only such points; a kind takes the engine from
the size where its ratio, drawn between the sizes in log-size and held past the largest,
stays at most the margin for every larger size; never where it loses at the largest size,
which is 64 MiB for a kind that lost at 16 MiB (timed only then).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mpitensor._base.config import OFF_BYTES
from mpitensor.distributed.backends.mpi import shm_coll as C

M = C._MARGIN


def test_crossing_from_ratios():
    n = len(C._CAL_BYTES)
    assert C._crossing(np.full(n, 0.5)) == C.FLOOR  # wins everywhere: from the floor
    assert C._crossing(np.full(n, 1.5)) == OFF_BYTES  # loses everywhere
    # loses at the largest size only: never, whatever it does below
    assert C._crossing(np.r_[np.full(n - 1, 0.3), 1.0]) == OFF_BYTES
    # loses up to the second largest size, wins at the largest: from a size between them
    ratio = np.r_[np.full(n - 1, 1.2), 0.5]
    got = C._crossing(ratio)
    assert C._CAL_BYTES[-2] < got <= C._CAL_BYTES[-1]
    # the line crosses the margin where it is drawn to: between the two sizes, in log-size
    x = np.log2(C._CAL_BYTES[-2:])
    at = 2.0 ** (x[0] + (x[1] - x[0]) * (1.2 - M) / (1.2 - 0.5))
    assert at <= got <= at * 2 ** 0.25  # the first size of the grid (4 per octave) past it
    # a loss in the middle sends every smaller size to MPI too
    mid = np.full(n, 0.5)
    mid[1] = 1.3
    assert C._crossing(mid) > C._CAL_BYTES[1]


def test_ratio_is_the_median_of_pairs():
    pairs = [(1.0, 2.0), (1.0, 2.0), (50.0, 1.0)]  # one pair hit by load: no effect
    assert C._ratio(pairs) == 0.5
    assert C._ratio([(1.0, 4.0), (3.0, 4.0)]) == 0.5  # even count: the middle of two


def test_doubt_needs_both_a_median_near_the_margin_and_split_pairs():
    assert C._split([(0.8, 1.0), (0.95, 1.0), (0.92, 1.0)])  # median 0.92, pairs both sides
    assert not C._split([(0.8, 1.0), (0.85, 1.0), (0.88, 1.0)])  # all on one side
    assert not C._split([(0.3, 1.0), (0.4, 1.0), (2.0, 1.0)])  # split, median far below


def test_each_timed_call_follows_one_of_its_own_kind_and_a_barrier():
    """A pair's calls start where a program's repeated calls start (the kind's own last
    call, the members together), the order of the two kinds alternating."""
    log = []
    t = C._pairs((lambda: log.append("e"), lambda: log.append("m")), 2,
                 lambda: log.append("|"))
    assert "".join(log) == "e|em|m" + "m|me|e"  # (the call after each "|" is the timed one)
    assert t.shape == (4,) and (t >= 0).all()


def _run(monkeypatch, script):
    """Run _calibrate with the times ``script(size, kind, round)`` -> list of (e, m) pairs;
    return the thresholds, the engine's ratios and the rounds each point was timed in."""
    timed: dict = {}
    monkeypatch.setattr(C, "_cases", lambda eng, h, s, label, nbytes: tuple(
        (nbytes, k) for k in range(len(C._KINDS))))

    def pairs(case, reps, sync):
        nbytes, k = case
        i = (C._CAL_BYTES + (C._CAL_LARGE,)).index(nbytes)  # LARGE: len(_CAL_BYTES)
        rnd = len(timed.setdefault((i, k), []))
        timed[(i, k)].append(rnd)
        got = script(i, k, rnd)[:reps]
        assert len(got) == reps == _reps(i) - rnd  # the second round: one pair fewer
        return np.array(got, float).reshape(-1)

    monkeypatch.setattr(C, "_pairs", pairs)
    monkeypatch.setattr(C, "_exchange", lambda h, v, mop, s, op: None)  # one member: as is
    eng = SimpleNamespace(calibration=None)
    th = C._calibrate(eng, SimpleNamespace(health=None), 1, "all_reduce")
    return th, eng.calibration, timed


def _reps(i):
    return C._CAL_PAIRS if i < len(C._CAL_BYTES) and C._CAL_BYTES[i] <= 1 << 20 \
        else C._CAL_PAIRS_LARGE


def test_calibrate_clear_wins_and_losses_take_one_round(monkeypatch):
    def script(i, k, rnd):
        ratio = (0.4, 1.5, 0.4)[k] if i else 2.0  # reduce wins, scatter loses, move wins
        return [(ratio, 1.0)] * _reps(i)

    th, ratio, timed = _run(monkeypatch, script)
    assert th["reduce"] == th["move"] and C.FLOOR <= th["reduce"] <= C._CAL_BYTES[1]
    assert th["scatter"] == OFF_BYTES
    assert all(r == [0] for r in timed.values())  # no second round
    assert ratio.shape == (len(C._CAL_BYTES), len(C._KINDS))
    large = len(C._CAL_BYTES)  # the 64 MiB point: for the kind that lost at 16 MiB only
    assert [k for i, k in timed if i == large] == [1]


def test_a_kind_that_loses_at_16_mib_and_wins_at_64_takes_the_engine_between(monkeypatch):
    # MPI's buffers of 16 MiB may still fit a cache: the engine loses there, and wins by 3x
    # at 64 MiB; held flat, the 16 MiB ratio would have sent every larger call to MPI
    large = len(C._CAL_BYTES)

    def script(i, k, rnd):
        ratio = {large: 0.35, large - 1: 1.2}.get(i, 1.4) if k == 0 else 0.5
        return [(ratio, 1.0)] * _reps(i)

    th, _, timed = _run(monkeypatch, script)
    assert C._CAL_BYTES[-1] < th["reduce"] <= C._CAL_LARGE
    assert th["scatter"] == th["move"] == C.FLOOR
    assert timed[(large, 0)] == [0] and (large, 1) not in timed and (large, 2) not in timed
    # where it loses at 64 MiB too: never
    th, _, _ = _run(monkeypatch, lambda i, k, rnd: [((1.2 if k == 0 else 0.5), 1.0)] * _reps(i))
    assert th["reduce"] == OFF_BYTES


def test_calibrate_times_a_point_in_doubt_again_and_decides_by_all_pairs(monkeypatch):
    last = len(C._CAL_BYTES) - 1

    def script(i, k, rnd):
        n = _reps(i)
        if i == last and k == 0:
            # first round: the median just over the margin, pairs on both sides; the second
            # round: clear wins, so the median of all pairs wins
            return [(0.85, 1.0)] + [(0.95, 1.0)] * (n - 1) if rnd == 0 else [(0.5, 1.0)] * n
        return [(0.5, 1.0)] * n

    th, ratio, timed = _run(monkeypatch, script)
    assert timed[(last, 0)] == [0, 1]
    assert all(r == [0] for key, r in timed.items() if key != (last, 0))
    assert ratio[last, 0] <= M and th["reduce"] == C.FLOOR


@pytest.mark.parametrize("second", [0.5, 1.2])
def test_calibrate_agrees_with_the_median_after_the_recheck(monkeypatch, second):
    last = len(C._CAL_BYTES) - 1

    def script(i, k, rnd):
        n = _reps(i)
        if i == last:
            return [(0.85, 1.0)] + [(0.95, 1.0)] * (n - 1) if rnd == 0 else [(second, 1.0)] * n
        if i > last:  # 64 MiB (timed where 16 MiB lost): as 16 MiB
            return [(second, 1.0)] * n
        return [(0.5, 1.0)] * n

    th, ratio, _ = _run(monkeypatch, script)
    both = [0.85] + [0.95] * (_reps(last) - 1) + [second] * (_reps(last) - 1)
    assert ratio[last, 0] == pytest.approx(np.median(both))
    assert (th["reduce"] == OFF_BYTES) == (np.median(both) > M)


def test_calibrate_leaves_a_doubt_that_decides_nothing(monkeypatch):
    """Kind "reduce" loses clearly at the largest size (never, whatever lies below): its
    1 MiB point, in doubt, is not timed again; the same doubt under a clear win at every
    other size is (it decides where between the floor and 4 MiB the engine starts), and so
    is one at the floor (the smallest size timed), which decides whether the engine starts
    there or a little above it."""
    last = len(C._CAL_BYTES) - 1

    def script(i, k, rnd):
        n = _reps(i)
        if (i == 1 and k in (0, 1)) or (i == 0 and k == 2):
            return [(0.85, 1.0)] + [(0.95, 1.0)] * (n - 1)
        if i >= last and k == 0:  # (and at 64 MiB, timed because 16 MiB lost)
            return [(1.5, 1.0)] * n
        return [(0.5, 1.0)] * n

    th, _, timed = _run(monkeypatch, script)
    assert th["reduce"] == OFF_BYTES and timed[(1, 0)] == [0]
    assert timed[(1, 1)] == [0, 1]
    assert C._CAL_BYTES[0] == C.FLOOR and timed[(0, 2)] == [0, 1]
    assert C.FLOOR < th["move"] < C._CAL_BYTES[1]  # (the doubt held: it loses at the floor)
