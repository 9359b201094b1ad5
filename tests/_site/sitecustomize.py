"""Imported at start-up by every Python process the tests launch (``tests/launch.py``'s
``clean_env`` puts this folder on ``PYTHONPATH``): stdout and stderr write each line whole.

Under ``PYTHONUNBUFFERED=1`` (which the tests set, so that a process killed by a timeout
still shows what it printed) the text layer writes ``print``'s text and its newline in two
system calls, and the ranks of an ``mpiexec`` job share one pipe: two ranks printing at the
same moment ran into each other (``OKOK 1``, two JSON records on one line), which failed
fresh-clone CI runs four times. Line buffering with the text layer's own buffer writes each
line in one call, and still at once; ``flush()`` and ``print(..., flush=True)`` behave as
before.
"""

import sys

for _stream in (sys.stdout, sys.stderr):
    try:
        _stream.reconfigure(line_buffering=True, write_through=False)
    except (AttributeError, ValueError, OSError):  # not a text stream, or already closed
        pass
