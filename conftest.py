"""The documentation's commands and snippets as tests (``tests/test_docs_sybil.py``).

This file sits at the repository root so that Sybil sees README.md, docs/*.md and
examples/README.md, which ``testpaths`` in pyproject.toml names beside ``tests``.
"""

from tests.test_docs_sybil import sybil

pytest_collect_file = sybil().pytest()
