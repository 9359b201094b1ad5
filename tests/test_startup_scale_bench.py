"""Smoke test of benchmarks/startup_scale.py: one small run prints every row it should.

No timing is asserted: only that each part ran at N=16 and reported its columns and fits.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_startup_scale_prints_every_part_at_16_ranks() -> None:
    parts = ["mpi_init", "rendezvous", "env_ours"]
    if importlib.util.find_spec("torch") is not None:  # the baseline, never a dependency
        parts.append("env_torch")
    env = {k: v for k, v in os.environ.items()
           if k != "MPITENSOR_SECRET" and not k.startswith(("PMI_", "HYDRA_"))}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "startup_scale.py"), "--fake", "16",
         "--reps", "1", "--ranks", "", "--spread", "0.5", "--parts", ",".join(parts)],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "load average" in text and "commit" in text
    for part in parts:
        row = re.search(rf"^\s+{part}\s+16\s+(.*)$", text, re.M)
        assert row, f"no row for {part}:\n{text}"
        cells = row.group(1).split()
        assert len(cells) >= 5 and all(re.fullmatch(r"[0-9.]+", c) for c in cells), row.group(0)
        assert re.search(rf"^\s+fit {part} .*: b = ", text, re.M), text
    # 16 ranks on 2 hosts of 8: each host's first rank puts its address as one key (the
    # helper's vallen_max holds it) and gets both hosts' (its own too): 2 + 2 * 2
    row = re.search(r"^\s+mpi_init\s+16\s+(.*)$", text, re.M)
    assert row is not None
    assert row.group(1).split()[-2] == "6"  # node_req, before the load
    # every target is judged; at 16 ranks none has what it needs
    verdicts = re.findall(r"^  (MET|NOT MET|NOT RUN) +(.*)$", text, re.M)
    assert len(verdicts) == 5 and {v for v, _ in verdicts} == {"NOT RUN"}, text


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "startup_scale", ROOT / "benchmarks" / "startup_scale.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_targets_are_judged_with_their_load() -> None:
    bench = _bench()

    def med(**values: float):  # type: ignore[no-untyped-def]
        return dict(values, load_lo=1.5, load_hi=3.0, runs=3)

    meds = {"mpi_init": {1024: med(time=2.0), 4096: med(time=30.5)},
            "rendezvous": {1024: med(cpu=0.5), 2048: med(cpu=1.0)},
            "mpi_init_own": {1024: med(cpu=0.25), 2048: med(cpu=0.625)}}
    lines = bench.verdicts(meds)
    assert [line[2:9] for line in lines] == [
        "MET    ",  # 2.0 s: within 2 s
        "NOT MET",  # 30.5 s at 4,096 ranks
        "NOT MET",  # 0.5 s of CPU is not under 0.5 s
        "MET    ",  # 1.0 / 0.5 = 2.0 <= 2.5
        "MET    ",  # 0.625 / 0.25 = 2.5 <= 2.5
    ], lines
    assert all("median of 3; load average 1.5-3.0" in line for line in lines), lines
    assert "30.500" in lines[1] and "2.500" in lines[4], lines
    del meds["mpi_init"][4096]
    assert bench.verdicts(meds)[1].startswith("  NOT RUN"), bench.verdicts(meds)
