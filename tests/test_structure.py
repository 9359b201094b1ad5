"""The package's structure, checked: what importing it does, and how its groups compose.

See docs/architecture.md for the layers these tests hold in place.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

import mpitensor.distributed as dist
from mpitensor.backend import nccl_unavailable_reason
from mpitensor.distributed.backends.nccl import NCCLGroup

ROOT = Path(__file__).resolve().parent.parent


def test_import_does_not_start_mpi():
    """``import mpitensor`` (and every public subpackage) leaves MPI alone: MPI starts at
    ``init_process_group`` or first use, so a script that only builds tensors never calls
    MPI_Init (and never needs an MPI launcher or a working MPI)."""
    code = ("import sys, mpitensor, mpitensor.distributed, mpitensor.nn, mpitensor.optim, "
            "mpitensor.data, mpitensor.checkpoint, mpitensor.models, mpitensor.utils.data\n"
            "import mpitensor.nn.parallel\n"
            "mpitensor.distributed.is_nccl_available(); mpitensor.cupy_available()\n"
            "print(sorted(m for m in sys.modules if m.startswith('mpi4py.MPI')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def _fake_mpi_group() -> types.SimpleNamespace:
    g = types.SimpleNamespace(debug=False, timeout=30.0, stall_warn=15.0, seq=7, p2p_seq=2,
                              history=[None] * 16, diag=None, notices={}, notice_reqs=[],
                              ranks=(0,), global_rank=0, name="WORLD", world_size=1)

    def set_timeout(seconds: float) -> None:
        g.timeout = seconds
        g.stall_warn = seconds / 2

    g.set_timeout = set_timeout
    return g


def test_nccl_group_shares_state_with_its_mpi_group():
    """The NCCL group holds its MPI group; debug, timeout and counters are the MPI group's,
    so ``dist.set_debug`` reaches the operations that run over MPI (a bug while the NCCL group
    kept a copy of its own)."""
    inner = _fake_mpi_group()
    g = object.__new__(NCCLGroup)
    g.mpi_group = inner
    g._set_identity(inner.ranks, inner.global_rank, inner.name)
    dist._state.groups.add(g)
    was = dist.get_debug()
    try:
        dist.set_debug(True)
        assert inner.debug is True and g.debug is True
        dist.set_debug(False)
        assert inner.debug is False
    finally:
        dist._state.groups.discard(g)
        dist.set_debug(was)
    g.set_timeout(4.0)
    assert inner.timeout == 4.0 and g.timeout == 4.0 and g.stall_warn == 2.0
    assert g.seq == 7 and g.p2p_seq == 2
    g.seq = 8
    assert inner.seq == 8
    assert g.history is inner.history and g.notices is inner.notices
    assert "debug" not in g.__dict__ and "seq" not in g.__dict__


def test_nccl_group_half_built_has_no_recursion():
    g = object.__new__(NCCLGroup)
    with pytest.raises(AttributeError):
        g.all_to_all  # noqa: B018 - no mpi_group yet: a plain AttributeError


@pytest.mark.gpu
@pytest.mark.skipif(bool(nccl_unavailable_reason()), reason=nccl_unavailable_reason() or "ok")
def test_set_debug_reaches_a_real_nccl_group():
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("mpi")
    try:
        g = dist.new_group([0], backend="nccl")
        was = dist.get_debug()
        dist.set_debug(True)
        try:
            assert g.mpi_group.debug is True
        finally:
            dist.set_debug(was)
        dist.destroy_process_group(g)
    finally:
        if created:
            dist.destroy_process_group()


# ---------------------------------------------------------------------------- layers
# Each module's layer; a module imports only from its own layer or below (docs/architecture.md).
# Lazy (function-level) imports count: they are dependencies all the same.
LAYERS = [
    ("base", ["mpitensor._base", "mpitensor.errors", "mpitensor.backend", "mpitensor.dtypes",
              "mpitensor.futures"]),
    ("tensors", ["mpitensor.tensor", "mpitensor.autograd", "mpitensor._core", "mpitensor._ops",
                 "mpitensor.cuda", "mpitensor.accelerator", "mpitensor.backends",
                 "mpitensor.linalg", "mpitensor.fft", "mpitensor.special", "mpitensor.amp",
                 "mpitensor.cpu",
                 "mpitensor.jit", "mpitensor.onnx", "mpitensor.testing", "mpitensor.version",
                 "mpitensor.distributions", "mpitensor.sparse", "mpitensor.random",
                 "mpitensor.profiler", "mpitensor.signal",
                 "mpitensor._porting_notes"]),
    ("communication", ["mpitensor.distributed", "mpitensor.multiprocessing"]),
    ("training", ["mpitensor.nn", "mpitensor.optim", "mpitensor.data", "mpitensor.models",
                  "mpitensor.distributed.nn", "mpitensor.distributed.tensor",
                  "mpitensor.distributed._tensor",
                  "mpitensor.distributed.fsdp", "mpitensor.distributed.optim",
                  "mpitensor.distributed.checkpoint",
                  "mpitensor.checkpoint", "mpitensor.utils", "mpitensor.func",
                  "mpitensor.distributed.algorithms._checkpoint"]),
    ("entry points", ["mpitensor.run", "mpitensor.distributed.launch.__main__", "mpitensor.fx",
                      "mpitensor"]),
]


def _layer_of(module: str) -> int:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = module == p or module.startswith(p if p.endswith("_") else p + ".")
            if hit and len(p) > best:
                best, level = len(p), i
    assert level is not None, f"{module} is in no layer: add it to LAYERS"
    return level


def _import_graph() -> dict:
    """module -> the mpitensor modules it imports (module level and inside functions)."""
    import ast

    pkg = ROOT / "mpitensor"
    mods = {}
    for p in pkg.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    graph = {}
    for mod, p in mods.items():
        base = mod.split(".") if p.name == "__init__.py" else mod.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                stem = base[:len(base) - node.level + 1] if node.level else []
                head = ".".join(stem + ([node.module] if node.module else [])) if node.level \
                    else node.module
                names = [f"{head}.{a.name}" if f"{head}.{a.name}" in mods else head
                         for a in node.names]
            else:
                continue
            out |= {n for n in names if n in mods and n != mod}
        graph[mod] = out
    return graph


def _cycles(graph: dict) -> list:
    index: dict = {}
    low: dict = {}
    stack: list = []
    found: list = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_import_graph()) == []


def test_imports_point_down_the_layers():
    upward = []
    for mod, deps in sorted(_import_graph().items()):
        if mod == "mpitensor":
            continue  # the package itself re-exports every layer
        for dep in sorted(deps):
            # the package root counts too: it sits on top (mpitensor.version has __version__)
            if _layer_of(dep) > _layer_of(mod):
                upward.append(f"{mod} ({LAYERS[_layer_of(mod)][0]}) imports {dep} "
                              f"({LAYERS[_layer_of(dep)][0]})")
    assert upward == []


# ---------------------------------------------------------------------------- environment
@pytest.mark.parametrize("var, value, needle", [
    ("MPITENSOR_LOG", "LOUD", "MPITENSOR_LOG='LOUD' is not one of DEBUG, INFO, WARNING, ERROR, "
                              "CRITICAL"),
    ("MPITENSOR_DEBUG", "maybe", "MPITENSOR_DEBUG='maybe' is not a boolean; use 1/0"),
    ("MPITENSOR_NATIVE", "fast", "MPITENSOR_NATIVE='fast' is not a boolean; use 1/0"),
    ("MPITENSOR_TIMEOUT", "soon", "MPITENSOR_TIMEOUT='soon' is not a number of seconds"),
    ("MPITENSOR_CHECK_BYTES", "64k", "MPITENSOR_CHECK_BYTES='64k' is not a byte count"),
    ("MPITENSOR_CHECK_BYTES", "-1", "MPITENSOR_CHECK_BYTES='-1' must be a non-negative integer"),
    ("MPITENSOR_CONV_BAND_BYTES", "0", "MPITENSOR_CONV_BAND_BYTES='0' must be an integer of "
                                       "at least 1 or off"),
])
def test_malformed_switch_names_variable_and_values(var, value, needle):
    """A malformed MPITENSOR_* variable stops the import with one line naming the variable and
    the values it takes (MPITENSOR_LOG used to end in logging's 'Unknown level')."""
    out = subprocess.run([sys.executable, "-c", "import mpitensor"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120,
                         env={**__import__("os").environ, var: value})
    assert out.returncode != 0
    assert needle in out.stderr.strip().splitlines()[-1], out.stderr[-2000:]


def test_log_level_is_case_insensitive():
    out = subprocess.run([sys.executable, "-c", "import logging, mpitensor; "
                          "print(logging.getLogger('mpitensor').level)"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120,
                         env={**__import__("os").environ, "MPITENSOR_LOG": "debug"})
    assert out.returncode == 0 and out.stdout.strip() == "10", out.stderr


def test_malformed_exit_grace_warns_and_uses_the_default(monkeypatch, capsys):
    from mpitensor.distributed import launch

    monkeypatch.setenv("MPITENSOR_EXIT_GRACE", "two")
    assert launch.exit_grace(2.0) == 2.0
    assert "MPITENSOR_EXIT_GRACE='two' is not a number of seconds; using 2 s" in \
        capsys.readouterr().err
    monkeypatch.setenv("MPITENSOR_EXIT_GRACE", "0.5")
    assert launch.exit_grace(2.0) == 0.5


# ---------------------------------------------------------------------------- sizes
MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 80


def test_files_and_functions_stay_readable():
    """No module of the package is over 1,000 lines and no function over 80
    (docs/architecture.md, "Conventions"): a longer one is split by meaning."""
    import ast

    long_files, long_functions = [], []
    for p in sorted((ROOT / "mpitensor").rglob("*.py")):
        text = p.read_text()
        rel = p.relative_to(ROOT).as_posix()
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert long_files == []
    assert long_functions == []
