"""The test harness's launched processes write each line whole (``tests/_site/
sitecustomize.py``, put on ``PYTHONPATH`` by ``tests/launch.py``): four ranks printing long
lines at once into the one pipe ``mpiexec`` gives them never run into each other, which
under ``PYTHONUNBUFFERED=1`` alone they did (a print's text and its newline went out in two
writes; fresh-clone CI failed on that four times)."""

from __future__ import annotations

import sys
from pathlib import Path

from .launch import mpiexec_run

PROGRAM = """
from mpi4py import MPI
r = MPI.COMM_WORLD.rank
MPI.COMM_WORLD.Barrier()
for i in range(300):
    print("RESULT " + "x" * 200 + f" {r} {i}")
"""


def test_ranks_printing_at_once_never_share_a_line(tmp_path: Path) -> None:
    script = tmp_path / "lines.py"
    script.write_text(PROGRAM)
    proc = mpiexec_run(4, [sys.executable, str(script)], timeout=120)
    assert proc.returncode == 0 and not proc.timed_out, proc.output[-2000:]
    lines = [line for line in proc.output.splitlines() if "RESULT" in line]
    assert len(lines) == 4 * 300
    broken = [line for line in lines
              if line.count("RESULT") != 1 or not line.startswith("RESULT ")
              or len(line.split()) != 4]
    assert not broken, broken[:3]
    seen = sorted((int(line.split()[2]), int(line.split()[3])) for line in lines)
    assert seen == [(r, i) for r in range(4) for i in range(300)]
