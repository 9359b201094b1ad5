"""NumPy's keyword spellings ``axis``/``keepdims``, which torch's native functions and Tensor
methods take for ``dim``/``keepdim`` (d2l's ``x.argmax(axis=1)``); nn.functional takes
neither, in both libraries."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt

torch = pytest.importorskip("torch")

CASES = [
    ("sum", {"axis": 1, "keepdims": True}),
    ("mean", {"axis": 0}),
    ("argmax", {"axis": 1}),
    ("argmin", {"axis": 0, "keepdims": True}),
    ("amax", {"axis": 1}),
    ("std", {"axis": 1, "keepdims": True}),
    ("cumsum", {"axis": 1}),
    ("softmax", {"axis": 1}),
    ("unsqueeze", {"axis": 0}),
    ("squeeze", {"axis": 0}),
    ("flip", {}),
    ("logsumexp", {"axis": 1}),
]


def _values(out):  # type: ignore[no-untyped-def]
    return np.asarray(out.detach().numpy() if hasattr(out, "detach") else out)


@pytest.mark.parametrize("name,kw", CASES)
@pytest.mark.parametrize("form", ["method", "function"])
def test_numpy_keywords_match_torch(name: str, kw: dict, form: str) -> None:
    data = np.arange(12.0).reshape(1, 3, 4)[0]
    if name == "squeeze":
        data = data[None]
    if name == "flip":
        kw = {"dims": (0,)}
    got = []
    for lib in (mt, torch):
        x = lib.tensor(data)
        fn = getattr(x, name) if form == "method" else getattr(lib, name)
        args = () if form == "method" else (x,)
        got.append(_values(fn(*args, **kw)))
    np.testing.assert_allclose(got[0], got[1], rtol=1e-12, atol=0)  # float64: a few ulps


def test_max_and_cat_take_axis() -> None:
    for lib in (mt, torch):
        x = lib.arange(6.0).reshape(2, 3)
        values, indices = lib.max(x, axis=1, keepdims=True)
        assert _values(values).tolist() == [[2.0], [5.0]]
        assert _values(indices).tolist() == [[2], [2]]
        assert tuple(lib.cat([x, x], axis=0).shape) == (4, 3)


def test_both_spellings_or_functional_raise_type_error() -> None:
    x = mt.ones(2, 3)
    with pytest.raises(TypeError):
        x.sum(dim=1, axis=1)
    with pytest.raises(TypeError):
        x.sum(1, axis=1)
    with pytest.raises(TypeError):
        torch.ones(2, 3).sum(1, axis=1)
    for lib in (mt, torch):
        with pytest.raises(TypeError):
            lib.nn.functional.softmax(lib.ones(2, 3), axis=1)


def test_wrapped_functions_keep_their_names_and_docs() -> None:
    assert mt.sum.__name__ == "sum" and mt.Tensor.sum.__doc__
    assert mt.Tensor.argmax.__qualname__ == "Tensor.argmax"


KEYWORD_FORMS = [
    ("flip", {"dims": (0,)}),
    ("permute", {"dims": (1, 0)}),
    ("repeat", {"repeats": (2, 1)}),
    ("view", {"size": (3, 2)}),
    ("reshape", {"shape": (3, 2)}),
    ("expand", {"size": (2, 2, 3)}),
    ("tile", {"dims": (2,)}),
    ("new_zeros", {"size": (2,)}),
    ("new_ones", {"size": (1, 2)}),
    ("view", {"dtype": "int32"}),
]


@pytest.mark.parametrize("name,kw", KEYWORD_FORMS)
def test_star_args_methods_take_torch_keyword_form(name: str, kw: dict) -> None:
    """``x.flip(dims=(0,))``, ``x.view(size=...)``, ``torch.flip(x, dims=[1])``: the methods
    written with ``*args`` take torch's keyword too, with torch's results."""
    got = []
    for lib in (mt, torch):
        x = lib.arange(6).reshape(2, 3)
        k = {key: getattr(lib, v) if key == "dtype" else v for key, v in kw.items()}
        got.append(_values(getattr(x, name)(**k)))
        if hasattr(lib, name) and name in ("flip", "permute", "reshape", "tile"):
            got.append(_values(getattr(lib, name)(x, **k)))
    half = len(got) // 2
    for a, b in zip(got[:half], got[half:]):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_keyword_form_given_twice_or_misspelled_raises() -> None:
    x = mt.ones(2, 3)
    with pytest.raises(TypeError, match="both by position and by keyword"):
        x.flip(0, dims=(1,))
    with pytest.raises(TypeError, match="unexpected keyword argument 'dim'"):
        x.permute(dim=(1, 0))
    with pytest.raises(TypeError):
        torch.ones(2, 3).flip(0, dims=(1,))
