"""``mpitensor.distributed`` in one process, without mpiexec (MPI's singleton world of size 1).

Setup and teardown of the default group, argument checks of ``init_process_group`` (rank and
world size against MPI, backend names, timeouts), the ``nccl`` backend without CuPy, calls made
before initialization, and the environment switches.
"""

from __future__ import annotations

import datetime
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpitensor.distributed as dist
from mpitensor._base import config as _config
from mpitensor.distributed.backends.nccl import nccl_unavailable_reason
from mpitensor.errors import MpiTensorError, NotInitializedError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_default_group():
    """Every test starts and ends without a default process group."""
    if dist.is_initialized():
        dist.destroy_process_group()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- before init
def _calls_before_init():
    x = np.ones(2)
    return [
        ("get_rank", lambda: dist.get_rank()),
        ("get_world_size", lambda: dist.get_world_size()),
        ("get_backend", lambda: dist.get_backend()),
        ("new_group", lambda: dist.new_group([0])),
        ("get_process_group_ranks", lambda: dist.get_process_group_ranks(None)),
        ("all_reduce", lambda: dist.all_reduce(x)),
        ("broadcast", lambda: dist.broadcast(x, src=0)),
        ("barrier", lambda: dist.barrier()),
        ("send", lambda: dist.send(x, dst=0)),
        ("irecv", lambda: dist.irecv(x)),
        ("all_gather_object", lambda: dist.all_gather_object([None], 1)),
        ("destroy_process_group", lambda: dist.destroy_process_group()),
    ]


@pytest.mark.parametrize("name,call", _calls_before_init(), ids=lambda v: v if isinstance(
    v, str) else "")
def test_calls_before_init_process_group(name, call):
    assert not dist.is_initialized()
    assert dist.group.WORLD is None
    with pytest.raises(NotInitializedError, match=r"(has not been|is not) initialized") as info:
        call()
    assert isinstance(info.value, MpiTensorError) and isinstance(info.value, RuntimeError)
    if name != "destroy_process_group":
        assert "call mpitensor.distributed.init_process_group() first" in str(info.value)


def test_availability():
    assert dist.is_available() and dist.is_mpi_available() and dist.is_gloo_available()
    assert dist.is_nccl_available() == (nccl_unavailable_reason() == "")


# ---------------------------------------------------------------------------- init and destroy
def test_init_destroy_and_reinit():
    dist.init_process_group("mpi")
    assert dist.is_initialized()
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "mpi"
    assert dist.group.WORLD is dist.GroupMember.WORLD is not None
    x = np.arange(3.0)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    np.testing.assert_array_equal(x, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="should not be the same as the rank"):
        dist.send(x, dst=0)
    dist.destroy_process_group()
    assert not dist.is_initialized() and dist.group.WORLD is None
    with pytest.raises(NotInitializedError):
        dist.destroy_process_group()
    dist.init_process_group()  # again, after destroy
    assert dist.get_world_size() == 1


def test_destroyed_groups_say_so():
    """A group used after destroy_process_group raises a clear error naming it (it was an
    AttributeError from deep inside), on the fast paths too, and for an old world handle."""
    dist.init_process_group("mpi")
    sub = dist.new_group([0])
    x = np.ones(3)
    dist.all_reduce(x, group=sub)
    dist.destroy_process_group(sub)
    calls = [lambda: dist.all_reduce(x, group=sub),
             lambda: dist.broadcast(x, src=0, group=sub),
             lambda: dist.all_gather_into_tensor(np.zeros(3), x, group=sub),
             lambda: dist.barrier(group=sub),
             lambda: dist.isend(x, dst=0, group=sub),
             lambda: dist.all_gather_object([None], 1, group=sub)]
    for call in calls:
        with pytest.raises(MpiTensorError, match=r"rank 0: \w+ on .*, which was destroyed "
                                                 r"\(destroy_process_group\); create a new "
                                                 r"group with new_group\(\)"):
            call()
    old = dist.group.WORLD
    dist.destroy_process_group()
    dist.init_process_group()
    with pytest.raises(MpiTensorError, match="all_reduce on WORLD, which was destroyed"):
        dist.all_reduce(x, group=old)
    dist.all_reduce(x)  # the new default group works
    assert (x == 1.0).all()


def test_init_twice():
    dist.init_process_group("mpi")
    with pytest.raises(RuntimeError, match="initialize the default process group twice; call "
                                           r"destroy_process_group\(\) first"):
        dist.init_process_group("mpi")
    assert dist.is_initialized()


def test_torch_arguments_are_accepted():
    dist.init_process_group(backend="mpi", init_method="env://", world_size=1, rank=0,
                            store=object(), group_name="g", timeout=datetime.timedelta(
                                seconds=30))
    assert dist.group.WORLD.timeout == 30.0


@pytest.mark.parametrize("kwargs,match", [
    ({"rank": 1}, r"rank=1 contradicts MPI, which says rank is 0 \(rank 0 of 1\)"),
    ({"world_size": -4}, r"world_size=-4 contradicts MPI, which says world_size is 1"),
    ({"rank": True}, r"rank=True contradicts MPI"),
    ({"rank": "0"}, r"rank='0' contradicts MPI"),
])
def test_rank_and_world_size_must_match_mpi(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        dist.init_process_group("mpi", **kwargs)
    assert "mpiexec -n N" in str(info.value)
    assert not dist.is_initialized()


@pytest.mark.parametrize("kwargs,match", [
    ({"world_size": 4}, r"world_size=4 but no rank for this process"),
    ({"rank": 0, "world_size": 2}, r"environment variable MASTER_ADDR expected, but not set"),
])
def test_world_size_above_one_asks_for_a_rendezvous(kwargs, match, monkeypatch):
    """A process no launcher started, given a world of several, meets the others through
    init_method (tests/test_rendezvous.py); what it lacks for that is said before any
    traffic."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "PMI_RANK",
                 "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=match):
        dist.init_process_group("mpi", **kwargs)
    assert not dist.is_initialized()


def test_rank_env_mismatch_is_logged(monkeypatch, caplog):
    monkeypatch.setenv("RANK", "3")
    with caplog.at_level(logging.WARNING, logger="mpitensor.distributed"):
        dist.init_process_group("mpi")
    assert "RANK=3 in the environment is ignored: MPI says this is rank 0" in caplog.text


@pytest.mark.parametrize("timeout", [0, -5, "soon", True, float("nan")])
def test_bad_timeout(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        dist.init_process_group("mpi", timeout=timeout)
    assert not dist.is_initialized()


# ---------------------------------------------------------------------------- backends
@pytest.mark.parametrize("backend,label", [
    (None, "mpi"), ("mpi", "mpi"), ("MPI", "mpi"), (" gloo ", "gloo"),
    ("cpu:gloo", "mpi"), ("cpu:mpi,cuda:mpi", "mpi"), ("cpu:gloo,cuda:gloo", "mpi"),
])
def test_backend_names(backend, label):
    dist.init_process_group(backend)
    assert dist.get_backend() == label
    assert dist.get_backend(dist.new_group([0])) == label
    x = np.ones(2, np.float32)
    dist.all_reduce(x)
    np.testing.assert_array_equal(x, [1.0, 1.0])


def test_gloo_alias_notice(monkeypatch, caplog):
    """One info line per process, not a warning: "gloo" is a name torch programs use."""
    monkeypatch.setattr(dist._state, "gloo_notice_given", False)
    with caplog.at_level(logging.INFO, logger="mpitensor.distributed"):
        dist.init_process_group("gloo")
        dist.destroy_process_group()
        dist.init_process_group("gloo")
    notices = [r for r in caplog.records if "runs on mpitensor's MPI path" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in notices] == [
        (logging.INFO, "backend 'gloo' runs on mpitensor's MPI path (same API and results)")]


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "NCCL"])
def test_nccl_without_a_gpu_runs_on_mpi(backend, monkeypatch, caplog):
    """Without a GPU, "nccl" (a CUDA-only program's name) means the MPI path, said once."""
    monkeypatch.setattr(dist, "_gpu_present", lambda: False)
    monkeypatch.setattr(dist._state, "gloo_notice_given", False)
    with caplog.at_level(logging.INFO, logger="mpitensor.distributed"):
        dist.init_process_group(backend)
        sub = dist.new_group([0], backend="nccl")
    assert dist.get_backend() == "mpi" and dist.get_backend(sub) == "mpi"
    x = np.ones(2)
    dist.all_reduce(x, group=sub)
    np.testing.assert_array_equal(x, [1.0, 1.0])
    notices = [r for r in caplog.records if "runs on mpitensor's MPI path" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in notices] == [
        (logging.INFO, "backend 'nccl' runs on mpitensor's MPI path (same API and results); "
                       "no GPU here, so NCCL is not used")]


@pytest.mark.parametrize("backend,exc,match", [
    ("ucc", ValueError, r"unknown backend 'ucc': use 'mpi', 'nccl' or 'gloo'"),
    ("", ValueError, "unknown backend ''"),
    ("cpu:ucc,cuda:nccl", ValueError, r"unknown backend\(s\) \['ucc'\]"),
    (5, TypeError, "backend must be a string such as 'mpi', got 5"),
])
def test_bad_backend(backend, exc, match):
    with pytest.raises(exc, match=match):
        dist.init_process_group(backend)
    assert not dist.is_initialized()


def test_backend_class():
    assert dist.Backend("MPI") == "mpi" == dist.Backend.MPI
    assert dist.Backend.GLOO == "gloo" and dist.Backend.NCCL == "nccl"
    with pytest.raises(TypeError, match="backend must be a string"):
        dist.Backend(1)


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "NCCL"])
def test_nccl_without_cupy(backend, monkeypatch):
    """A GPU but no usable CuPy/NCCL: "nccl" is an error that says what is missing."""
    reason = nccl_unavailable_reason()
    if not reason:
        pytest.skip("NCCL is available here: the error path cannot be exercised")
    monkeypatch.setattr(dist, "_gpu_present", lambda: True)
    from mpitensor.distributed.backends.mpi.group import MPIGroup

    freed = []
    free = MPIGroup.free
    monkeypatch.setattr(MPIGroup, "free", lambda self: (freed.append(self.name), free(self)))
    with pytest.raises(RuntimeError, match=r"backend 'nccl' is unavailable: .*Use "
                                           r"backend='mpi'") as info:
        dist.init_process_group(backend)
    assert reason in str(info.value)
    assert not dist.is_initialized()
    assert freed == ["WORLD"]  # the duplicated world communicator was released
    dist.init_process_group("mpi")  # nothing was left half-initialized
    assert dist.get_backend() == "mpi"


# ---------------------------------------------------------------------------- debug switch
def test_new_group_nccl_without_cupy(monkeypatch):
    if not nccl_unavailable_reason():
        pytest.skip("NCCL is available here: the error path cannot be exercised")
    monkeypatch.setattr(dist, "_gpu_present", lambda: True)
    dist.init_process_group("mpi")
    with pytest.raises(RuntimeError, match="backend 'nccl' is unavailable"):
        dist.new_group([0], backend="nccl")
    x = np.ones(1)
    dist.all_reduce(x)
    assert x[0] == 1.0


def test_set_debug_reaches_every_group():
    dist.init_process_group("mpi")
    g = dist.new_group([0])
    try:
        dist.set_debug(True)
        assert dist.get_debug() and dist.group.WORLD.debug and g.debug
        x = np.ones(3)
        dist.all_reduce(x, group=g)  # a checked collective of one rank
        np.testing.assert_array_equal(x, np.ones(3))
        h = dist.new_group([0])  # made while debug is on
        assert h.debug
    finally:
        dist.set_debug(False)
    assert not dist.get_debug() and not g.debug and not dist.group.WORLD.debug


# ---------------------------------------------------------------------------- environment
@pytest.mark.parametrize("raw,value", [
    ("1", True), ("true", True), (" YES ", True), ("on", True),
    ("0", False), ("", False), ("false", False), ("No", False), ("off", False),
])
def test_env_flag(monkeypatch, raw, value):
    monkeypatch.setenv("MPITENSOR_TEST_FLAG", raw)
    assert _config.env_flag("MPITENSOR_TEST_FLAG") is value


def test_env_flag_rejects_other_values(monkeypatch):
    monkeypatch.delenv("MPITENSOR_TEST_FLAG", raising=False)
    assert _config.env_flag("MPITENSOR_TEST_FLAG", default=True) is True
    monkeypatch.setenv("MPITENSOR_TEST_FLAG", "maybe")
    with pytest.raises(ValueError, match="MPITENSOR_TEST_FLAG='maybe' is not a boolean"):
        _config.env_flag("MPITENSOR_TEST_FLAG")


@pytest.mark.parametrize("raw,match", [("abc", "is not a number of seconds"),
                                       ("-1", "must be a positive number"),
                                       ("0", "must be a positive number")])
def test_env_float_rejects_bad_values(monkeypatch, raw, match):
    monkeypatch.setenv("MPITENSOR_TEST_SECONDS", raw)
    with pytest.raises(ValueError, match=f"MPITENSOR_TEST_SECONDS='{raw}' {match}"):
        _config.env_float("MPITENSOR_TEST_SECONDS", 1.0)
    monkeypatch.setenv("MPITENSOR_TEST_SECONDS", " ")
    assert _config.env_float("MPITENSOR_TEST_SECONDS", 7.0) == 7.0
    monkeypatch.setenv("MPITENSOR_TEST_SECONDS", "2.5")
    assert _config.env_float("MPITENSOR_TEST_SECONDS", 7.0) == 2.5


def _fresh_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter (the switches are read once, at import)."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("MPITENSOR_", "PMI_", "PMIX_", "HYDRA_"))}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=ROOT, timeout=120,
                          capture_output=True, text=True)


def test_env_switches_in_a_fresh_process():
    code = ("import mpitensor.distributed as dist; dist.init_process_group(); "
            "print(dist.get_debug(), dist.group.WORLD.timeout)")
    out = _fresh_python(code, MPITENSOR_DEBUG="1", MPITENSOR_TIMEOUT="12.5")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "12.5"]
    out = _fresh_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "1800.0"]
    out = _fresh_python(code, MPITENSOR_DEBUG="perhaps")
    assert out.returncode != 0
    assert "MPITENSOR_DEBUG='perhaps' is not a boolean" in out.stderr


def test_timeout_and_abort_switches_in_a_fresh_process():
    code = ("import mpitensor.distributed as dist; dist.init_process_group(); "
            "g = dist.group.WORLD; from mpitensor.distributed.health import abort as _abort; "
            "print(g.timeout, g.stall_warn, _abort.abort_handler_installed())")
    out = _fresh_python(code, MPITENSOR_TIMEOUT="10", MPITENSOR_STALL_WARN="2.5")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10.0", "2.5", "False"]  # one rank: no abort handler
    out = _fresh_python(code, MPITENSOR_TIMEOUT="inf")
    assert out.stdout.split() == ["inf", "60.0", "False"], out.stderr
    out = _fresh_python(code, MPITENSOR_ABORT_ON_EXCEPTION="maybe")
    assert out.returncode != 0
    assert "MPITENSOR_ABORT_ON_EXCEPTION='maybe' is not a boolean" in out.stderr


# ---------------------------------------------------------------------------- abort handler
def test_abort_handler_install_and_uninstall():
    import threading

    from mpitensor.distributed.health import abort as _abort

    before_sys, before_thread = sys.excepthook, threading.excepthook
    dist.init_process_group()  # one rank: not installed by default
    assert not _abort.abort_handler_installed()
    dist.destroy_process_group()
    dist.init_process_group(abort_on_exception=True)
    assert _abort.abort_handler_installed()
    assert sys.excepthook is _abort._excepthook
    assert threading.excepthook is _abort._thread_excepthook
    dist.install_abort_handler()  # idempotent
    dist.destroy_process_group()  # what init installed, destroy removes
    assert not _abort.abort_handler_installed()
    assert (sys.excepthook, threading.excepthook) == (before_sys, before_thread)
    dist.install_abort_handler()  # by hand: stays until uninstalled by hand
    dist.init_process_group()
    dist.destroy_process_group()
    assert _abort.abort_handler_installed()
    dist.uninstall_abort_handler()
    dist.uninstall_abort_handler()
    assert sys.excepthook is before_sys


def test_abort_handler_prefixes_every_line(capsys, monkeypatch):
    """The report: every traceback line prefixed with the rank; then MPI_Abort (stubbed)."""
    from mpitensor.distributed.health import abort as _abort

    calls = []
    monkeypatch.setattr(_abort, "abort_job", lambda code=1: calls.append("abort"))
    monkeypatch.setitem(_abort._saved, "sys", lambda *a: calls.append("previous"))
    try:
        raise ValueError("line one\nline two")
    except ValueError as exc:
        _abort._excepthook(type(exc), exc, exc.__traceback__)
    err = capsys.readouterr().err
    lines = err.rstrip("\n").split("\n")
    assert all(ln.startswith("[rank 0] ") for ln in lines), err
    assert "[rank 0] ValueError: line one" in err and "[rank 0] line two" in err
    assert "[rank 0] Traceback (most recent call last):" in err
    assert calls == ["abort", "previous"]
    _abort._saved.clear()
