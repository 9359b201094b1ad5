"""``python -m mpitensor.distributed.launch``: torch's older launcher, with the name changed.

Each rank's script gets ``--local-rank=N`` as its first argument (N its ``LOCAL_RANK``) unless
``--use-env`` is given, and the launcher warns that it is deprecated; the options are
``mpitensor-run``'s. Where torch is installed, its own ``python -m torch.distributed.launch``
is run on the same script as the oracle. Every launch has a hard timeout and leaves nothing
running.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from .launch import run_job

TIMEOUT = 90.0

SCRIPT = """\
import os
import sys

sys.stdout.write(f"rank {os.environ['RANK']} local {os.environ['LOCAL_RANK']} "
                 f"argv {sys.argv[1:]!r}\\n")
sys.stdout.flush()
"""


def _argv_by_rank(out: str) -> Dict[int, List[str]]:
    """``{rank: argv}`` from the lines the script printed (the local rank must match)."""
    seen: Dict[int, List[str]] = {}
    for line in out.splitlines():
        if not line.startswith("rank "):
            continue
        _, rank, _, local, _, argv = line.split(" ", 5)
        assert local == rank, line  # one node: the local rank is the rank
        seen[int(rank)] = ast.literal_eval(argv)
    return seen


def _launch(tmp_path: Path, *options: str) -> tuple:
    script = tmp_path / "show_argv.py"
    script.write_text(SCRIPT)
    return run_job([sys.executable, "-m", "mpitensor.distributed.launch", *options,
                    str(script), "a", "--flag"], TIMEOUT, cwd=tmp_path)


def test_each_rank_gets_its_local_rank_as_the_first_argument(tmp_path: Path) -> None:
    code, out, err, _ = _launch(tmp_path, "--nproc-per-node", "2")
    assert code == 0, err
    assert _argv_by_rank(out) == {r: [f"--local-rank={r}", "a", "--flag"] for r in range(2)}, \
        out + err
    assert "FutureWarning" in err and "mpitensor-run" in err, err


@pytest.mark.parametrize("flag", ["--use-env", "--use_env"])
def test_use_env_leaves_the_arguments_alone(tmp_path: Path, flag: str) -> None:
    code, out, err, _ = _launch(tmp_path, "-n", "2", flag)
    assert code == 0, err
    assert _argv_by_rank(out) == {r: ["a", "--flag"] for r in range(2)}, out + err


def test_use_env_is_refused_by_mpitensor_run(tmp_path: Path) -> None:
    """torchrun has no --use-env (it always uses the environment): neither has mpitensor-run."""
    script = tmp_path / "show_argv.py"
    script.write_text(SCRIPT)
    code, out, err, _ = run_job([sys.executable, "-m", "mpitensor.run", "-n", "1", "--use-env",
                                 str(script)], TIMEOUT, cwd=tmp_path)
    assert code == 2, out + err
    assert "unrecognized argument: --use-env" in err, err


def test_matches_torchs_older_launcher(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed: no oracle to compare with")
    script = tmp_path / "show_argv.py"
    script.write_text(SCRIPT)
    for options in ([], ["--use-env"]):
        theirs = run_job([sys.executable, "-m", "torch.distributed.launch",
                          "--nproc-per-node", "1", *options, str(script), "a", "--flag"],
                         TIMEOUT, cwd=tmp_path)
        ours = _launch(tmp_path, "-n", "1", *options)
        assert theirs[0] == 0 and ours[0] == 0, theirs[2] + ours[2]
        assert _argv_by_rank(ours[1]) == _argv_by_rank(theirs[1]), theirs[1] + ours[1]
