"""Regenerate the docs' transcripts of training runs from runs on this machine.

A console block marked ``<!-- docs-test: numbers within N% -->`` shows what a training command
printed; its last digits depend on the CPU's BLAS kernel, and ``tests/test_docs_sybil.py``
(part of ``python -m pytest``) fails when a run strays further than N % from them: the
transcript is stale. This script runs each such block's commands the way that test does (in
a sandbox, offline) and prints the fresh transcript, throughputs written ``...``; with
``--write`` it puts them into the files.

    python tools/doc_transcripts.py docs/training.md docs/rpc.md examples/README.md
    python tools/doc_transcripts.py --write docs/training.md
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_docs_sybil import _sandbox, console_commands, run_command  # noqa: E402

MARK = re.compile(r"<!-- docs-test: [^>]*numbers within [^>]*-->\n```console\n(.*?)```",
                  re.DOTALL)
THROUGHPUT = re.compile(r"\b[\d,]+(\.\d+)? samples/s")


def fresh(block: str, cwd: Path) -> Tuple[str, List[str]]:
    """The block with each command's output replaced by this run's; and the commands run."""
    out: List[str] = []
    commands = []
    for command, _old in console_commands(block):
        done = run_command(command, cwd)
        if done.returncode != 0:
            raise SystemExit(f"`{command}` exited {done.returncode}:\n{done.stderr[-3000:]}")
        commands.append(command)
        out.append(f"$ {command}")
        out += [THROUGHPUT.sub("... samples/s", line.rstrip())
                for line in done.stdout.splitlines() if line.strip()]
    return "\n".join(out) + "\n", commands


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("docs", nargs="+", type=Path, help="Markdown files")
    parser.add_argument("--write", action="store_true", help="update the files in place")
    args = parser.parse_args(argv)
    for doc in args.docs:
        text = doc.read_text()
        cwd = _sandbox()
        try:
            pieces, at = [], 0
            for m in MARK.finditer(text):
                new, commands = fresh(m.group(1), cwd)
                print(f"--- {doc}: {' ; '.join(commands)}\n{new}", end="")
                pieces += [text[at:m.start(1)], new]
                at = m.end(1)
            pieces.append(text[at:])
            if args.write:
                doc.write_text("".join(pieces))
        finally:
            shutil.rmtree(cwd.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
