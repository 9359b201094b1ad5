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
    assert row.group(1).split()[-1] == "6"
