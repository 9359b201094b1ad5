"""Smoke tests of benchmarks/step_times.py: a small 2-rank run prints both training rows, on
the working tree and on a snapshot of a commit (``--at``, with ``--forced``'s fourth group).

No timing is asserted: only that the driver started its job, that the job timed DDP and
``fully_shard`` through MPI, through shared memory and locally, and that the report and the
JSON carry every figure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from .launch import clean_env

ROOT = Path(__file__).resolve().parent.parent


def test_step_times_quick_prints_ddp_and_fully_shard_rows(tmp_path: Path) -> None:
    out_json = tmp_path / "steps.json"
    out_md = tmp_path / "steps.md"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step_times.py"), "--ranks", "2", "--quick",
         "--timeout", "150", "--out-md", str(out_md), "--json", str(out_json)],
        capture_output=True, text=True, timeout=200, env=clean_env(), cwd=ROOT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    number = r"[0-9]+(?:\.[0-9]+)?"
    for kind in ("DDP", "fully_shard"):
        row = re.search(rf"^\| 2 \| {kind} \| (.*) \|$", run.stdout, re.M)
        assert row, f"no {kind} row:\n{run.stdout}"
        cells = [c.strip() for c in row.group(1).split(" | ")]
        # local, MPI and shm steps, the paired ratio with its quartiles, two shares
        assert all(re.fullmatch(number, c) for c in cells[:3]), row.group(0)
        assert re.fullmatch(rf"{number} \({number}–{number}\)", cells[3]), row.group(0)
        assert all(re.fullmatch(rf"-?{number}%", c) for c in cells[4:6]), row.group(0)
        if kind == "DDP":
            assert re.fullmatch(rf"{number}, {number}", cells[6]), row.group(0)
    assert "load average" in out_md.read_text() and "commit" in out_md.read_text()
    job = json.loads(out_json.read_text())["jobs"][0]
    assert job["ranks"] == 2 and job["width"] == 512
    for kind in ("DDP", "fully_shard"):
        times = job["kinds"][kind]["times_s"]
        assert sorted(times) == ["MPI", "local", "shm"]
        assert all(len(v) == job["reps"] and min(v) > 0 for v in times.values())


def test_step_times_at_a_commit_imports_that_snapshot(tmp_path: Path) -> None:
    # a fixed commit: other work may move HEAD while the run goes on
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=ROOT, check=True).stdout.strip()
    out_json = tmp_path / "steps.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step_times.py"), "--ranks", "2", "--quick",
         "--forced", "--at", head, "--timeout", "150", "--out-md", "", "--json", str(out_json)],
        capture_output=True, text=True, timeout=200, env=clean_env(), cwd=ROOT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "mpitensor/ as committed there, from a snapshot" in run.stdout
    data = json.loads(out_json.read_text())
    assert data["meta"]["commit"] == head and data["meta"]["uncommitted"] == []
    # the job imported the snapshot (the driver checks the path too), since removed
    job = data["jobs"][0]
    assert not job["mpitensor"].startswith(str(ROOT)) and not Path(job["mpitensor"]).exists()
    assert "| forced step (ms) | forced / MPI (paired; quartiles) |" in run.stdout
    for kind in ("DDP", "fully_shard"):
        assert re.search(rf"^\| 2 \| {kind} \| ", run.stdout, re.M), run.stdout
        assert sorted(job["kinds"][kind]["times_s"]) == ["MPI", "forced", "local", "shm"]
