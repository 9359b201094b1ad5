"""Containers (Sequential, ModuleList, ModuleDict) and nn.init, checked against PyTorch.

Each container scenario is one function that takes an ``nn`` namespace and returns what a user
would observe (reprs, keys, lengths, the exception type of a misuse); it runs once with
``mpitensor.nn`` and once with ``torch.nn`` and the two transcripts must be equal. The init
tests compare gains and fans with ``torch.nn.init`` exactly, and the statistics of large
seeded draws with the theory and with torch's own draws.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
from mpitensor import backend
from mpitensor.nn import init


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="torch is the oracle for these checks")


def arr(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):  # a torch tensor
        return t.detach().numpy()
    return backend.to_numpy(t._data)


# --------------------------------------------------------------------------------------------
# Transcripts of container use


def _seen(container: Any) -> tuple:
    """What a user sees of a container: its class, repr, length and state_dict keys."""
    return (type(container).__name__, repr(container), len(container),
            list(container.state_dict()))


def _try(action: Callable[[], Any]) -> Any:
    """The result of ``action`` as a snapshot, or the name of the exception it raised."""
    try:
        out = action()
    except Exception as exc:  # noqa: BLE001 - the exception type is what is compared
        return ("raised", type(exc).__name__)
    if hasattr(out, "state_dict") and hasattr(out, "__len__"):
        return _seen(out)
    return repr(out)


def _sequential_story(lib: Any) -> list:
    """Index, slice, assign, delete, insert, grow and combine Sequentials."""
    log = []
    s = lib.Sequential(lib.Linear(1, 2), lib.ReLU(), lib.Linear(2, 3), lib.Dropout(0.25),
                       lib.Linear(3, 4))
    log.append(_seen(s))
    log += [_try(lambda i=i: s[i]) for i in range(-6, 6)]
    for sl in (slice(1, None), slice(None, -1), slice(None, None, 2), slice(-2, None),
               slice(4, 1, -1), slice(7, 9)):
        log.append(_try(lambda sl=sl: s[sl]))
    s[1] = lib.Linear(9, 9)
    s[-1] = lib.Flatten()
    log.append(_seen(s))
    log.append(_try(lambda: s.__setitem__(5, lib.ReLU())))
    del s[0]
    log.append(_seen(s))
    del s[-2]
    log.append(_seen(s))
    log.append(_try(lambda: s.__delitem__(10)))
    del s[::2]
    log.append(_seen(s))
    for index in (0, len(s), -1, -len(s)):
        log.append(_try(lambda index=index: s.insert(index, lib.Linear(index + 10, 1))))
    log.append(_try(lambda: s.insert(len(s) + 1, lib.ReLU())))
    log.append(_try(lambda: s.insert(0, "not a module")))
    log.append(_try(lambda: s.append(lib.Linear(5, 5))))
    log.append(_try(lambda: s.extend([lib.ReLU(), lib.Linear(6, 6)])))
    log.append(_try(lambda: s.pop(1)))
    log.append(_try(lambda: s.pop(-1)))
    log.append(_seen(s))
    return log


def _sequential_arithmetic(lib: Any) -> list:
    a = lib.Sequential(lib.Linear(1, 1), lib.ReLU())
    b = lib.Sequential(lib.Linear(2, 2))
    log = [_try(lambda: a + b), _try(lambda: a * 3), _try(lambda: 2 * b)]
    log += [_try(lambda: a + [lib.ReLU()]), _try(lambda: a * 0), _try(lambda: a * -1),
            _try(lambda: a * 1.5)]
    a += b
    log.append(_seen(a))
    b *= 3
    log.append(_seen(b))
    shared = list(b)
    log.append([m is shared[0] for m in b])
    log.append(_seen(a))
    return log


def _named_sequential(lib: Any) -> list:
    """Keys from an OrderedDict survive slicing and assignment; deletion renumbers them."""
    s = lib.Sequential(OrderedDict([("conv", lib.Conv2d(1, 2, 3)), ("act", lib.ReLU()),
                                    ("flat", lib.Flatten()), ("fc", lib.Linear(8, 2))]))
    log = [_seen(s), _seen(s[1:3]), _try(lambda: s[-1]), repr(s.fc)]
    s[0] = lib.Conv2d(1, 4, 1)
    log.append(_seen(s))
    del s[1]
    log.append(_seen(s))
    log.append(_try(lambda: s.append(lib.ReLU())))
    return log


def _module_list_story(lib: Any) -> list:
    ml = lib.ModuleList([lib.Linear(i + 1, i + 2) for i in range(4)])
    log = [_seen(ml)]
    log += [_try(lambda i=i: ml[i]) for i in range(-5, 5)]
    for sl in (slice(1, None), slice(None, None, -1), slice(1, 3), slice(9, 10)):
        log.append(_try(lambda sl=sl: ml[sl]))
    ml[2] = lib.ReLU()
    ml[-1] = lib.Identity()
    del ml[1]
    log.append(_seen(ml))
    del ml[1:]
    log.append(_seen(ml))
    for index in (0, 1, len(ml) + 2, 2):  # torch shifts keys only for indices in range
        if index <= len(ml):
            ml.insert(index, lib.Linear(index + 20, 1))
    log.append(_seen(ml))
    log.append(_try(lambda: ml.append(lib.ReLU())))
    log.append(_try(lambda: ml.extend((lib.Linear(7, 7), lib.Linear(8, 8)))))
    log.append(_try(lambda: ml.extend(3)))
    log.append(_try(lambda: ml.pop(0)))
    log.append(_try(lambda: ml.pop(slice(0, 2))))
    ml += [lib.Dropout(0.5)]
    log.append(_seen(ml))
    log.append(_try(lambda: ml + [lib.ReLU()]))
    log.append(_try(lambda: ml + lib.ModuleList([lib.Flatten()])))
    log.append(_try(lambda: ml[len(ml)]))
    log.append(_try(lambda: ml.__delitem__(-len(ml) - 1)))
    return log


def _module_list_repr_runs(lib: Any) -> list:
    """Runs of modules with equal reprs print as one ``(i-j): n x`` line."""
    one = lib.Linear(2, 2)
    nested = lib.Sequential(lib.Linear(3, 3), lib.ReLU())
    cases = [
        [],
        [one],
        [lib.Linear(2, 2) for _ in range(3)],
        [one, one, lib.ReLU(), lib.Linear(2, 2), lib.Linear(2, 3), lib.Linear(2, 3)],
        [nested, lib.Sequential(lib.Linear(3, 3), lib.ReLU()), lib.ReLU(), lib.ReLU(),
         lib.ModuleList([lib.ReLU(), lib.ReLU()])],
    ]
    return [repr(lib.ModuleList(c)) for c in cases]


def _module_dict_story(lib: Any) -> list:
    log = []
    for source in ({"b": lib.ReLU(), "a": lib.Linear(1, 1)},
                   OrderedDict([("z", lib.Flatten()), ("y", lib.Linear(2, 2))]),
                   [("q", lib.ReLU()), ["p", lib.Linear(3, 3)]],
                   lib.ModuleDict({"m": lib.Linear(4, 4)}),
                   (pair for pair in [("g", lib.ReLU())])):
        log.append(_seen(lib.ModuleDict(source)))
    d = lib.ModuleDict({"enc": lib.Linear(2, 4), "act": lib.ReLU()})
    d["dec"] = lib.Linear(4, 2)
    d["enc"] = lib.Linear(2, 5)  # replaced in place: stays first
    log.append(_seen(d))
    d.update({"act": lib.Softmax(dim=1), "new": lib.ReLU()})
    d.update([("last", lib.Flatten())])
    log.append(_seen(d))
    log.append((list(d), list(d.keys()), [repr(v) for v in d.values()],
                [(k, repr(v)) for k, v in d.items()], "act" in d, "nope" in d))
    log.append(_try(lambda: d.pop("act")))
    del d["new"]
    log.append(_seen(d))
    for bad in ("missing",):
        log.append(_try(lambda bad=bad: d[bad]))
        log.append(_try(lambda bad=bad: d.__delitem__(bad)))
        log.append(_try(lambda bad=bad: d.pop(bad)))
    log.append(_try(lambda: d.update(3)))
    log.append(_try(lambda: d.update([3])))
    log.append(_try(lambda: d.update([("x", lib.ReLU(), 1)])))
    log.append(_try(lambda: d.update([("ok", lib.ReLU()), ("bad",)])))
    log.append(_seen(d))  # the pair before the bad one was applied
    log.append(_try(lambda: d.update({"v": "not a module"})))
    d.clear()
    log.append(_seen(d))
    return log


@pytest.mark.parametrize("story", [_sequential_story, _sequential_arithmetic, _named_sequential,
                                   _module_list_story, _module_list_repr_runs,
                                   _module_dict_story])
def test_container_transcripts_match_torch(torch, story):
    ours, theirs = story(nn), story(torch.nn)
    assert len(ours) == len(theirs)
    for step, (mine, ref) in enumerate(zip(ours, theirs)):
        assert mine == ref, f"step {step} of {story.__name__}"


def test_sequential_forward_matches_torch(torch):
    ours = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(27, 5), nn.LogSoftmax(dim=1))
    theirs = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(),
                                 torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                 torch.nn.Linear(27, 5), torch.nn.LogSoftmax(dim=1))
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32)
    expect = theirs(torch.from_numpy(x))
    np.testing.assert_allclose(arr(ours(mt.tensor(x))), arr(expect), rtol=1e-5, atol=1e-6)
    # the halves of a slice chain into the same function
    np.testing.assert_allclose(arr(ours[3:](ours[:3](mt.tensor(x)))), arr(expect), rtol=1e-5,
                               atol=1e-6)
    # the same module twice runs twice, and counts twice in len but once in parameters
    relu = nn.ReLU()
    twice = nn.Sequential(relu, nn.Linear(2, 2), relu)
    assert len(twice) == 3 and twice[0] is twice[2] and len(list(twice.children())) == 2


def test_module_list_insert_follows_list_rules():
    """Negative and past-the-end indices behave as in ``list.insert`` (torch mislabels them)."""
    a, b, c, d = nn.ReLU(), nn.Identity(), nn.Flatten(), nn.Linear(1, 1)
    ml = nn.ModuleList([a, b])
    ml.insert(-1, c)
    ml.insert(99, d)
    assert list(ml) == [a, c, b, d]
    assert [k for k, _ in ml.named_children()] == ["0", "1", "2", "3"]
    with pytest.raises(TypeError, match="ModuleList.insert takes a Module, got int"):
        ml.insert(0, 5)


def test_container_dir_hides_positional_keys():
    s = nn.Sequential(nn.ReLU(), nn.ReLU())
    ml = nn.ModuleList([nn.ReLU()])
    assert not any(k.isdigit() for k in dir(s)) and "append" in dir(s)
    assert not any(k.isdigit() for k in dir(ml)) and "extend" in dir(ml)


def test_container_error_messages_name_the_values():
    s = nn.Sequential(nn.ReLU(), nn.ReLU())
    with pytest.raises(IndexError, match=r"index 2 is out of range.*holds 2 module"):
        s[2]
    with pytest.raises(IndexError, match=r"insert index -3 .* from -2 to 2"):
        s.insert(-3, nn.ReLU())
    with pytest.raises(ValueError, match="got ModuleList"):
        s + nn.ModuleList()
    with pytest.raises(ValueError, match="at least once, got 0"):
        s * 0
    with pytest.raises(TypeError, match="got float"):
        s * 2.0
    with pytest.raises(TypeError, match="got int; wrap a single module"):
        nn.ModuleList().extend(3)
    with pytest.raises(ValueError, match="item #1 has length 1"):
        nn.ModuleDict().update([("a", nn.ReLU()), ("b",)])


# --------------------------------------------------------------------------------------------
# init: gains and fans


_GAIN_CASES = [
    ("linear", None), ("conv1d", None), ("conv2d", None), ("conv3d", None),
    ("conv_transpose1d", None), ("conv_transpose2d", None), ("conv_transpose3d", None),
    ("sigmoid", None), ("tanh", None), ("relu", None), ("selu", None), ("leaky_relu", None),
    ("leaky_relu", 0), ("leaky_relu", 1), ("leaky_relu", 0.2), ("leaky_relu", math.sqrt(5)),
    ("leaky_relu", -0.5), ("relu", 0.3), ("tanh", 7.0),
]


@pytest.mark.parametrize("nonlinearity,param", _GAIN_CASES)
def test_calculate_gain_equals_torch(torch, nonlinearity, param):
    assert init.calculate_gain(nonlinearity, param) == \
        torch.nn.init.calculate_gain(nonlinearity, param)


@pytest.mark.parametrize("nonlinearity,param", [("gelu", None), ("Relu", None),
                                                ("leaky_relu", "0.1"), ("leaky_relu", True)])
def test_calculate_gain_rejects_like_torch(torch, nonlinearity, param):
    with pytest.raises(ValueError):
        torch.nn.init.calculate_gain(nonlinearity, param)
    with pytest.raises(ValueError, match=nonlinearity if param is None else "negative_slope"):
        init.calculate_gain(nonlinearity, param)


_WEIGHT_SHAPES = [(3, 7), (7, 3), (1, 1), (5, 4, 3), (8, 3, 5, 5), (6, 2, 3, 1), (4, 2, 2, 3, 5),
                  (16, 1, 1, 1), (0, 3), (3, 0, 2, 2)]


@pytest.mark.parametrize("shape", _WEIGHT_SHAPES)
def test_fans_equal_torch(torch, shape):
    ours = init._calculate_fan_in_and_fan_out(mt.empty(*shape))
    assert ours == torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(*shape))


def test_fans_of_layers_equal_torch(torch):
    pairs = [(nn.Linear(7, 3), torch.nn.Linear(7, 3)),
             (nn.Conv2d(3, 4, (2, 3)), torch.nn.Conv2d(3, 4, (2, 3))),
             (nn.Conv2d(4, 8, 3, groups=2), torch.nn.Conv2d(4, 8, 3, groups=2))]
    for ours, theirs in pairs:
        assert init._calculate_fan_in_and_fan_out(ours.weight) == \
            torch.nn.init._calculate_fan_in_and_fan_out(theirs.weight)


@pytest.mark.parametrize("shape", [(), (5,)])
def test_fans_need_two_dimensions(torch, shape):
    with pytest.raises(ValueError):
        torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    for fn in (init._calculate_fan_in_and_fan_out, init.xavier_uniform_, init.xavier_normal_,
               init.kaiming_uniform_, init.kaiming_normal_):
        with pytest.raises(ValueError, match=rf"shape {re_shape(shape)} has fewer than 2"):
            fn(mt.empty(shape))


def re_shape(shape: tuple) -> str:
    return str(shape).replace("(", r"\(").replace(")", r"\)")


def test_mode_is_case_insensitive_and_checked(torch):
    for fn in ("kaiming_uniform_", "kaiming_normal_"):
        getattr(torch.nn.init, fn)(torch.empty(3, 4), mode="FAN_OUT")
        getattr(init, fn)(mt.empty(3, 4), mode="FAN_OUT")
        with pytest.raises(ValueError):
            getattr(torch.nn.init, fn)(torch.empty(3, 4), mode="fan_avg")
        with pytest.raises(ValueError, match="fan_avg not supported"):
            getattr(init, fn)(mt.empty(3, 4), mode="fan_avg")


# --------------------------------------------------------------------------------------------
# init: distributions


def _moments(x: np.ndarray) -> tuple:
    x = x.astype(np.float64).ravel()
    return x.mean(), x.std(), x.min(), x.max()


def _same_law(mine: np.ndarray, ref: np.ndarray, sd: float) -> None:
    """Two samples of one law: means and stds agree within a few standard errors."""
    n = min(mine.size, ref.size)
    m1, s1, _, _ = _moments(mine)
    m2, s2, _, _ = _moments(ref)
    assert abs(m1 - m2) < 6 * sd * math.sqrt(2 / n)
    assert abs(s1 - s2) < 6 * sd * math.sqrt(1 / n) + 1e-12


# (function name, kwargs, shape, (law, scale) where scale is the bound or the std)
def _he(gain: float, fan: int) -> float:
    return gain / math.sqrt(fan)


_LAWS = [
    ("uniform_", dict(a=-2.0, b=3.0), (300, 400), ("uniform", None)),
    ("normal_", dict(mean=1.5, std=0.5), (300, 400), ("normal", 0.5)),
    ("xavier_uniform_", dict(gain=2.0), (300, 400), ("uniform", 2.0 * math.sqrt(6 / 700))),
    ("xavier_normal_", dict(gain=0.5), (64, 32, 3, 3), ("normal", 0.5 * math.sqrt(2 / 864))),
    ("kaiming_uniform_", dict(a=math.sqrt(5)), (64, 32, 3, 3), ("uniform", 1 / math.sqrt(288))),
    ("kaiming_uniform_", dict(mode="fan_out", nonlinearity="relu"), (64, 32, 3, 3),
     ("uniform", math.sqrt(3) * _he(math.sqrt(2), 576))),
    ("kaiming_normal_", dict(nonlinearity="relu"), (400, 300), ("normal", _he(math.sqrt(2), 300))),
    ("kaiming_normal_", dict(a=0.2, mode="fan_out"), (128, 16, 5, 5),
     ("normal", _he(math.sqrt(2 / 1.04), 3200))),
    ("kaiming_normal_", dict(nonlinearity="tanh"), (300, 200), ("normal", _he(5 / 3, 200))),
    ("kaiming_uniform_", dict(nonlinearity="selu", mode="fan_in"), (200, 300),
     ("uniform", math.sqrt(3) * _he(0.75, 300))),
]


@pytest.mark.parametrize("name,kwargs,shape,law", _LAWS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(_LAWS)])
def test_random_init_matches_torch_law(torch, name, kwargs, shape, law):
    mt.manual_seed(1234)
    torch.manual_seed(1234)
    w = mt.empty(*shape)
    out = getattr(init, name)(w, **kwargs)
    ref = getattr(torch.nn.init, name)(torch.empty(*shape), **kwargs)
    assert out is w and w.shape == tuple(shape) and w.dtype == mt.float32
    mine, theirs = arr(w), arr(ref)
    kind, scale = law
    if name == "uniform_":
        lo, hi = kwargs["a"], kwargs["b"]
        sd = (hi - lo) / math.sqrt(12)
    elif kind == "uniform":
        lo, hi = -scale, scale
        sd = scale / math.sqrt(3)
    else:
        lo = hi = None
        sd = scale
    if lo is not None:
        for sample in (mine, theirs):
            assert sample.min() >= np.float32(lo) and sample.max() <= np.float32(hi)
            # the whole interval is used, not a narrower one
            assert sample.min() < lo + (hi - lo) * 1e-3 and sample.max() > hi - (hi - lo) * 1e-3
    m, s, _, _ = _moments(mine)
    assert abs(s - sd) < 0.02 * sd  # against the formula
    expected_mean = kwargs.get("mean", (lo + hi) / 2 if lo is not None else 0.0)
    assert abs(m - expected_mean) < 6 * sd / math.sqrt(mine.size)
    _same_law(mine, theirs, sd)  # against torch's own draw


@pytest.mark.parametrize("mean,std,a,b", [(0.0, 1.0, -2.0, 2.0), (0.5, 1.0, -1.0, 3.0),
                                          (0.0, 0.02, -0.04, 0.04), (2.0, 1.0, 0.0, 1.0)])
def test_trunc_normal_matches_torch(torch, mean, std, a, b):
    mt.manual_seed(5)
    torch.manual_seed(5)
    w = init.trunc_normal_(mt.empty(400, 500), mean=mean, std=std, a=a, b=b)
    ref = arr(torch.nn.init.trunc_normal_(torch.empty(400, 500), mean=mean, std=std, a=a, b=b))
    mine = arr(w)
    assert mine.min() >= np.float32(a) and mine.max() <= np.float32(b)
    # the standard deviation of the truncated law, from the normal pdf and cdf
    alpha, beta = (a - mean) / std, (b - mean) / std
    pdf = [math.exp(-t * t / 2) / math.sqrt(2 * math.pi) for t in (alpha, beta)]
    mass = 0.5 * (math.erf(beta / math.sqrt(2)) - math.erf(alpha / math.sqrt(2)))
    shift = (pdf[0] - pdf[1]) / mass
    sd = std * math.sqrt(1 + (alpha * pdf[0] - beta * pdf[1]) / mass - shift**2)
    m, s, _, _ = _moments(mine)
    assert abs(m - (mean + std * shift)) < 6 * sd / math.sqrt(mine.size)
    assert abs(s - sd) < 0.02 * sd
    _same_law(mine, ref, sd)


def test_constants_and_eye_equal_torch(torch):
    for shape in [(3, 5), (5, 3), (4, 4), (1, 6)]:
        np.testing.assert_array_equal(arr(init.eye_(mt.empty(*shape))),
                                      arr(torch.nn.init.eye_(torch.empty(*shape))))
    for fn, args in [("constant_", (0.25,)), ("ones_", ()), ("zeros_", ())]:
        np.testing.assert_array_equal(arr(getattr(init, fn)(mt.empty(2, 3, 4), *args)),
                                      arr(getattr(torch.nn.init, fn)(torch.empty(2, 3, 4), *args)))
    with pytest.raises(ValueError):
        torch.nn.init.eye_(torch.empty(2, 2, 2))
    with pytest.raises(ValueError, match=r"3-D tensor of shape \(2, 2, 2\)"):
        init.eye_(mt.empty(2, 2, 2))


def test_init_writes_in_place_outside_autograd(torch):
    """A layer's Parameter keeps its storage and leaf status, as torch's does under no_grad."""
    ours, theirs = nn.Linear(20, 30), torch.nn.Linear(20, 30)
    storage = ours.weight._data
    for fn, args in [("uniform_", (-1, 1)), ("normal_", ()), ("trunc_normal_", ()),
                     ("constant_", (0.5,)), ("ones_", ()), ("zeros_", ()), ("eye_", ()),
                     ("xavier_uniform_", ()), ("xavier_normal_", ()), ("kaiming_uniform_", ()),
                     ("kaiming_normal_", ())]:
        assert getattr(init, fn)(ours.weight, *args) is ours.weight
        assert getattr(torch.nn.init, fn)(theirs.weight, *args) is theirs.weight
        assert ours.weight._data is storage
        for w in (ours.weight, theirs.weight):
            assert w.requires_grad and w.grad_fn is None and w.is_leaf


def test_init_keeps_float64(torch):
    mt.manual_seed(0)
    w = init.kaiming_normal_(mt.empty(200, 100, dtype=mt.float64))
    assert w.dtype == mt.float64
    assert abs(arr(w).std() - math.sqrt(2 / 1.0001) / 10) < 0.02 / 10


def test_seeded_generators_repeat():
    draws = []
    for _ in range(2):
        g = mt.Generator().manual_seed(11)
        draws.append([arr(getattr(init, fn)(mt.empty(8, 8), generator=g))
                      for fn in ("uniform_", "normal_", "trunc_normal_", "xavier_uniform_",
                                 "kaiming_normal_")])
    for a, b in zip(*draws):
        np.testing.assert_array_equal(a, b)


def test_init_misuse_matches_torch(torch):
    """Each misuse raises (or warns) in both libraries; ours says what to change."""
    with pytest.raises(RuntimeError):
        torch.nn.init.uniform_(torch.empty(3), 2.0, 1.0)
    with pytest.raises(ValueError, match="a=2.0 and b=1.0"):
        init.uniform_(mt.empty(3), 2.0, 1.0)
    with pytest.raises(RuntimeError):
        torch.nn.init.normal_(torch.empty(3), 0.0, -1.0)
    with pytest.raises(ValueError, match="std=-1.0"):
        init.normal_(mt.empty(3), 0.0, -1.0)
    for lib_init, empty in ((torch.nn.init, torch.empty), (init, mt.empty)):
        for fn in ("kaiming_uniform_", "kaiming_normal_"):
            with pytest.warns(UserWarning, match="zero-element"):
                getattr(lib_init, fn)(empty(0, 3))
    with pytest.raises(TypeError, match="floating point tensor, got dtype int64"):
        init.normal_(mt.zeros(3, dtype=mt.int64))
    with pytest.raises(TypeError, match="takes a mpitensor Tensor, got ndarray"):
        init.ones_(np.zeros(3))
    # an interval far in the tail is sampled (exactly), as torch samples it
    far = init.trunc_normal_(mt.empty(100), mean=0.0, std=1.0, a=30.0, b=31.0)
    assert bool(((far >= 30.0) & (far <= 31.0)).all())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a full tensor draws without a warning
        init.kaiming_uniform_(mt.empty(2, 2))
