"""Printing of tensors against torch: ``repr``/``str`` text and the print options.

torch is the oracle: the same values, dtype and options must give the same text, with
``torch.`` read as ``mpitensor.``. Tests that need no oracle assert the text directly.
GPU tests are marked ``gpu`` and skip with the reason where CuPy or a device is missing.
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import mpitensor as mt

torch = pytest.importorskip("torch", reason="torch is the oracle these tests compare with")


@pytest.fixture(autouse=True)
def _default_state():
    """Start and end every test with both libraries at their default options and dtype."""
    for lib in (mt, torch):
        lib.set_printoptions(profile="default")
    yield
    for lib in (mt, torch):
        lib.set_printoptions(profile="default")
        lib.set_default_dtype(lib.float32)


def _both(a: np.ndarray, requires_grad: bool = False) -> tuple:
    """Return (ours, torch's) repr of a tensor holding a copy of ``a``."""
    ours, theirs = mt.from_numpy(a.copy()), torch.from_numpy(a.copy())
    if requires_grad:
        ours.requires_grad_(True)
        theirs.requires_grad_(True)
    return repr(ours), repr(theirs).replace("torch.", "mpitensor.")


def _arrays() -> dict:
    rng = np.random.default_rng(7)
    f32 = np.float32
    return {
        "whole floats": np.array([1.0, -2.0, 30.0], f32),
        "fixed floats": np.array([0.5, -1.25, 3.125], f32),
        "scalar float": np.array(2.5, f32),
        "scalar int": np.array(-7),
        "scalar bool": np.array(True),
        "scalar complex": np.array(1 - 2j, np.complex64),
        "zeros": np.zeros(4, f32),
        "negative zero": np.array([0.0, -0.0, 1.0], f32),
        "only nonfinite": np.array([np.nan, np.inf, -np.inf], f32),
        "nonfinite and whole": np.array([np.nan, 1.0, -np.inf, 100.0], f32),
        "nonfinite and fixed": np.array([np.nan, 0.25, np.inf], f32),
        "tiny -> sci": np.array([1e-5, 0.5], f32),
        "huge -> sci": np.array([3e9, 1.0], f32),
        "spread -> sci": np.array([0.01, 20.0], f32),
        "spread ints -> sci": np.array([1.0, 5000.0], f32),
        "float64 randn": rng.standard_normal((4, 3)),
        "float16": np.array([0.1, 1.5, 65504.0], np.float16),
        "int8": np.array([-128, 0, 127], np.int8),
        "uint8": np.array([0, 255], np.uint8),
        "int16 matrix": rng.integers(-300, 300, (3, 4)).astype(np.int16),
        "int32": np.array([[1, 22], [333, 4]], np.int32),
        "int64 matrix": rng.integers(-10**6, 10**6, (5, 6)),
        "bool matrix": rng.random((3, 3)) > 0.5,
        "complex64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "complex128 sci": np.array([1e-6 + 2j, -3 - 4e5j]),
        "complex whole": np.array([1 + 0j, -2 - 3j], np.complex64),
        "3-d": rng.standard_normal((2, 3, 4)).astype(f32),
        "4-d ints": np.arange(2 * 2 * 2 * 3).reshape(2, 2, 2, 3),
        "long row wraps": (np.arange(40, dtype=f32) - 20) / 3,
        "summarised vector": np.arange(5000, dtype=f32) / 9,
        "summarised matrix": np.arange(3000).reshape(60, 50),
        "summarised 3-d": (rng.standard_normal((11, 12, 13)) * 1e3).astype(f32),
        "summarised one long axis": np.arange(2002, dtype=f32).reshape(2, 1001),
        "summarised complex": (np.arange(1200) * (1 + 1j)).astype(np.complex64),
        "summarised bool": np.arange(1500) % 3 == 0,
        "empty": np.empty(0, f32),
        "empty int": np.empty(0, np.int64),
        "empty 2-d": np.empty((0, 3), f32),
        "empty 3-d float64": np.empty((2, 0, 1)),
        "one element 3-d": np.ones((1, 1, 1), f32),
    }


ARRAYS = _arrays()


@pytest.mark.parametrize("name", list(ARRAYS))
def test_repr_matches_torch(name):
    ours, theirs = _both(ARRAYS[name])
    assert ours == theirs
    assert str(mt.from_numpy(ARRAYS[name].copy())) == theirs


@pytest.mark.parametrize("options", [
    dict(precision=2),
    dict(precision=0),
    dict(precision=8),
    dict(threshold=5),
    dict(threshold=0),
    dict(edgeitems=1, threshold=10),
    dict(edgeitems=5, threshold=10),
    dict(edgeitems=0, threshold=10),
    dict(linewidth=30),
    dict(linewidth=200),
    dict(sci_mode=True),
    dict(sci_mode=False),
    dict(profile="short"),
    dict(profile="full"),
    dict(profile="short", precision=6),
], ids=str)
@pytest.mark.parametrize("name", ["fixed floats", "tiny -> sci", "huge -> sci", "int16 matrix",
                                  "bool matrix", "complex64", "3-d", "long row wraps",
                                  "summarised matrix", "summarised 3-d", "scalar float",
                                  "empty 2-d"])
def test_repr_matches_torch_under_options(name, options):
    mt.set_printoptions(**options)
    torch.set_printoptions(**options)
    ours, theirs = _both(ARRAYS[name])
    assert ours == theirs
    assert mt.get_printoptions() == torch._tensor_str.get_printoptions()


@pytest.mark.parametrize("name", ["whole floats", "float64 randn", "complex64", "empty",
                                  "long row wraps", "summarised vector", "float16"])
def test_requires_grad_note_matches_torch(name):
    a = ARRAYS[name]
    ours, theirs = _both(a, requires_grad=True)
    assert ours == theirs
    assert ours.endswith("requires_grad=True)")


@pytest.mark.parametrize("linewidth", [80, 40, 36, 32, 25])
def test_notes_wrap_onto_new_lines_like_torch(linewidth):
    mt.set_printoptions(linewidth=linewidth)
    torch.set_printoptions(linewidth=linewidth)
    # default dtype only: "dtype=mpitensor.x" is 4 characters longer than "dtype=torch.x", so
    # a dtype note may rightly wrap where torch's does not
    for n in range(1, 14):
        a = np.arange(n, dtype=np.float32) / 3
        ours, theirs = _both(a, requires_grad=True)
        assert ours == theirs
    ours, theirs = _both(np.empty((0, 2), np.float32), requires_grad=True)
    assert ours == theirs


def test_grad_fn_note_follows_the_values():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    ours, theirs = repr(x * 3), repr(tx * 3)
    # the op names differ (torch numbers its backward nodes); the layout does not
    assert ours.startswith("tensor([3., 6.], grad_fn=<Mul")
    assert ours.split(", grad_fn=")[0] == theirs.split(", grad_fn=")[0]
    with mt.no_grad():
        assert repr(x * 3) == "tensor([3., 6.])"


def test_default_dtype_float64_matches_torch():
    mt.set_default_dtype(mt.float64)
    torch.set_default_dtype(torch.float64)
    for a in (np.array([1.0, 2.0]), np.array([1.0, 2.0], np.float32), np.array([1 + 1j]),
              np.array([1 + 1j], np.complex64), np.empty(0), np.empty(0, np.float32)):
        ours, theirs = _both(a)
        assert ours == theirs


def test_subclass_prints_its_class_name():
    class Special(mt.Tensor):
        pass

    t = Special(np.array([1.0, 2.0], np.float32))
    assert repr(t) == "Special([1., 2.])"


def test_format_of_one_element_tensor_is_the_number():
    assert f"{mt.tensor(2.5):.3f}" == f"{torch.tensor(2.5):.3f}" == "2.500"
    assert format(mt.tensor([1.0, 2.0])) == repr(torch.tensor([1.0, 2.0]))


def test_print_options_round_trip_and_context():
    mt.set_printoptions(precision=3, linewidth=60, sci_mode=True)
    torch.set_printoptions(precision=3, linewidth=60, sci_mode=True)
    saved = mt.get_printoptions()
    assert saved == torch._tensor_str.get_printoptions()
    with mt.printoptions(precision=1, threshold=4):
        # printoptions() calls set_printoptions(), so sci_mode is back to automatic inside
        assert repr(mt.tensor([0.25, 0.75])) == "tensor([0.2, 0.8])"
        assert mt.get_printoptions()["sci_mode"] is None
    assert mt.get_printoptions() == saved
    with pytest.raises(RuntimeError), mt.printoptions(precision=1):
        raise RuntimeError("the options come back after an error too")
    assert mt.get_printoptions() == saved
    mt.set_printoptions()  # like torch: a call without sci_mode resets it to automatic
    torch.set_printoptions()
    assert mt.get_printoptions() == torch._tensor_str.get_printoptions()
    assert mt.get_printoptions()["sci_mode"] is None


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError, match="'default', 'short', 'full'"):
        mt.set_printoptions(profile="tiny")
    assert mt.get_printoptions()["precision"] == 4


def test_printoptions_are_reexported():
    tensor_module = importlib.import_module("mpitensor.tensor")
    printing_module = importlib.import_module("mpitensor._core.printing")
    for name in ("set_printoptions", "get_printoptions", "printoptions"):
        assert getattr(mt, name) is getattr(tensor_module, name) is getattr(printing_module, name)
        assert name in tensor_module.__all__


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fixed floats", "int16 matrix", "complex64",
                                  "summarised matrix", "summarised 3-d", "empty 2-d"])
def test_gpu_tensor_prints_its_values_and_device(name):
    a = ARRAYS[name]
    on_host = repr(mt.from_numpy(a.copy()))
    on_gpu = repr(mt.from_numpy(a.copy()).to("cuda"))
    # the device note comes first among the notes, as in torch; the rest is the host's text
    assert re.sub(r",\s+device='cuda:0'", "", on_gpu) == on_host
    assert "device='cuda:0'" in on_gpu
