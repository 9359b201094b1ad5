"""Run every example under ``mpiexec`` and check the line printed by every rank.

Each launch has a hard timeout (``tests/launch.py`` kills the whole process group). Lines of
different ranks may interleave, so a run's output is compared with the expected lines as a
multiset: every rank must print exactly its documented line(s), and nothing else may appear.
Tensor values are written the way PyTorch prints them (``tensor(4.)``, ``tensor([ 8, 12])``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import pytest

from .launch import mpiexec_run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TIMEOUT = float(os.environ.get("MPITENSOR_EXAMPLE_TIMEOUT", "60"))
GLOO_NOTICE = "backend 'gloo' runs on mpitensor's MPI path (same API and results)"
# Each launch costs 0.5-2 s here (mostly importing NumPy on every rank), so by default each
# example runs at the sizes that take other code paths than examples/README.md's commands,
# which tests/test_docs_sybil.py runs as written (mostly at 4 ranks) and compares with the
# README's output; MPITENSOR_EXAMPLES_FULL=1 runs every example at every world size here too.
FULL = os.environ.get("MPITENSOR_EXAMPLES_FULL", "") not in ("", "0")


def sizes(*default: int, minimum: int = 1) -> List[int]:
    """World sizes to run an example at: ``default``, or all of ``minimum..4`` in full mode."""
    return list(range(minimum, 5)) if FULL else list(default)


# ----------------------------------------------------------------------------- helpers
def _env() -> Dict[str, str]:
    # examples import mpitensor from the checkout, wherever pytest was started
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def run_example(n: int, name: str, *args: str) -> List[str]:
    """Run ``mpiexec -n n python examples/name args``; assert it succeeded; return its lines."""
    proc = mpiexec_run(n, [sys.executable, str(EXAMPLES / name), *args], timeout=TIMEOUT,
                       env=_env(), cwd=ROOT)
    assert not proc.timed_out, f"{name} at {n} ranks hung (> {TIMEOUT}s):\n{proc.output}"
    assert proc.returncode == 0, f"{name} at {n} ranks exited {proc.returncode}:\n{proc.output}"
    return [line.rstrip() for line in proc.output.splitlines() if line.strip()]


_RANK = re.compile(r"\brank (\d+)\b", re.IGNORECASE)


def _by_rank(lines: Sequence[str]) -> Dict[Optional[int], List[str]]:
    out: Dict[Optional[int], List[str]] = {}
    for line in lines:
        m = _RANK.search(line)
        out.setdefault(int(m.group(1)) if m else None, []).append(line)
    return out


def assert_lines(lines: Sequence[str], expected: Sequence[str]) -> None:
    """Each rank printed exactly its expected lines, in order, and nothing else appeared.

    Ranks' lines may interleave, but one rank's own lines keep their order.
    """
    got, want = Counter(lines), Counter(expected)
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"missing lines: {sorted(missing.elements())}\nunexpected lines: "
        f"{sorted(extra.elements())}\nfull output:\n" + "\n".join(lines))
    assert _by_rank(lines) == _by_rank(expected), "lines of a rank out of order:\n" + "\n".join(
        lines)


def t_float(*values: float) -> str:
    """torch's repr of a 1-d float32 tensor of whole numbers: ``tensor([ 6., 12.])``."""
    return _t([f"{int(v)}." for v in values])


def t_scalar(value: float) -> str:
    """torch's repr of a 0-d float32 tensor of a whole number: ``tensor(4.)``."""
    return f"tensor({int(value)}.)"


def t_int(*values: int) -> str:
    """torch's repr of an int64 tensor: ``tensor([0, 4])``, ``tensor([ 8, 12])``."""
    return _t([str(int(v)) for v in values])


def _t(items: List[str]) -> str:
    width = max(len(s) for s in items)
    return "tensor([" + ", ".join(s.rjust(width) for s in items) + "])"


def without_gloo_notice(lines: Sequence[str]) -> List[str]:
    """Drop mpitensor's one-time notice for ``backend="gloo"`` (rank 0, stderr; at most once)."""
    notices = [line for line in lines if GLOO_NOTICE in line]
    assert len(notices) <= 1, lines
    return [line for line in lines if GLOO_NOTICE not in line]


# ----------------------------------------------------------------------------- world size
@pytest.mark.parametrize("name, suggested_n", [
    ("p2p_blocking.py", 2), ("p2p_nonblocking.py", 2), ("batch_isend_irecv.py", 4),
    ("subgroup_allreduce.py", 4),
])
def test_needs_two_ranks(name: str, suggested_n: int) -> None:
    """Launched on one rank, the example says why in one line (rank 0) and exits with code 2."""
    proc = mpiexec_run(1, [sys.executable, str(EXAMPLES / name)], timeout=TIMEOUT, env=_env(),
                       cwd=ROOT)
    assert not proc.timed_out, proc.output
    assert proc.returncode == 2, f"{name} exited {proc.returncode}:\n{proc.output}"
    lines = without_gloo_notice([line for line in proc.output.splitlines() if line.strip()])
    assert lines == [f"{name} needs at least 2 ranks, got 1: "
                     f"run `mpiexec -n {suggested_n} python examples/{name}`"], proc.output


# ----------------------------------------------------------------------------- hello
@pytest.mark.parametrize("n", sizes(2))
def test_hello(n: int) -> None:
    assert_lines(run_example(n, "hello.py"), [f"Hello from rank {r} of {n}" for r in range(n)])


def test_hello_plain_python() -> None:
    """Without mpiexec, the program is a world of one rank."""
    env = {**os.environ, **_env()}
    for key in [k for k in env if k.startswith(("PMI_", "HYDRA_", "MPI_LOCALNRANKS"))]:
        del env[key]
    proc = subprocess.run([sys.executable, str(EXAMPLES / "hello.py")], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["Hello from rank 0 of 1"]
    assert proc.stderr == ""


# ----------------------------------------------------------------------------- point-to-point
@pytest.mark.parametrize("n", sizes(3, minimum=2))
def test_p2p_blocking(n: int) -> None:
    lines = without_gloo_notice(run_example(n, "p2p_blocking.py"))
    assert_lines(lines, [f"Rank {r} has data {t_scalar(1 if r < 2 else 0)}" for r in range(n)])


@pytest.mark.parametrize("n", sizes(4, minimum=2))
def test_p2p_nonblocking(n: int) -> None:
    expected = ["Rank 0 started sending", "Rank 1 started receiving"]  # each before its wait
    expected += [f"Rank {r} has data {t_scalar(1 if r < 2 else 0)}" for r in range(n)]
    assert_lines(run_example(n, "p2p_nonblocking.py"), expected)


@pytest.mark.parametrize("n", sizes(2, minimum=2))
def test_batch_isend_irecv(n: int) -> None:
    expected = [f"Rank {r} has data {t_float(2 * ((r - 1) % n), 2 * ((r - 1) % n) + 1)}"
                for r in range(n)]
    assert_lines(run_example(n, "batch_isend_irecv.py"), expected)


@pytest.mark.parametrize("n", sizes(1, 3))
def test_ring_allreduce(n: int) -> None:
    total = n * (n + 1) // 2
    want = t_float(total, 2 * total)
    expected = [f"Rank {r} has data {want} (dist.all_reduce: {want})" for r in range(n)]
    assert_lines(run_example(n, "ring_allreduce.py"), expected)


# ----------------------------------------------------------------------------- collectives
def _list(items: List[str]) -> str:
    return "[" + ", ".join(items) + "]"


COLLECTIVE_LINES: Dict[str, Callable[[int, int], str]] = {
    # name -> (rank, world size) -> the rest of the line after "[name] Rank r "
    "broadcast": lambda r, n: f"has data {t_scalar(42)}",
    "all_reduce": lambda r, n: f"has data {t_scalar(n)}",
    "reduce": lambda r, n: f"has data {t_scalar(n if r == 0 else 1)}",
    "scatter": lambda r, n: f"has data {t_scalar(r + 1)}",
    "gather": lambda r, n: (f"has data {_list([t_float(i) for i in range(n)])}" if r == 0
                            else f"sent {t_float(r)}"),
    "all_gather": lambda r, n: f"has data {_list([t_float(i) for i in range(n)])}",
    "reduce_scatter": lambda r, n: f"has data {t_int(n * 2 * r, n * (2 * r + 1))}",
    "all_to_all": lambda r, n: f"has data {_list([t_int(r + j * n) for j in range(n)])}",
    "all_gather_into_tensor": lambda r, n: f"has data {t_int(*range(1, 2 * n + 1))}",
    "reduce_scatter_tensor": lambda r, n: f"has data {t_int(n * 2 * r, n * (2 * r + 1))}",
    "all_to_all_single": lambda r, n: f"has data {t_int(*[r + j * n for j in range(n)])}",
}


def collective_lines(n: int, names: Optional[Sequence[str]] = None) -> List[str]:
    return [f"[{name}] Rank {r} {COLLECTIVE_LINES[name](r, n)}"
            for name in (names or COLLECTIVE_LINES) for r in range(n)]


def test_collective_expectations_match_the_docs() -> None:
    """The documented 4-rank values (the tutorial's and the torch docs'), spelled out."""
    lines = collective_lines(4)
    for line in [
        "[all_reduce] Rank 3 has data tensor(4.)",
        "[reduce] Rank 0 has data tensor(4.)",
        "[scatter] Rank 2 has data tensor(3.)",
        "[gather] Rank 0 has data [tensor([0.]), tensor([1.]), tensor([2.]), tensor([3.])]",
        "[all_to_all] Rank 1 has data [tensor([1]), tensor([5]), tensor([9]), tensor([13])]",
        "[all_to_all_single] Rank 0 has data tensor([ 0,  4,  8, 12])",
        "[reduce_scatter] Rank 1 has data tensor([ 8, 12])",
    ]:
        assert line in lines


@pytest.mark.parametrize("n", sizes(1, 2, 3, 4))
def test_collectives(n: int) -> None:
    assert_lines(run_example(n, "collectives.py"), collective_lines(n))


def test_collectives_async_op() -> None:
    assert_lines(run_example(4, "collectives.py", "--async-op"), collective_lines(4))


def test_collectives_subset() -> None:
    names = ["scatter", "all_to_all"]
    assert_lines(run_example(1, "collectives.py", *names), collective_lines(1, names))


def test_collectives_unknown_name() -> None:
    proc = mpiexec_run(1, [sys.executable, str(EXAMPLES / "collectives.py"), "allreduce"],
                       timeout=TIMEOUT, env=_env(), cwd=ROOT)
    assert not proc.timed_out and proc.returncode == 2, proc.output
    lines = [line for line in proc.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown collective(s) allreduce" in lines[0], proc.output


@pytest.mark.parametrize("n", sizes(2, minimum=2))
def test_subgroup_allreduce(n: int) -> None:
    expected = [f"Rank {r} has data {t_scalar(2 if r < 2 else 1)}" for r in range(n)]
    assert_lines(run_example(n, "subgroup_allreduce.py"), expected)


@pytest.mark.parametrize("n", sizes(1))
def test_object_collectives(n: int) -> None:
    objects = ["foo", 12, {1: 2}, ("bar", 3.5)]
    mine = [objects[r % 4] for r in range(n)]
    expected = []
    for r in range(n):
        expected += [
            f"[all_gather_object] Rank {r} has data {mine}",
            f"[broadcast_object_list] Rank {r} has data {objects[:3]}",
            f"[gather_object] Rank {r} has data {mine if r == 0 else None}",
            f"[scatter_object_list] Rank {r} has data {[mine[r]]}",
        ]
        if n >= 2:
            expected.append(f"[send_object_list] Rank {r} has data "
                            f"{objects[:3] if r < 2 else [None, None, None]}")
    assert_lines(run_example(n, "object_collectives.py"), expected)


# ----------------------------------------------------------------------------- averaging
@pytest.mark.parametrize("n", sizes(3))
def test_gradient_averaging(n: int) -> None:
    """Each rank's averaged gradient is the full-batch MSE gradient, worked out here by hand."""
    x = np.arange(36, dtype=np.float64).reshape(12, 3) / 10
    y = np.stack([x.sum(1) - 1.0, 2.0 * x[:, 0] - x[:, 2]], axis=1)
    w = np.array([[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]])
    b = np.array([0.05, -0.05])
    diff = x @ w.T + b - y
    dw = 2 * diff.T @ x / diff.size          # d mean((xW^T + b - y)^2) / dW
    db = 2 * diff.sum(0) / diff.size
    share = 12 // n
    assert_lines(run_example(n, "gradient_averaging.py"),
                 [f"Rank {r} (samples {r * share}-{(r + 1) * share - 1}): averaged weight.grad "
                  f"{np.round(dw, 4).tolist()} bias.grad {np.round(db, 4).tolist()} == "
                  "full-batch gradient: ok" for r in range(n)])


# ----------------------------------------------------------------------------- tour
def _tour_fmt(xs: Sequence[float]) -> str:
    return "[" + " ".join(f"{x:g}" for x in xs) + "]" if len(xs) > 1 else f"{xs[0]:g}"


def _tour_expected(n: int) -> Dict[str, List[str]]:
    """Row label -> the value column of each rank, for world size ``n``."""
    fmt = _tour_fmt
    rows = {
        "send/recv 0 -> 1": ["1" if r < 2 else "0" for r in range(n)],
        "isend/irecv 0 -> 1": ["2" if r < 2 else "0" for r in range(n)],
        "broadcast 42 from 0": ["42"] * n,
        "all_reduce SUM of 1": [str(n)] * n,
        "all_reduce AVG of r": [f"{(n - 1) / 2:g}"] * n,
        "reduce SUM of 1 to 0": [str(n)] + ["1"] * (n - 1),
        f"scatter 1..{n} from 0": [str(r + 1) for r in range(n)],
        "gather r to 0": [fmt(range(n))] + ["-"] * (n - 1),
        "all_gather r": [fmt(range(n))] * n,
        f"reduce_scatter arange({2 * n})": [fmt([n * 2 * r, n * (2 * r + 1)]) for r in range(n)],
        f"all_to_all arange({n}) + {n}r": [fmt([r + j * n for j in range(n)]) for r in range(n)],
        "new_group([0, 1]) all_reduce": ["2" if r < 2 else "1" for r in range(n)],
        "barrier": ["ok"] * n,
    }
    if n < 2:
        for label in ("send/recv 0 -> 1", "isend/irecv 0 -> 1", "new_group([0, 1]) all_reduce"):
            del rows[label]
    return rows


@pytest.mark.parametrize("n", sizes(1, 3))
def test_tour(n: int) -> None:
    """Rank 0's table: one row per operation, one column per rank, every check ``ok``."""
    lines = run_example(n, "tour.py")
    rows = _tour_expected(n)
    assert lines[0] == f"mpitensor collectives tour: {n} rank{'' if n == 1 else 's'}, " \
                       "backend mpi", lines
    header = [c.strip() for c in lines[1].split("|")]
    assert header == ["operation (input on rank r)", *[f"rank {r}" for r in range(n)],
                      "check"], lines[1]
    body = [[c.strip() for c in line.split("|")] for line in lines[2:-1]]
    assert {cells[0]: cells[1:] for cells in body} == {
        label: [*want, "ok"] for label, want in rows.items()}, "\n".join(lines)
    assert len(body) == len(rows), lines
    assert lines[-1] == f"all {len(rows)} operations agree with torch.distributed on every rank"
