"""A checkpoint saved by 4 ranks loads bit-exact at 1, 2 and 3 ranks and on a 2x2 mesh; a save
killed midway leaves the previous checkpoint loadable and, after the next save, nothing behind.

Each case is a separate ``mpiexec`` job running tests/dcp_reshard_job.py, with a hard timeout.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path

import pytest

import mpitensor as mt
import mpitensor.distributed.checkpoint as dcp

from .launch import ROOT, mpiexec_run

JOB = str(ROOT / "tests" / "dcp_reshard_job.py")
TIMEOUT = 120


def _job(nprocs: int, *args: str, job: str = JOB) -> str:
    proc = mpiexec_run(nprocs, [sys.executable, job, *args], timeout=TIMEOUT, cwd=ROOT)
    assert not proc.timed_out, f"the job hung (> {TIMEOUT} s):\n{proc.output[-4000:]}"
    assert proc.returncode == 0, f"mpiexec -n {nprocs} {args} exited {proc.returncode}:\n" \
                                 f"{proc.output[-4000:]}"
    return proc.output


def _oks(output: str, nprocs: int) -> list:
    found = dict(re.findall(r"rank (\d+) ok (\d+)\b", output))
    assert sorted(map(int, found)) == list(range(nprocs)), output[-4000:]
    return [int(found[str(r)]) for r in range(nprocs)]


@pytest.fixture(scope="module")
def saved_at_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dcp") / "ck"
    out = _job(4, "save", str(path), "1")
    assert sorted(re.findall(r"rank (\d) saved", out)) == ["0", "1", "2", "3"], out
    assert sorted(os.listdir(path)) == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    return path


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_saved_at_4_loads_at_fewer_ranks(saved_at_4: Path, nprocs: int) -> None:
    counts = _oks(_job(nprocs, "load", str(saved_at_4), "1"), nprocs)
    assert len(set(counts)) == 1 and counts[0] >= 4


def test_saved_at_4_loads_on_a_2x2_mesh(saved_at_4: Path) -> None:
    counts = _oks(_job(4, "mesh", str(saved_at_4), "1"), 4)
    assert len(set(counts)) == 1


def test_a_rank_reads_only_the_files_it_overlaps(saved_at_4: Path, tmp_path: Path) -> None:
    """Rows 0-3 of w (all in rank 0's chunk) load with ranks 1-3's files gone."""
    copy = tmp_path / "ck"
    copy.mkdir()
    for name in (".metadata", "__0_0.distcp"):
        (copy / name).write_bytes((saved_at_4 / name).read_bytes())
    from . import dcp_reshard_job as job

    dest = mt.zeros(4, 5)
    dcp.load({"model": {"w": dcp.LocalShard(dest, (13, 5), (0, 0))}}, checkpoint_id=copy)
    assert dest.numpy().tobytes() == job.expected("w", 1)[:4].tobytes()


def test_torch_loads_the_4_rank_checkpoint_whole(saved_at_4: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the oracle)")
    import torch.distributed.checkpoint as tdcp

    from .dcp_reshard_job import SHAPES, expected

    sd = {"model": {"w": torch.zeros(SHAPES["w"]), "emb": torch.zeros(SHAPES["emb"]),
                    "scale": torch.zeros(3)}, "optim": {"step": 0, "groups": [{"lr": 0.0}]}}
    names = ["w", "emb"]
    meta = dcp.FileSystemReader(saved_at_4).read_metadata()
    if "dt" in meta.state_dict_metadata:
        sd["dt"] = torch.zeros(SHAPES["dt"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note that it runs without a process group
        tdcp.load(sd, checkpoint_id=saved_at_4, no_dist=True)
    for name in names:
        assert sd["model"][name].numpy().tobytes() == expected(name, 1).tobytes(), name
    if "dt" in sd:
        assert sd["dt"].numpy().tobytes() == expected("dt", 1).tobytes()
    assert sd["optim"] == {"step": 1, "groups": [{"lr": 0.5}]}
    assert sd["model"]["scale"].tolist() == [1.0, 1.0, 1.0]


def test_a_save_killed_midway_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ck"
    _job(4, "save", str(path), "1")
    before = {n: (path / n).read_bytes() for n in os.listdir(path)}
    proc = mpiexec_run(4, [sys.executable, JOB, "kill", str(path), "2"], timeout=TIMEOUT,
                       cwd=ROOT)
    assert not proc.timed_out and proc.returncode != 0, proc.output[-4000:]
    assert "rank 2 dies writing" in proc.output, proc.output[-4000:]
    assert "saved" not in proc.output
    assert {n: (path / n).read_bytes() for n in os.listdir(path)} == before
    leftovers = [n for n in os.listdir(tmp_path) if n != "ck"]
    assert len(leftovers) == 1 and re.fullmatch(r"\.ck\.dcp_[0-9a-f]{8}\.tmp", leftovers[0])
    counts = _oks(_job(2, "load", str(path), "1"), 2)  # the previous version, whole
    assert counts[0] >= 4
    _job(4, "save", str(path), "3")  # the next save removes the dead one's directory
    assert os.listdir(tmp_path) == ["ck"]
    _oks(_job(3, "load", str(path), "3"), 3)
