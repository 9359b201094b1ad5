"""MPICH's algorithms for the non-blocking collectives, set before MPI starts (issue 29).

``mpitensor._base.mpi_import`` sets :data:`MPICH_ALGORITHMS` in the environment just before
the first import of ``mpi4py.MPI`` runs ``MPI_Init``, where the environment names none and
``MPITENSOR_MPI_ALGORITHMS`` is not ``off``. The collective suites under ``tests/mpi`` run
with them (their conftest imports mpitensor first), which checks the values they give.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mpitensor._base import mpi_import

NAMES = sorted(mpi_import.MPICH_ALGORITHMS)
PROBE = ("import json, os, mpitensor\n"
         "from mpi4py import MPI\n"
         "assert MPI.Is_initialized()\n"
         f"print(json.dumps({{k: os.environ.get(k) for k in {NAMES!r}}}))\n")


def _probe(extra: dict, code: str = PROBE) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MPIR_CVAR_") and k != mpi_import.ENV_ALGORITHMS}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_table_names_mpich_variables():
    assert NAMES
    for name, value in mpi_import.MPICH_ALGORITHMS.items():
        assert name.startswith("MPIR_CVAR_I") and name.endswith("_INTRA_ALGORITHM")
        assert value and value == value.strip()


def test_set_where_unset():
    env = {NAMES[0]: "auto"}  # the user's choice
    added = mpi_import.set_algorithms(env)
    assert env[NAMES[0]] == "auto" and NAMES[0] not in added
    for name in NAMES[1:]:
        assert env[name] == added[name] == mpi_import.MPICH_ALGORITHMS[name]


def test_blank_counts_as_unset():
    env = {name: " " for name in NAMES}
    assert mpi_import.set_algorithms(env) == mpi_import.MPICH_ALGORITHMS
    assert env == mpi_import.MPICH_ALGORITHMS


@pytest.mark.parametrize("value", ["off", "OFF", " Off "])
def test_off_sets_nothing(monkeypatch, value):
    monkeypatch.setenv(mpi_import.ENV_ALGORITHMS, value)
    env: dict = {}
    assert mpi_import.set_algorithms(env) == {} and env == {}


def test_malformed_switch_is_refused(monkeypatch):
    monkeypatch.setenv(mpi_import.ENV_ALGORITHMS, "fast")
    with pytest.raises(ValueError, match="MPITENSOR_MPI_ALGORITHMS='fast' is not one of AUTO, OFF"):
        mpi_import.set_algorithms({})


def test_mpi_starts_with_them_after_import_mpitensor():
    assert _probe({}) == mpi_import.MPICH_ALGORITHMS


def test_the_users_choice_and_off_are_kept():
    mine = {NAMES[0]: "auto"}
    seen = _probe(mine)
    assert seen[NAMES[0]] == "auto"
    assert all(seen[n] == mpi_import.MPICH_ALGORITHMS[n] for n in NAMES[1:])
    assert _probe({mpi_import.ENV_ALGORITHMS: "off"}) == {n: None for n in NAMES}


def test_mpi4py_imported_first_is_left_alone():
    code = "import mpi4py.MPI\n" + PROBE
    assert _probe({}, code) == {n: None for n in NAMES}
