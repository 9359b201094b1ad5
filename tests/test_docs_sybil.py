"""The documentation as tests: every command and snippet of README.md, docs/ and
examples/README.md runs, through Sybil, and its output is compared with the doc's.

Sybil (https://sybil.readthedocs.io) finds the fenced blocks and the ``<!-- skip: next
"reason" -->`` markers; the repository's ``conftest.py`` hands it the Markdown files, so
``python -m pytest`` runs them (``python -m pytest README.md docs examples/README.md`` runs
only them). What this module adds is how a block runs:

- ``console``: each ``$ command`` runs in ``bash`` and what it prints on stdout is compared
  with the lines under it, if any (every command must exit 0 unless the block is marked
  ``<!-- docs-test: exit N -->``; ``<!-- docs-test: stderr -->``: the lines are what it
  prints on stderr). Lines printed by several ranks may come in any order, so
  a command that starts ranks (``mpiexec``, ``mpitensor-run``, ``torchrun``, ``spawn``) is
  compared as a multiset of lines. ``...`` in an expected line stands for any text.
- ``bash``: every command runs, in order, and must exit 0; the doc shows no output to compare.
- ``python``: a snippet whose first line is ``# name.py`` is written to that file, for the
  commands after it to run; any other snippet runs as a file of its own, ``python snippet.py``
  (a fresh process: mpitensor's MPI never starts inside the test run), and must exit 0.
- ``<!-- docs-test: numbers within 2% -->`` before a console block: the transcript of a
  training run, whose last digits depend on the BLAS kernel (another x86-64 CPU picks another
  OpenBLAS kernel and rounds differently); each number then matches within that relative
  tolerance, and everything else exactly. Throughputs are shown as ``...``.

Each document runs in a sandbox of its own: a temporary directory ``main/`` holding links to
the repository's ``examples``, ``benchmarks``, ``tools``, ``hostfiles`` and ``tests``, and a
``shared`` beside it that links to ``../shared`` (where the MNIST test set is), so commands
run "from the repository root" as written and their checkpoints and downloads land in the
sandbox, which is removed afterwards. ``train.py`` there is ``examples/train.py`` (the
launching docs' generic program). The network is kept out of MNIST downloads
(``MPITENSOR_MNIST_MIRRORS`` at a closed local port), so a missing data set falls back to
Digits at once, as it does on an offline machine. ``MPITENSOR_DOCS_TIMEOUT`` (seconds,
default 300) bounds each command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import pytest

from .launch import clean_env

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = float(os.environ.get("MPITENSOR_DOCS_TIMEOUT", "300"))
DOCS = ["README.md", "docs/*.md", "examples/README.md"]
LINKED = ["examples", "benchmarks", "tools", "hostfiles", "tests", "mpitensor"]
LAUNCHERS = ("mpiexec", "mpirun", "mpitensor-run", "torchrun", "srun")
OPTION = "docs-test"


# ------------------------------------------------------------------------------ comparison
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _to_float(text: str) -> float:
    return float(text.replace(",", ""))


def line_matches(expected: str, got: str, rel: Optional[float] = None) -> bool:
    """Whether ``got`` is the line ``expected`` shows: ``...`` stands for any text; with
    ``rel``, each number of ``expected`` matches a number of ``got`` within that relative
    tolerance (and the text between the numbers exactly)."""
    expected, got = expected.rstrip(), got.rstrip()
    if expected == got:
        return True
    parts = expected.split("...")
    if rel is None:
        pattern = ".*".join(re.escape(p) for p in parts)
        return re.fullmatch(pattern, got) is not None
    pieces: List[str] = []
    wanted: List[str] = []
    for i, part in enumerate(parts):
        at = 0
        for m in _NUMBER.finditer(part):
            pieces.append(re.escape(part[at:m.start()]))
            pieces.append(f"({_NUMBER.pattern})")
            wanted.append(m.group())
            at = m.end()
        pieces.append(re.escape(part[at:]))
        if i < len(parts) - 1:
            pieces.append(".*")
    m = re.fullmatch("".join(pieces), got)
    if m is None:
        return False
    for want, have in zip(wanted, m.groups()):
        a, b = _to_float(want), _to_float(have)
        if abs(a - b) > rel * max(abs(a), abs(b)) and a != b:
            return False
    return True


def outputs_match(expected: List[str], got: List[str], any_order: bool,
                  rel: Optional[float] = None) -> bool:
    """Line by line, in order, or (``any_order``) as a multiset of lines."""
    if len(expected) != len(got):
        return False
    if not any_order:
        return all(line_matches(e, g, rel) for e, g in zip(expected, got))
    left = list(got)
    # the most specific lines first, so that a line with ``...`` takes what is left
    for e in sorted(expected, key=lambda line: line.count("...")):
        hit = next((i for i, g in enumerate(left) if line_matches(e, g, rel)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


# ------------------------------------------------------------------------------ blocks
def console_commands(source: str) -> List[Tuple[str, List[str]]]:
    """``(command, expected output lines)`` for each ``$ `` line of a console block."""
    runs: List[Tuple[str, List[str]]] = []
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if line.strip():
                raise ValueError(f"console block: output before any command: {line!r}")
            i += 1
            continue
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        out: List[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith("$ "):
            out.append(lines[i])
            i += 1
        while out and not out[-1].strip():
            out.pop()
        runs.append((command, out))
    return runs


def bash_commands(source: str) -> List[str]:
    """The commands of a bash block (continuation lines joined; comments stay for bash)."""
    commands: List[str] = []
    pending = ""
    for line in source.splitlines():
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1]
            continue
        if line.strip() and not line.strip().startswith("#"):
            commands.append(line)
    return commands


def _starts_ranks(command: str) -> bool:
    words = re.findall(r"[\w./-]+", command.split("#")[0])
    return any(Path(w).name in LAUNCHERS for w in words) or "spawn" in command


# ------------------------------------------------------------------------------ running
def _sandbox() -> Path:
    top = Path(tempfile.mkdtemp(prefix="mpitensor-docs-"))
    main = top / "main"
    main.mkdir()
    for name in LINKED:
        if (ROOT / name).exists():
            (main / name).symlink_to(ROOT / name)
    (main / "train.py").symlink_to(ROOT / "examples" / "train.py")
    if (ROOT.parent / "shared").exists():
        (top / "shared").symlink_to(ROOT.parent / "shared")
    return main


def _env() -> Dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    env = clean_env({"MPITENSOR_DATA_DIR": None, "PYTHONUNBUFFERED": None,
                     # an offline machine: MNIST's download fails at once (a closed port)
                     "MPITENSOR_MNIST_MIRRORS": "http://127.0.0.1:9/"})
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


#: results of commands that run the repository's examples and read nothing the docs wrote:
#: the same command in two documents (README.md and examples/README.md show the same runs)
#: runs once a session
_RUNS: Dict[str, subprocess.CompletedProcess] = {}


def run_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``bash -c command`` in ``cwd`` under the timeout; its whole process group is killed on
    a timeout (the ranks of a launcher included)."""
    shared = re.search(r"\bexamples/\w+\.py\b", command) is not None and ">" not in command
    if shared and command in _RUNS:
        return _RUNS[command]
    done = _run(command, cwd)
    if shared:
        _RUNS[command] = done
    return done


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"`{command}` ran past {TIMEOUT:.0f} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _where(example: Any) -> str:
    return f"{Path(example.path).relative_to(ROOT)}:{example.line}"


def _options(example: Any) -> Dict[str, str]:
    """The ``<!-- docs-test: ... -->`` options given for this block (then forgotten)."""
    return example.namespace.pop("_docs_test_next", {})


def _expected_exit(options: Dict[str, str]) -> int:
    return int(options.get("exit", "0"))


def evaluate_console(example: Any) -> None:
    options = _options(example)
    rel = None
    if "numbers within" in options:
        rel = float(options["numbers within"].rstrip("%")) / 100
    cwd = example.namespace["sandbox"]
    for command, expected in console_commands(example.parsed):
        done = run_command(command, cwd)
        want = _expected_exit(options)
        assert done.returncode == want, (
            f"{_where(example)}: `{command}` exited {done.returncode} (the doc expects {want})"
            f"\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")
        if not expected:
            continue
        got = [ln.rstrip() for ln in
               (done.stderr if "stderr" in options else done.stdout).splitlines()]
        while got and not got[-1]:
            got.pop()
        assert outputs_match(expected, got, _starts_ranks(command), rel), (
            f"{_where(example)}: `{command}` printed what the doc does not show"
            + (f" (numbers within {rel:.0%})" if rel else "")
            + "\n--- the doc\n" + "\n".join(expected) + "\n--- this run\n" + "\n".join(got)
            + f"\n--- stderr\n{done.stderr[-2000:]}")


def evaluate_bash(example: Any) -> None:
    options = _options(example)
    cwd = example.namespace["sandbox"]
    for command in bash_commands(example.parsed):
        done = run_command(command, cwd)
        want = _expected_exit(options)
        assert done.returncode == want, (
            f"{_where(example)}: `{command}` exited {done.returncode} (the doc expects {want})"
            f"\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")


def evaluate_python(example: Any) -> None:
    options = _options(example)
    cwd: Path = example.namespace["sandbox"]
    source: str = example.parsed
    first = source.splitlines()[0].strip() if source.strip() else ""
    named = re.fullmatch(r"#\s*([\w.-]+\.py)", first)
    if named:  # a file the commands after it run
        (cwd / named.group(1)).write_text(source)
        return
    path = cwd / f"snippet_{example.line}.py"
    path.write_text(source)
    done = run_command(f"{sys.executable} {path.name}", cwd)
    want = _expected_exit(options)
    assert done.returncode == want, (
        f"{_where(example)}: the snippet exited {done.returncode} (the doc expects {want})"
        f"\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")


def parse_options(text: str) -> Dict[str, str]:
    """``numbers within 2%, stderr, exit 1`` -> {"numbers within": "2%", "stderr": "",
    "exit": "1"}."""
    found: Dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = item.rpartition(" ")
        if not key:  # a flag
            key, value = value, ""
        found[key] = value
    return found


# ------------------------------------------------------------------------------ Sybil
def _options_parser() -> Any:
    """Sybil parser for ``<!-- docs-test: OPTIONS -->``, which applies to the next block."""
    from sybil import Region
    from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

    lexer = DirectiveInHTMLCommentLexer(OPTION)

    def remember(example: Any) -> None:
        example.namespace["_docs_test_next"] = parse_options(example.parsed)

    def parse(document: Any) -> Iterable[Any]:
        for lexed in lexer(document):
            yield Region(lexed.start, lexed.end, lexed.lexemes["arguments"], remember)

    return parse


def _setup(namespace: Dict[str, Any]) -> None:
    namespace["sandbox"] = _sandbox()


def _teardown(namespace: Dict[str, Any]) -> None:
    shutil.rmtree(namespace["sandbox"].parent, ignore_errors=True)


def sybil() -> Any:
    """The Sybil that collects the docs (used by the repository's conftest.py)."""
    from sybil import Sybil
    from sybil.parsers.markdown import CodeBlockParser, SkipParser

    return Sybil(
        parsers=[SkipParser(), _options_parser(),
                 CodeBlockParser("console", evaluate_console),
                 CodeBlockParser("bash", evaluate_bash),
                 CodeBlockParser("python", evaluate_python)],
        patterns=DOCS, path=str(ROOT), setup=_setup, teardown=_teardown)


# ------------------------------------------------------------------------------ the comparison
@pytest.mark.parametrize("expected, got, rel, ok", [
    ("Rank 0 has data tensor(1.)", "Rank 0 has data tensor(1.)", None, True),
    ("epoch 1/5: ..., 7 samples/s", "epoch 1/5: loss 1, 7 samples/s", None, True),
    ("accuracy 97.20% (1944/2000)", "accuracy 97.10% (1942/2000)", None, False),
    ("accuracy 97.20% (1944/2000)", "accuracy 97.10% (1942/2000)", 0.02, True),
    ("accuracy 97.20% (1944/2000)", "accuracy 90.10% (1802/2000)", 0.02, False),
    ("loss 0.9822, ... samples/s", "loss 0.9830, 6,858 samples/s", 0.02, True),
    ("loss 0.9822, held-out", "loss 0.9822, held out", 0.02, False),
    ("step 25: loss 1.92680466", "step 25: loss 1.92680466 extra", None, False),
])
def test_line_matches(expected: str, got: str, rel: Optional[float], ok: bool) -> None:
    assert line_matches(expected, got, rel) is ok


def test_any_order_is_a_multiset() -> None:
    assert outputs_match(["a 1", "a 0"], ["a 0", "a 1"], any_order=True)
    assert not outputs_match(["a 1", "a 1"], ["a 0", "a 1"], any_order=True)
    assert not outputs_match(["a 1", "a 0"], ["a 0", "a 1"], any_order=False)


def test_console_commands_split_commands_and_output() -> None:
    source = "$ mpiexec -n 2 \\\n   python x.py\nline 1\nline 2\n\n$ python y.py\n"
    assert console_commands(source) == [("mpiexec -n 2  python x.py", ["line 1", "line 2"]),
                                        ("python y.py", [])]
