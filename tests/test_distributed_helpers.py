"""monitored_barrier, new_subgroups(_by_enumeration), get_node_local_rank and
is_torchelastic_launched (issue 25, family 9): a torch-style program under ``mpiexec -n 4``,
every rank's output asserted, and the launch-variable readers without MPI."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import mpitensor.distributed as dist

from .launch import find_mpiexec, run_job

SCRIPT = Path(__file__).resolve().parent / "fault_scripts" / "barrier_subgroups.py"


def test_subgroups_and_barrier_on_every_rank() -> None:
    rc, out, err, _ = run_job([find_mpiexec(), "-n", "4", sys.executable, str(SCRIPT)],
                              timeout=120)
    assert rc == 0, out + err
    for r in range(4):
        assert f"rank {r} local {r} elastic False" in out
        assert f"rank {r} pairs {1 if r < 2 else 5} of 2" in out
        ranks = [0, 3] if r in (0, 3) else [1, 2]
        assert f"rank {r} enumerated 3 ranks {ranks}" in out
        assert f"rank {r} new_subgroups(3) ValueError: new_subgroups: the world size 4 is not " \
               f"divisible by group_size 3" in out
        assert f"rank {r} new_subgroups(0) ValueError" in out
        assert f"rank {r} new_subgroups(8) ValueError: new_subgroups: group_size 8 exceeds" in out
        assert f"rank {r} overlap ValueError: new_subgroups_by_enumeration: rank 1 is in more " \
               f"than one subgroup" in out


def test_monitored_barrier_names_the_late_rank_and_breaks_the_group() -> None:
    rc, out, err, took = run_job([find_mpiexec(), "-n", "4", sys.executable, str(SCRIPT),
                                  "late"], timeout=120)
    assert rc == 0, out + err
    assert "rank 0 raised DistributedTimeoutError: monitored_barrier on WORLD: rank 2 did not " \
           "reach the barrier within 2 s" in out
    for r in (1, 2, 3):  # the others learn that the group is broken, none passes
        assert re.search(rf"rank {r} raised PeerFailedError: .*rank 0 failed", out), out
    assert "passed" not in out


def test_launch_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    assert dist.is_torchelastic_launched() is False
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert dist.is_torchelastic_launched() is True
    with pytest.raises(RuntimeError, match="fallback_rank"):
        dist.get_node_local_rank()
    assert dist.get_node_local_rank(fallback_rank=5) == 5
    monkeypatch.setenv("MPI_LOCALRANKID", "2")
    assert dist.get_node_local_rank() == 2
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert dist.get_node_local_rank(fallback_rank=0) == 3
    monkeypatch.setenv("LOCAL_RANK", "³")  # not an ASCII digit: not a rank
    assert dist.get_node_local_rank() == 2
