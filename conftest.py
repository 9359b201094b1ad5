"""The documentation's commands and snippets as tests (``tests/test_docs_sybil.py``).

This file sits at the repository root so that Sybil sees README.md, docs/*.md and
examples/README.md, which ``testpaths`` in pyproject.toml names beside ``tests``.
"""

try:
    import sybil  # noqa: F401 - the test extra's; without it the docs are not collected
except ImportError:  # pragma: no cover - said in the header of every run instead
    def pytest_report_header(config):
        return "docs not tested: Sybil is missing (pip install -e '.[test]')"
else:
    from tests.test_docs_sybil import sybil as _docs

    pytest_collect_file = _docs().pytest()
