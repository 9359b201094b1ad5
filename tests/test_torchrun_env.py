"""torchrun's contract: its options on ``mpitensor-run``, its variables on every rank.

A torchrun-style script reads ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` from its first line; under
``mpitensor-run`` each rank sees its own values before the script starts, and under plain
``mpiexec`` ``init_process_group`` sets them. ``init_process_group`` takes the rank and world
size of torch's recipes and refuses contradicting ones on every rank. Every launch has a hard
timeout and leaves nothing running.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

import mpitensor.distributed as dist
from mpitensor.distributed import launch
from mpitensor.distributed.launch import RankLayout, layout_from_env, rank_env
from mpitensor.run import main as run_main

from .launch import find_mpiexec, run_job

TIMEOUT = 90.0
VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")
RUN_VARS = VARS + ("GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
                   "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                   "TORCHELASTIC_USE_AGENT_STORE")

TORCHRUN_SCRIPT = """\
import os
import sys

# the way torchrun scripts start: the variables are there before anything else
local_rank = int(os.environ["LOCAL_RANK"])
rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
names = {names!r}
seen = " ".join(f"{{k}}={{os.environ.get(k)}}" for k in names)

import mpitensor.distributed as dist

dist.init_process_group("gloo", init_method="env://")
assert (dist.get_rank(), dist.get_world_size()) == (rank, world_size)
# one write per line, so that hydra's forwarding cannot split it
sys.stdout.write(f"rank {{rank}} {{seen}} args {{sys.argv[1:]}}\\n")
sys.stdout.flush()
"""


def _script(tmp_path: Path, names: Sequence[str] = RUN_VARS) -> Path:
    p = tmp_path / "train.py"
    p.write_text(TORCHRUN_SCRIPT.format(names=tuple(names)))
    return p


def _launch(tmp_path: Path, *args: str) -> Tuple[int, str, str]:
    code, out, err, _ = run_job([sys.executable, "-m", "mpitensor.run", *args], TIMEOUT,
                                cwd=tmp_path)
    return code, out, err


def _rows(out: str) -> Dict[int, Dict[str, str]]:
    """rank -> {variable: value, "args": ...} from the script's lines."""
    rows = {}
    for line in out.splitlines():
        m = re.fullmatch(r"rank (\d+) (.*) args (.*)", line)
        if m:
            pairs = dict(kv.split("=", 1) for kv in m.group(2).split())
            pairs["args"] = m.group(3)
            rows[int(m.group(1))] = pairs
    return rows


def _expected(rank: int, n: int, **over: str) -> Dict[str, str]:
    values = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
              "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0",
              "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_NAME": "default",
              "ROLE_WORLD_SIZE": str(n), "TORCHELASTIC_MAX_RESTARTS": "0",
              "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False"}
    values.update(over)
    return values


# ----------------------------------------------------------------------------- mpitensor-run

def test_torchrun_command_line_with_the_name_changed(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 train.py --lr 0.1` as `mpitensor-run ...`: every rank reads
    its own values at the top of the script."""
    script = _script(tmp_path)
    code, out, err = _launch(tmp_path, "--nproc-per-node", "2", str(script), "--lr", "0.1")
    assert code == 0, err
    rows = _rows(out)
    assert sorted(rows) == [0, 1], out + err
    for r in (0, 1):
        assert rows[r] == {**_expected(r, 2), "args": "['--lr', '0.1']"}, out


def test_torchrun_options_reach_the_ranks(tmp_path: Path) -> None:
    script = _script(tmp_path)
    code, out, err = _launch(tmp_path, "--nproc_per_node=3", "--nnodes=1", "--node_rank=0",
                             "--master_addr=127.0.0.2", "--master_port", "29511",
                             "--rdzv-backend", "c10d", "--rdzv_id=job7", "--max-restarts=0",
                             str(script))
    assert code == 0, err
    rows = _rows(out)
    assert rows == {r: {**_expected(r, 3, MASTER_ADDR="127.0.0.2", MASTER_PORT="29511",
                                    TORCHELASTIC_RUN_ID="job7"), "args": "[]"}
                    for r in range(3)}, out + err


def test_standalone_picks_a_free_port(tmp_path: Path) -> None:
    script = _script(tmp_path, ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"))
    code, out, err = _launch(tmp_path, "--standalone", "--nproc-per-node=2", str(script))
    assert code == 0, err
    rows = _rows(out)
    assert sorted(rows) == [0, 1], out + err
    assert rows[0] == rows[1]  # one job-wide value on every rank
    assert rows[0]["MASTER_ADDR"] == "127.0.0.1"
    assert 1024 <= int(rows[0]["MASTER_PORT"]) <= 65535
    assert re.fullmatch(r"[0-9a-f]{32}", rows[0]["TORCHELASTIC_RUN_ID"])


def _dry(capsys: pytest.CaptureFixture, *args: str) -> Tuple[int, str, str]:
    code = run_main([*args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    p = tmp_path / "s.py"
    p.write_text("print('hi')\n")
    return p


def test_dry_runs(script: Path, capsys: pytest.CaptureFixture,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    mpiexec, py = launch.find_mpiexec(), sys.executable
    worker = f"{py} -m mpitensor.run --_worker"
    code, out, err = _dry(capsys, "--nproc-per-node", "2", "--dry-run", str(script), "--lr",
                          "0.1")
    assert (code, err) == (0, "")
    assert out == f"{mpiexec} -n 2 {worker} {script} --lr 0.1\n"
    # the same as -n 2, which it may repeat
    assert _dry(capsys, "-n", "2", "--nproc_per_node=2", "--dry-run", str(script))[1] == \
        f"{mpiexec} -n 2 {worker} {script}\n"
    # on a hostfile: one rank count per node, every node by default
    hf = script.parent / "hosts"
    hf.write_text("n1:4\nn2:4\n")
    for extra in ([], ["--nnodes", "2"], ["--nnodes=2:2"], ["--ppn", "2"]):
        code, out, err = _dry(capsys, "--hostfile", str(hf), "--nproc-per-node", "2", *extra,
                              "--dry-run", str(script))
        assert code == 0, err
        assert out == f"{mpiexec} -f {hf} -n 4 -ppn 2 {worker} {script}\n", extra
    code, out, err = _dry(capsys, "--hostfile", str(hf), "--nnodes", "1", "--nproc-per-node",
                          "3", "--dry-run", str(script))
    assert out == f"{mpiexec} -f {hf} -n 3 -ppn 3 {worker} {script}\n"
    # --nnodes alone: torchrun's one process per node
    assert _dry(capsys, "--hostfile", str(hf), "--nnodes", "2", "--dry-run",
                str(script))[1] == f"{mpiexec} -f {hf} -n 2 -ppn 1 {worker} {script}\n"
    # job-wide values travel on the bootstrap's command line (it reaches every node)
    code, out, err = _dry(capsys, "--nproc-per-node", "1", "--master-addr", "10.0.0.1",
                          "--master-port", "1234", "--rdzv-id", "x", "--dry-run", str(script))
    assert out == (f"{mpiexec} -n 1 {worker} --_env MASTER_ADDR=10.0.0.1 --_env "
                   f"MASTER_PORT=1234 --_env TORCHELASTIC_RUN_ID=x {script}\n")
    for endpoint, env in (("[::1]:29400", "MASTER_ADDR=::1 --_env MASTER_PORT=29400"),
                          ("node7", "MASTER_ADDR=node7"),
                          ("node7:29400", "MASTER_ADDR=node7 --_env MASTER_PORT=29400")):
        code, out, err = _dry(capsys, "--rdzv-endpoint", endpoint, "--rdzv-backend=c10d",
                              "--nproc-per-node", "1", "--dry-run", str(script))
        assert out == f"{mpiexec} -n 1 {worker} --_env {env} {script}\n", endpoint
    # --master-* win over the endpoint
    code, out, err = _dry(capsys, "--rdzv-endpoint", "a:1", "--master-port", "2",
                          "--nproc-per-node", "1", "--dry-run", str(script))
    assert out == f"{mpiexec} -n 1 {worker} --_env MASTER_ADDR=a --_env MASTER_PORT=2 {script}\n"
    # --module: torchrun's spelling of -m
    code, out, err = _dry(capsys, "--nproc-per-node", "2", "--dry-run", "--module", "json")
    assert out == f"{mpiexec} -n 2 {worker} -m json\n"
    # with an allocation, several nodes need no hostfile (the MPI reads the allocation)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert _dry(capsys, "--nnodes", "2", "--nproc-per-node", "2", "--dry-run",
                str(script))[1] == f"{mpiexec} -n 4 -ppn 2 {worker} {script}\n"


@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", "0"], "argument --nproc-per-node: must be a positive number of "
                                "ranks, got 0"),
    (["--nproc_per_node=two"], "argument --nproc_per_node: invalid int value: 'two'"),
    (["--max_restarts=-1"], "argument --max_restarts: must be at least 0, got -1"),
    (["--node-rank", "1"], "argument --node-rank: got 1, but mpitensor-run starts the ranks of "
                           "every node from one command"),
    (["--nnodes", "4:1"], "argument --nnodes: 4:1 gives MIN > MAX; write MIN:MAX with "
                          "MIN <= MAX"),
    (["--nnodes", "0"], "argument --nnodes: must be a positive number of nodes, got 0"),
    (["--nnodes", "2", "--nproc-per-node", "2"], "argument --nnodes: 2 nodes need --hostfile "
                                                 "FILE naming them"),
    (["--nnodes", "3", "--hostfile", "{hf}"], "argument --nnodes: 3 nodes, but hostfile {hf} "
                                              "names 2 host(s)"),
    (["-n", "3", "--nproc-per-node", "2"], "argument -n: 3 ranks contradicts --nnodes 1 x "
                                           "--nproc-per-node 2 = 2"),
    (["--hostfile", "{hf}", "--ppn", "3", "--nproc-per-node", "2"],
     "argument --ppn: 3 contradicts --nproc-per-node 2"),
    (["--standalone", "--nnodes", "2"], "argument --standalone: runs on one node, but --nnodes "
                                        "is 2"),
    (["--master-port", "70000"], "argument --master-port: must be between 0 and 65535, got "
                                 "70000"),
    (["--rdzv-endpoint", ":29400"], "argument --rdzv-endpoint: expected HOST[:PORT], got "
                                    "':29400'"),
    (["--master-addr="], "argument --master-addr: expected a non-empty value"),
])
def test_bad_torchrun_input_is_one_line_and_exit_2(args: List[str], message: str, script: Path,
                                                    capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID", "PE_HOSTFILE"):
        monkeypatch.delenv(var, raising=False)
    hf = script.parent / "hosts"
    hf.write_text("n1:2\nn2:2\n")
    code, out, err = _dry(capsys, *[a.format(hf=hf) for a in args], str(script))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mpitensor-run: error: " + message.format(hf=hf)), err


# ----------------------------------------------------------------------------- the variables

def test_layout_from_each_launchers_variables() -> None:
    hydra = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert layout_from_env(hydra) == RankLayout(3, 4, 1, 2, None, None)  # nodes: ask MPI
    assert layout_from_env({**hydra, "MPI_LOCALNRANKS": "4", "MPI_LOCALRANKID": "3"}) == \
        RankLayout(3, 4, 3, 4, 0, 1)
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
            "OMPI_COMM_WORLD_NODE_RANK": "2"}
    assert layout_from_env(ompi) == RankLayout(2, 3, 2, 3, 0, 1)
    mv2 = {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "1",
           "MV2_COMM_WORLD_LOCAL_RANK": "0", "MV2_COMM_WORLD_LOCAL_SIZE": "1"}
    assert layout_from_env(mv2) == RankLayout(0, 1, 0, 1, 0, 1)
    srun = {"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1",
            "SLURM_NODEID": "2", "SLURM_STEP_NUM_NODES": "3",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2),3"}
    assert layout_from_env(srun) == RankLayout(5, 7, 1, 3, 2, 3)
    # hydra inside an allocation: the allocation's SLURM_* describe another launch
    inside = {**hydra, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "0", "SLURM_NNODES": "1"}
    assert layout_from_env(inside) == RankLayout(3, 4, 1, 2, None, None)
    assert layout_from_env({}) == RankLayout()
    assert layout_from_env({"PMI_RANK": "x"}) == RankLayout()


def test_rank_env_from_the_launchers_variables() -> None:
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    env = rank_env({"MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "r"}, hydra)
    assert env == _expected(1, 2, MASTER_PORT="1234", TORCHELASTIC_RUN_ID="r")


ASK_MPI = """\
import sys
from mpitensor.distributed.launch import rank_env
env = rank_env({}, environ={})   # no launcher variable: MPI is asked
sys.stdout.write("rank " + env["RANK"] + " " + " ".join(f"{k}={v}" for k, v in env.items())
                 + " args []\\n")
"""


def test_rank_env_asks_mpi_where_the_launcher_says_nothing(tmp_path: Path) -> None:
    prog = tmp_path / "ask.py"
    prog.write_text(ASK_MPI)
    code, out, err, _ = run_job([find_mpiexec(), "-n", "3", sys.executable, str(prog)],
                                TIMEOUT, cwd=tmp_path)
    assert code == 0, err
    assert _rows(out) == {r: {**_expected(r, 3), "args": "[]"} for r in range(3)}, out + err


PLAIN = """\
import os
import sys
names = {names!r}
before = sorted(k for k in names if k in os.environ)
import mpitensor.distributed as dist

dist.init_process_group("mpi", rank=0, world_size=0)        # torch's MPI recipe
seen = " ".join(f"{{k}}={{os.environ.get(k)}}" for k in names)
r, n = dist.get_rank(), dist.get_world_size()
dist.destroy_process_group()
dist.init_process_group("gloo", rank=r, world_size=n)        # the tutorials' form
dist.destroy_process_group()
dist.init_process_group(backend="mpi", rank=-1, world_size=-1)
sys.stdout.write(f"rank {{r}} {{seen}} args {{before}}\\n")
"""


def test_plain_mpiexec_gets_the_variables_at_init(tmp_path: Path) -> None:
    prog = tmp_path / "plain.py"
    prog.write_text(PLAIN.format(names=VARS))
    code, out, err, _ = run_job([find_mpiexec(), "-n", "3", sys.executable, str(prog)],
                                TIMEOUT, cwd=tmp_path)
    assert code == 0, err
    want = {k: v for k, v in _expected(0, 3).items() if k in VARS}
    assert _rows(out) == {r: {**want, "RANK": str(r), "LOCAL_RANK": str(r), "args": "[]"}
                          for r in range(3)}, out + err


MISMATCH = """\
import sys
import mpitensor.distributed as dist
from mpi4py import MPI
r = MPI.COMM_WORLD.rank
for kwargs in ({{"world_size": 3}}, {{"rank": 1 - r, "world_size": 2}}):
    try:
        dist.init_process_group("gloo", **kwargs)
        sys.stdout.write(f"rank {{r}} accepted {{kwargs}}\\n")
    except ValueError as exc:
        sys.stdout.write(f"rank {{r}} {{exc}}\\n")
"""


def test_contradicting_rank_or_size_fails_on_every_rank(tmp_path: Path) -> None:
    prog = tmp_path / "mismatch.py"
    prog.write_text(MISMATCH.format())
    code, out, err, _ = run_job([find_mpiexec(), "-n", "2", sys.executable, str(prog)],
                                TIMEOUT, cwd=tmp_path)
    assert code == 0, err
    tail = "; drop the argument and let mpiexec set it, or launch with `mpiexec -n N`"
    assert sorted(out.splitlines()) == sorted(
        [f"rank {r} init_process_group: world_size=3 contradicts MPI, which says world_size "
         f"is 2 (rank {r} of 2){tail}" for r in (0, 1)]
        + [f"rank {r} init_process_group: rank={1 - r} contradicts MPI, which says rank is "
           f"{r} (rank {r} of 2){tail}" for r in (0, 1)]), out + err


def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in launch.LAUNCHER_RANK_VARS + VARS:
        monkeypatch.delenv(name, raising=False)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() != 1:
        pytest.skip("needs a process that is an MPI job of its own")


def test_world_of_one_started_without_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case of processes started by multiprocessing: a clear error, no hang, and the
    torch placeholders accepted; nothing is written into the environment of such a process
    (its children would inherit it)."""
    _no_launcher(monkeypatch)
    if dist.is_initialized():
        dist.destroy_process_group()
    with pytest.raises(ValueError) as info:  # they meet through MASTER_ADDR/MASTER_PORT,
        dist.init_process_group("gloo", rank=1, world_size=2)  # which are not set here
    assert str(info.value) == (
        "init_process_group: init_method='env://' with world_size=2: environment variable "
        "MASTER_ADDR expected, but not set. Set MASTER_ADDR and MASTER_PORT to rank 0's host "
        "and a free port in every process (or start the processes with mpiexec, mpitensor-run "
        "or mpitensor.multiprocessing.spawn, which need neither)")
    assert not dist.is_initialized()
    with pytest.raises(ValueError) as info:
        dist.init_process_group("gloo", rank=1)
    assert str(info.value) == (
        "init_process_group: rank=1 contradicts MPI, which says rank is 0 (rank 0 of 1): this "
        "process was started without an MPI launcher and given no world_size above 1, so it "
        "is a world of its own. For processes started by multiprocessing or by hand, pass "
        "world_size=N and each one's rank (they meet through MASTER_ADDR/MASTER_PORT, or "
        "init_method); or start all of them with `mpiexec -n N python script.py`, "
        "`mpitensor-run --nproc-per-node N script.py`, or mpitensor.multiprocessing.spawn")
    assert not dist.is_initialized()
    for kwargs in ({"rank": 0, "world_size": 0}, {"rank": 0, "world_size": 1}, {"rank": 0},
                   {"world_size": -1}):
        dist.init_process_group("mpi", **kwargs)
        try:
            assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
            assert [k for k in VARS if k in os.environ] == []
        finally:
            dist.destroy_process_group()
    for kwargs, bad in (({"rank": -2}, "rank=-2"), ({"world_size": -3}, "world_size=-3"),
                        ({"world_size": True}, "world_size=True")):
        with pytest.raises(ValueError, match=f"{bad} contradicts MPI"):
            dist.init_process_group("mpi", **kwargs)
