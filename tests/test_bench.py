"""``mpitensor.distributed.bench``: the CLI runs under mpiexec; its JSON is complete and consistent.

Functional only: no assertion here depends on how fast anything is.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from mpitensor.distributed import bench

from .launch import mpiexec_run

ROOT = Path(__file__).resolve().parent.parent
SIZES = [4, 16, 64, 256, 1024]


def test_helpers() -> None:
    assert bench.parse_size("4") == 4
    assert bench.parse_size("1K") == bench.parse_size("1KiB") == 1024
    assert bench.parse_size("64M") == 64 << 20
    with pytest.raises(ValueError):
        bench.parse_size("lots")
    assert bench.sweep_sizes(4, 1024, 4) == SIZES
    assert bench.sweep_sizes(4, 64 << 20)[-1] == 64 << 20
    assert bench.format_size(4) == "4 B" and bench.format_size(1 << 20) == "1 MiB"
    assert bench.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bench.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bench.bus_factor("broadcast", 4) == 1.0
    assert bench.element_count("all_gather", 4, 4, 2) == 2  # whole elements, split evenly
    assert bench.element_count("all_reduce", 4, 8, 2) == 1


def test_line_writer_writes_one_element_of_every_line() -> None:
    np = pytest.importorskip("numpy")
    for dtype in ("float32", "float64", "int8", "complex128"):
        a = np.ones(1000, dtype)
        bench.line_writer(a)()
        step = max(1, bench.LINE // a.itemsize)
        hit = np.zeros(a.size, bool)
        hit[::step] = True
        assert (a[hit] == 0).all() and (a[~hit] == 1).all(), dtype
        # every 64-byte stretch of the buffer holds one written element
        assert hit.sum() == -(-a.nbytes // max(bench.LINE, a.itemsize)), dtype


def test_fresh_mode_takes_the_writes_own_time_out(monkeypatch) -> None:
    """mode fresh: touch() before each call; a batch of touches alone is timed after and
    taken out, so a call that costs nothing measures about nothing, whatever touch costs."""
    calls = {"fn": 0, "touch": 0}
    now = [0.0]  # a clock of our own: a busy machine's preemptions cannot enter the sum

    def fn() -> None:
        calls["fn"] += 1

    def touch() -> None:
        calls["touch"] += 1
        now[0] += 2e-4

    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    t = bench.time_rep(fn, None, "fresh", 20, barrier=lambda: None, touch=touch)
    assert calls == {"fn": 20, "touch": 40}
    assert abs(t) < 1e-12, t  # each touch takes 200 µs; the calls none
    assert bench.modes_of("both") == bench.BOTH and bench.modes_of("all") == bench.MODES
    assert bench.modes_of("fresh") == ("fresh",)
    with pytest.raises(ValueError):
        bench.time_rep(fn, None, "sometimes", 1, barrier=lambda: None)


def test_fresh_mode_under_mpiexec(tmp_path: Path) -> None:
    out = tmp_path / "fresh.json"
    args = [sys.executable, "-m", "mpitensor.distributed.bench", "--ops",
            "all_reduce,broadcast,all_gather,p2p_bw", "--max-bytes", "64K", "--min-bytes", "1K",
            "--factor", "4", "--reps", "2", "--rep-time", "0.002", "--warmup", "2",
            "--mode", "fresh", "--json", str(out)]
    proc = mpiexec_run(2, args, timeout=60, cwd=ROOT)
    assert not proc.timed_out, proc.output[-4000:]
    assert proc.returncode == 0, proc.output[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["mode"] for r in rows} == {"fresh"}
    assert {(r["op"], r["size"]) for r in rows} == {
        (op, s) for op in ("all_reduce", "broadcast", "all_gather", "p2p_bw")
        for s in (1024, 4096, 16384, 65536)}
    assert all(math.isfinite(r["latency_us"]) for r in rows)


def test_cli_json_under_mpiexec(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "mpitensor.distributed.bench", "--max-bytes", "1024",
            "--factor", "4", "--reps", "2", "--rep-time", "0.002", "--warmup", "2",
            "--json", str(out)]
    proc = mpiexec_run(2, args, timeout=60, cwd=ROOT)
    assert not proc.timed_out, f"mpitensor.distributed.bench hung:\n{proc.output[-4000:]}"
    assert proc.returncode == 0, proc.output[-4000:]
    assert proc.output.count("latency(us)") == 1, "the table must be printed by rank 0 only"

    data = json.loads(out.read_text())
    assert data["settings"]["ranks"] == 2
    assert data["settings"]["sizes"] == SIZES
    assert {"cpu", "nproc", "mpi_library", "numpy"} <= set(data["machine"])
    rows = data["rows"]
    seen = {(r["op"], r["size"], r["mode"]) for r in rows}
    expected = {(op, s, m) for op in bench.OPS for s in SIZES for m in bench.BOTH}
    assert seen == expected, f"missing rows: {sorted(expected - seen)}"
    assert len(rows) == len(expected)
    for r in rows:
        where = f"{r['op']} {r['size']} {r['mode']}"
        assert r["ranks"] == 2 and r["dtype"] == "float32", where
        assert r["bytes"] == r["count"] * 4 and r["bytes"] >= r["size"], where
        assert r["iters"] >= 1 and r["reps"] == 2, where
        assert math.isfinite(r["latency_us"]) and r["latency_us"] > 0, where
        assert r["algbw_GBps"] > 0, where
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["latency_us"] / 1e3), where
        factor = bench.bus_factor(r["op"], 2)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor), where
    split = [r for r in rows if r["op"] in ("all_gather", "reduce_scatter", "all_to_all")]
    assert all(r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] / 2) for r in split)


@pytest.mark.parametrize("bad", [
    ["--ops", "all_reduce,nope"],
    ["--max-bytes", "0"],
    ["--min-bytes", "1M", "--max-bytes", "1K"],
    ["--reps", "0"],
    ["--mode", "sometimes"],
    ["--dtype", "float8"],
    ["--rep-time", "-1"],
])
def test_bad_arguments_exit_2(bad: list, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(bad)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mpitensor-bench: error:") and "\n" not in err, err


def test_bad_argument_under_mpiexec_one_line() -> None:
    proc = mpiexec_run(2, [sys.executable, "-m", "mpitensor.distributed.bench", "--ops", "nope"],
                       timeout=60, cwd=ROOT)
    assert not proc.timed_out and proc.returncode == 2, proc.output
    lines = [ln for ln in proc.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown op 'nope'" in lines[0], proc.output


def test_cuda_without_cupy_is_a_clear_error(capsys: pytest.CaptureFixture) -> None:
    from mpitensor.backend import cupy_unavailable_reason

    if not cupy_unavailable_reason():
        pytest.skip("CuPy and a GPU are present: --device cuda is valid here")
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--device", "cuda"])
    assert exc.value.code == 2
    assert "--device cuda is unavailable" in capsys.readouterr().err


def _compare_collectives(monkeypatch):  # type: ignore[no-untyped-def]
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    monkeypatch.syspath_prepend(str(root / "benchmarks"))  # (its folder, as when run)
    spec = importlib.util.spec_from_file_location(
        "compare_collectives", root / "benchmarks" / "compare_collectives.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, root


def test_compare_collectives_keeps_the_sections_written_by_hand(tmp_path: Path,
                                                               monkeypatch) -> None:
    """A rerun of the report keeps every section between its ``by hand`` markers, once, at
    its anchor (``targets``: after the targets; an anchor it has no place for: at the end),
    and a second rerun changes nothing; the checked-in report's sections are all marked."""
    cc, root = _compare_collectives(monkeypatch)
    doc = tmp_path / "report.md"
    doc.write_text("# an older report\n\n## Targets\n| old |\n\n"
                   "<!-- by hand: targets -->\n## Mine\ntext a\n<!-- end by hand -->\n\n"
                   "<!-- by hand: copy -->\n**Why** text b\n<!-- end by hand -->\n"
                   "<!-- by hand: elsewhere -->\ntext c\n")  # (left open: to the end)
    meta = {"machine": {}, "date": "today", "command": "cmd", "ranks": 2, "dtype": "float32",
            "array": "numpy", "sizes": [4, 1 << 20], "factor": 2, "reps": 3, "rep_time": 0.01,
            "window": 8}
    cc.write_markdown(doc, [], meta, [], None)
    out = doc.read_text()
    for text in ("## Mine\ntext a", "**Why** text b", "text c"):
        assert out.count(text) == 1, out
    assert out.splitlines().count(cc.HAND_END) == 3 and "| old |" not in out
    assert out.index("## Targets (2 ranks") < out.index("## Mine") < out.index("## Reading")
    assert out.index("## Reading") < out.index("**Why** text b") < out.index("text c")
    cc.write_markdown(doc, [], meta, [], None)
    assert doc.read_text() == out
    kept = cc.hand_sections((root / "docs" / "benchmarks-collectives.md").read_text())
    assert sorted(kept) == ["copy", "targets"]
    assert "## Mid sizes on a quiet machine" in kept["targets"][0]
    assert "**Why all_gather stays near 1x raw" in kept["copy"][0]


def test_small_collectives_prints_every_row_and_the_boards_copy() -> None:
    """``benchmarks/small_collectives.py`` (docs/benchmarks-collectives.md's board tables):
    every operation at every size asked, one table from rank 0, and what the board's posts
    copy with (timed where the ranks have cores of their own)."""
    args = [sys.executable, str(ROOT / "benchmarks" / "small_collectives.py"), "--sizes",
            "16,4K", "--reps", "2", "--calls", "20"]
    proc = mpiexec_run(2, args, timeout=120, cwd=ROOT)
    assert not proc.timed_out, f"small_collectives.py hung:\n{proc.output[-4000:]}"
    assert proc.returncode == 0, proc.output[-4000:]
    rows = [line for line in proc.output.splitlines() if line.startswith("| ")
            and not line.startswith("| op")]
    ops = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")
    assert sorted((r.split(" | ")[0][2:], r.split(" | ")[1]) for r in rows) == sorted(
        (op, size) for op in ops for size in ("16 B", "4096 B")), proc.output[-4000:]
    assert proc.output.count("board posts: ") == 1, proc.output[-4000:]


def test_every_benchmark_starts_mpi_with_mpitensors_settings() -> None:
    """A benchmark that imports ``mpi4py.MPI`` imports ``mpitensor`` first: MPI starts at that
    import, with MPICH's algorithms for the non-blocking calls as ``import mpitensor`` sets
    them (``_base/mpi_import.py``), as in a user's program. (Imported the other way round, a
    reduce-scatter that fell back to MPI's non-blocking call ran 4-8x slower than what users
    get, and was reported so.)"""
    import ast

    wrong = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        first_mpi = first_ours = None
        for node in ast.parse(path.read_text()).body:  # module level, in order
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.split(".")[0] == "mpitensor" and first_ours is None:
                    first_ours = node.lineno
                if name.startswith("mpi4py") and first_mpi is None:
                    first_mpi = node.lineno
        if first_mpi is not None and (first_ours is None or first_ours > first_mpi):
            wrong.append(path.name)
    assert not wrong, wrong
