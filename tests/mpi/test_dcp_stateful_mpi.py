"""Stateful values and async_save across ranks (1-4), beside the program's own collectives.

Run with ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_dcp_stateful_mpi.py``.
Saving at 4 ranks and loading at 2 and at 1 (separate jobs) is tests/test_dcp_stateful.py.
"""

from __future__ import annotations

import os
from typing import Any, Dict

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.distributed.checkpoint as dcp

from ..dcp_stateful_job import AppState, build, compare, full_state, train
from .test_dcp import shared_dir  # noqa: F401 - the fixture shared_dir

pytestmark = pytest.mark.mpi(min_size=1)


def test_fully_shard_app_state_round_trip(shared_dir: str) -> None:  # noqa: F811
    model, opt = build(True)
    for step in range(2):
        train(model, opt, step)
    path = os.path.join(shared_dir, "ck")
    dcp.save({"app": AppState(model, opt), "epoch": 4}, checkpoint_id=path)
    fresh, fresh_opt = build(True, seed=11)
    sd: Dict[str, Any] = {"app": AppState(fresh, fresh_opt), "epoch": 0}
    dcp.load(sd, checkpoint_id=path)
    assert sd["epoch"] == 4
    assert compare(full_state(fresh, fresh_opt), full_state(model, opt)) > 10


def test_async_save_while_the_program_communicates(shared_dir: str) -> None:  # noqa: F811
    """The writer thread agrees over its own communicator while every main thread trains
    and all-reduces on the program's group; the checkpoint holds the values of the call."""
    model, opt = build(True)
    train(model, opt, 0)
    want = full_state(model, opt)
    path = os.path.join(shared_dir, "ck")
    future = dcp.async_save({"app": AppState(model, opt)}, checkpoint_id=path)
    total = mt.zeros(1)
    for step in range(1, 6):
        train(model, opt, step)
        t = mt.full((1,), float(dist.get_rank() + step))
        dist.all_reduce(t)
        total += t
    n = dist.get_world_size()
    assert total.item() == sum(n * step + n * (n - 1) / 2 for step in range(1, 6))
    future.result()
    fresh, fresh_opt = build(True, seed=12)
    dcp.load({"app": AppState(fresh, fresh_opt)}, checkpoint_id=path)
    compare(full_state(fresh, fresh_opt), want)


def test_async_save_on_sub_groups(shared_dir: str) -> None:  # noqa: F811
    """Even and odd ranks each save their own checkpoint over their own group, at once."""
    n, rank = dist.get_world_size(), dist.get_rank()
    halves = [r for r in (list(range(0, n, 2)), list(range(1, n, 2))) if r]
    groups = [dist.new_group(h) for h in halves]
    mine = groups[rank % 2]
    members = halves[rank % 2]
    path = os.path.join(shared_dir, f"half{rank % 2}")
    rows = np.arange(len(members) * 3, dtype=np.float32).reshape(len(members), 3) + rank % 2
    me = members.index(rank)
    shard = dcp.LocalShard(mt.from_numpy(rows[me:me + 1].copy()), rows.shape, (me, 0))
    future = dcp.async_save({"rows": shard, "who": rank % 2}, checkpoint_id=path,
                            process_group=mine)
    dist.all_reduce(mt.ones(4))  # the world's traffic meanwhile
    future.result()
    back = mt.zeros(*rows.shape)
    sd = {"rows": back, "who": -1}
    dcp.load(sd, checkpoint_id=path, process_group=mine)
    assert sd["who"] == rank % 2 and back.numpy().tobytes() == rows.tobytes()


class _ListOnLastRank:
    def state_dict(self) -> Any:
        return [0] if dist.get_rank() == dist.get_world_size() - 1 else {"x": mt.ones(2)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        raise AssertionError("not reached")


def test_a_bad_stateful_on_one_rank_fails_every_rank(shared_dir: str) -> None:  # noqa: F811
    path = os.path.join(shared_dir, "ck")
    last = dist.get_world_size() - 1
    for call in (dcp.save, dcp.async_save):
        with pytest.raises(ValueError, match="returned list, not a dict") as info:
            call({"bad": _ListOnLastRank()}, checkpoint_id=path)
        if last:
            assert f"rank {last}: 'bad'" in str(info.value)
    assert not os.path.exists(path)
    dcp.save({"bad": {"x": mt.ones(2)}}, checkpoint_id=path)
    with pytest.raises(ValueError, match="returned list, not a dict"):
        dcp.load({"bad": _ListOnLastRank()}, checkpoint_id=path)
