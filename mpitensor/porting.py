"""``python -m mpitensor.porting PATH...``: what a torch program needs that mpitensor lacks.

It reads each program without running it (its syntax tree), follows its imports and their
aliases (``import torch.nn as nn``, ``from torch import optim``, ``from torch.nn import
functional as F``, ``from torch.utils.data import DataLoader``), and looks every ``torch``
name the program uses up at the same path in mpitensor (``nn.LSTM`` -> ``mpitensor.nn.LSTM``).
It prints, with ``file:line``:

- ``missing``: a name mpitensor lacks (the exit status is then 1);
- ``different``: a name mpitensor has but treats otherwise, with the note of docs/porting.md;
- ``tensor method?``: an attribute called on some value, named like a method torch's Tensor has
  and mpitensor's lacks. Which values are tensors cannot be known without running the program,
  so these are reported apart; ``--strict`` counts them as missing.

Directories are searched for ``*.py`` files. ``--summary`` prints, over all the files, how many
use no missing name and the most-missed names.

Example::

    $ python -m mpitensor.porting train.py
    train.py:14: missing torch.nn.CTCLoss
    train.py:40: tensor method? .stft (torch.Tensor.stft)
    train.py: 1 missing name, 1 possible tensor method
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["Finding", "check_source", "check_paths", "main"]

_SNAPSHOT = Path(__file__).with_name("_torch_names.json")
_MISSING = object()


class Finding(collections.namedtuple("Finding", "path line kind name note")):
    """One report: ``kind`` is ``"missing"``, ``"different"`` or ``"tensor method?"``."""

    def __str__(self) -> str:
        if self.kind == "tensor method?":
            text = (f"{self.path}:{self.line}: tensor method? .{self.name} "
                    f"(torch.Tensor.{self.name})")
        else:
            text = f"{self.path}:{self.line}: {self.kind} {self.name}"
        return text + (f": {self.note}" if self.note else "")


def _tensor_only_methods() -> frozenset:
    """Methods and properties of torch's Tensor (the snapshot) that mpitensor's Tensor lacks."""
    from mpitensor.tensor import Tensor  # noqa: PLC0415 - the package's tensor, once loaded

    names = json.loads(_SNAPSHOT.read_text(encoding="utf-8"))["namespaces"]["torch.Tensor"]
    return frozenset(n for n in names["names"] if not hasattr(Tensor, n))


def resolve(torch_path: str) -> Any:
    """The mpitensor object at ``torch_path``'s place (``torch.nn.LSTM`` ->
    ``mpitensor.nn.LSTM``), or the sentinel ``_MISSING``."""
    parts = ["mpitensor", *torch_path.split(".")[1:]]
    obj: Any = None
    for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        except Exception:  # a module that fails to import is missing to the program
            return _MISSING
        for attr in parts[i:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _notes() -> Dict[str, str]:
    from mpitensor._porting_notes import ELSEWHERE, NOTES  # noqa: PLC0415

    out = dict(NOTES)
    out.update({k: f"at {where}: {how}" for k, (where, how) in ELSEWHERE.items()})
    return out


class _Uses(ast.NodeVisitor):
    """The torch paths a module uses (with their lines), and its other attribute names."""

    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}  # local name -> torch path
        self.paths: List[Tuple[int, str]] = []
        self.attributes: List[Tuple[int, str]] = []

    def visit_Import(self, node: ast.Import) -> None:  # noqa: N802 - ast's name
        for a in node.names:
            if a.name == "torch" or a.name.startswith("torch."):
                if a.asname:
                    self.aliases[a.asname] = a.name
                    self.paths.append((node.lineno, a.name))
                else:  # `import torch.nn` binds `torch`
                    self.aliases["torch"] = "torch"
                    self.paths.append((node.lineno, a.name))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # noqa: N802
        mod = node.module or ""
        if node.level or not (mod == "torch" or mod.startswith("torch.")):
            return
        for a in node.names:
            if a.name == "*":
                self.paths.append((node.lineno, mod))
                continue
            path = f"{mod}.{a.name}"
            self.aliases[a.asname or a.name] = path
            self.paths.append((node.lineno, path))

    def visit_Attribute(self, node: ast.Attribute) -> None:  # noqa: N802
        chain = []
        cur: Any = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name) and cur.id in self.aliases:
            self.paths.append((node.lineno, ".".join([self.aliases[cur.id], *reversed(chain)])))
            return  # the chain's inner attributes are part of this path
        self.attributes.append((node.lineno, node.attr))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:  # noqa: N802
        # a name bound by `from torch... import X` used bare: X(...) is checked at the import
        return


def check_source(source: str, path: str = "<string>", *, tensor_methods: Optional[frozenset]
                 = None) -> List[Finding]:
    """The findings for one program's source text (see the module's description)."""
    tree = ast.parse(source, filename=path)
    uses = _Uses()
    uses.visit(tree)
    notes = _notes()
    findings: List[Finding] = []
    seen: set = set()
    for line, p in uses.paths:
        if p in seen:
            continue
        seen.add(p)
        obj = resolve(p)
        if obj is _MISSING:
            findings.append(Finding(path, line, "missing", p, ""))
        elif p in notes:
            findings.append(Finding(path, line, "different", p, notes[p]))
    if tensor_methods is None:
        tensor_methods = _tensor_only_methods()
    named = set()
    for line, attr in uses.attributes:
        if attr in tensor_methods and attr not in named:
            named.add(attr)
            findings.append(Finding(path, line, "tensor method?", attr, ""))
    findings.sort(key=lambda f: (f.line, f.kind, f.name))
    return findings


def _files(paths: Iterable[str]) -> List[Path]:
    out: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.py") if q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return out


def check_paths(paths: Sequence[str]) -> Dict[str, List[Finding]]:
    """Findings per file for files and directories (searched for ``*.py``)."""
    methods = _tensor_only_methods()
    out: Dict[str, List[Finding]] = {}
    for f in _files(paths):
        try:
            source = f.read_text(encoding="utf-8", errors="replace")
            out[str(f)] = check_source(source, str(f), tensor_methods=methods)
        except SyntaxError as exc:
            out[str(f)] = [Finding(str(f), exc.lineno or 0, "unreadable", "",
                                   f"not Python 3 ({exc.msg})")]
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpitensor.porting",
        description="List the torch names a program uses that mpitensor lacks or treats "
                    "differently (read from the source; nothing is run).")
    ap.add_argument("paths", nargs="+", help="Python files or directories")
    ap.add_argument("--strict", action="store_true",
                    help="count possible tensor methods as missing names")
    ap.add_argument("--summary", action="store_true",
                    help="print the share of files with no missing name and the most missed")
    ap.add_argument("--quiet", action="store_true", help="print only the per-file totals")
    args = ap.parse_args(argv)
    try:
        results = check_paths(args.paths)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    bad = 0
    counter: collections.Counter = collections.Counter()
    for path, findings in results.items():
        missing = [f for f in findings if f.kind in ("missing", "unreadable")
                   or (args.strict and f.kind == "tensor method?")]
        maybe = [f for f in findings if f.kind == "tensor method?"]
        if not args.quiet:
            for f in findings:
                print(f)
        if missing:
            bad += 1
        counter.update({f.name or f.note for f in missing})
        print(f"{path}: {len(missing)} missing name{'s' * (len(missing) != 1)}, "
              f"{len(maybe)} possible tensor method{'s' * (len(maybe) != 1)}")
    if args.summary and results:
        total = len(results)
        print(f"\n{total - bad} of {total} files ({100 * (total - bad) / total:.0f} %) use no "
              f"missing name")
        for name, n in counter.most_common(30):
            print(f"{n:5d}  {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
