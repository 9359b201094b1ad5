"""``python -m mpitensor.run``: the same as the ``mpitensor-run`` command."""

import sys

from . import main

sys.exit(main())
