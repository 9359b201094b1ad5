"""mpitensor.amp (autocast, GradScaler) against torch's CPU build as the oracle."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import mpitensor as mt

torch = pytest.importorskip("torch")

# one bfloat16 ulp is 2**-7 relative (float16: 2**-10); sums of a few products may land one
# rounding apart, as the two libraries add in another order
BF16_RTOL = 2 * 2.0**-7


def _pair(shape, seed, dtype=np.float32, grad=False):
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return (mt.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad))


def _close(ours, theirs, rtol=BF16_RTOL, atol=1e-2):
    assert str(ours.dtype) == str(theirs.dtype).replace("torch.", "")
    np.testing.assert_allclose(np.asarray(ours.detach().float().numpy()),
                               theirs.detach().float().numpy(), rtol=rtol, atol=atol)


LOWER_CASES = {
    "matmul_op": (lambda m, a, b, c: a @ b, [(4, 5), (5, 3)]),
    "matmul": (lambda m, a, b, c: m.matmul(a, b), [(2, 4, 5), (5, 3)]),
    "mm": (lambda m, a, b, c: m.mm(a, b), [(4, 5), (5, 3)]),
    "bmm": (lambda m, a, b, c: m.bmm(a, b), [(2, 4, 5), (2, 5, 3)]),
    "addmm": (lambda m, a, b, c: m.addmm(c, a, b), [(4, 5), (5, 3), (4, 3)]),
    "baddbmm": (lambda m, a, b, c: m.baddbmm(c, a, b), [(2, 4, 5), (2, 5, 3), (2, 4, 3)]),
    "addbmm": (lambda m, a, b, c: m.addbmm(c, a, b), [(2, 4, 5), (2, 5, 3), (4, 3)]),
    "linear": (lambda m, a, b, c: m.nn.functional.linear(a, b, c), [(4, 5), (3, 5), (3,)]),
    "conv1d": (lambda m, a, b, c: m.nn.functional.conv1d(a, b, c), [(2, 3, 8), (4, 3, 3), (4,)]),
    "conv2d": (lambda m, a, b, c: m.nn.functional.conv2d(a, b, c, padding=1),
               [(2, 3, 6, 6), (4, 3, 3, 3), (4,)]),
    "conv3d": (lambda m, a, b, c: m.nn.functional.conv3d(a, b, c),
               [(1, 2, 4, 4, 4), (3, 2, 2, 2, 2), (3,)]),
    "conv_transpose2d": (lambda m, a, b, c: m.nn.functional.conv_transpose2d(a, b, c),
                         [(2, 3, 4, 4), (3, 2, 3, 3), (2,)]),
    "conv_transpose1d": (lambda m, a, b, c: m.nn.functional.conv_transpose1d(a, b, c, stride=2),
                         [(2, 3, 5), (3, 2, 3), (2,)]),
    "prelu": (lambda m, a, b, c: m.nn.functional.prelu(a, b), [(2, 3, 4), (3,)]),
    "sdpa": (lambda m, a, b, c: m.nn.functional.scaled_dot_product_attention(a, b, c),
             [(2, 4, 8), (2, 6, 8), (2, 6, 8)]),
    # composed of mm in torch: cast as its product is
    "tensordot": (lambda m, a, b, c: m.tensordot(a, b, 1), [(4, 5), (5, 3)]),
    "adaptive_avg_pool2d": (lambda m, a, b, c: m.nn.functional.adaptive_avg_pool2d(
        m.nn.functional.conv2d(a, b), 1), [(2, 3, 5, 5), (4, 3, 3, 3)]),
    "constant_pad": (lambda m, a, b, c: m.nn.functional.pad(a @ b, (1, 1)), [(4, 5), (5, 3)]),
    "einsum_mm": (lambda m, a, b, c: m.einsum("ij,jk->ik", a, b), [(4, 5), (5, 3)]),
    "einsum_dot": (lambda m, a, b, c: m.einsum("i,i", a, b), [(5,), (5,)]),
    "einsum_batched": (lambda m, a, b, c: m.einsum("bij,bjk->bik", a, b),
                       [(2, 4, 5), (2, 5, 3)]),
    "vecdot": (lambda m, a, b, c: m.linalg.vecdot(a, b), [(4, 5), (4, 5)]),
    "inner": (lambda m, a, b, c: m.inner(a, b), [(4, 5), (3, 5)]),
    "tensordot_outer": (lambda m, a, b, c: m.tensordot(a, b, 0), [(4,), (3,)]),
    # not on torch's CPU list (or no contraction between operands): they keep float32
    "inner_vectors": (lambda m, a, b, c: m.inner(a, b), [(5,), (5,)]),
    "tensordot_full": (lambda m, a, b, c: m.tensordot(a, b, 2), [(4, 5), (4, 5)]),
    "bilinear": (lambda m, a, b, c: m.nn.functional.bilinear(a, b, c), [(2, 3), (2, 4),
                                                                        (5, 3, 4)]),
    "cosine_similarity": (lambda m, a, b, c: m.nn.functional.cosine_similarity(a, b),
                          [(4, 5), (4, 5)]),
    "einsum_outer": (lambda m, a, b, c: m.einsum("i,j->ij", a, b), [(4,), (3,)]),
    "einsum_mul": (lambda m, a, b, c: m.einsum("ij,ij->ij", a, b), [(4, 3), (4, 3)]),
    "einsum_trace": (lambda m, a, b, c: m.einsum("ii->", a), [(4, 4)]),
    "mv": (lambda m, a, b, c: m.mv(a, b), [(4, 5), (5,)]),
    "dot": (lambda m, a, b, c: m.dot(a, b), [(5,), (5,)]),
    "softmax": (lambda m, a, b, c: m.softmax(a, 1), [(4, 5)]),
    "relu_of_mm": (lambda m, a, b, c: m.relu(a @ b), [(4, 5), (5, 3)]),
}


@pytest.mark.parametrize("name", sorted(LOWER_CASES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_lower_precision_ops_match_torch_autocast(name, dtype):
    fn, shapes = LOWER_CASES[name]
    pairs = [_pair(s, i, grad=True) for i, s in enumerate(shapes)]
    ours = [p[0] for p in pairs] + [None] * (3 - len(pairs))
    theirs = [p[1] for p in pairs] + [None] * (3 - len(pairs))
    with mt.autocast("cpu", dtype=getattr(mt, dtype)):
        y = fn(mt, *ours)
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        ty = fn(torch, *theirs)
    # addmm and kin round the product, then the sum with the bias: a few roundings apart
    ulps = 2 if name.startswith(("add", "badd")) else 1
    _close(y, ty, rtol=ulps * BF16_RTOL, atol=ulps * 2.0**-8 * float(ty.detach().abs().max()))
    # the casts are differentiable: float32 leaves get float32 gradients, as torch's
    y.float().sum().backward()
    ty.float().sum().backward()
    for (a, ta) in pairs:
        assert a.grad.dtype == mt.float32
        np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=2 * BF16_RTOL,
                                   atol=5e-2)


FP32_CASES = {
    "mse_loss": lambda m, a, b: m.nn.functional.mse_loss(a, b),
    "l1_loss": lambda m, a, b: m.nn.functional.l1_loss(a, b),
    "smooth_l1_loss": lambda m, a, b: m.nn.functional.smooth_l1_loss(a, b),
    "huber_loss": lambda m, a, b: m.nn.functional.huber_loss(a, b),
    "bce_logits": lambda m, a, b: m.nn.functional.binary_cross_entropy_with_logits(a, b.sigmoid()),
    "bce": lambda m, a, b: m.nn.functional.binary_cross_entropy(a.sigmoid(), b.sigmoid()),
    "kl_div": lambda m, a, b: m.nn.functional.kl_div(a, b, reduction="batchmean",
                                                   log_target=True),
    "soft_margin": lambda m, a, b: m.nn.functional.soft_margin_loss(a, b.sign()),
    "cross_entropy": lambda m, a, b: m.nn.functional.cross_entropy(a, b.softmax(1)),
    "prod": lambda m, a, b: a.prod(1),
    "solve": lambda m, a, b: m.linalg.solve(a[:, :4] + 4 * m.eye(4, dtype=a.dtype), b),
    "max_pool3d": lambda m, a, b: m.nn.functional.max_pool3d(a.reshape(1, 1, 1, 4, 5), 1),
    "avg_pool3d": lambda m, a, b: m.nn.functional.avg_pool3d(a.reshape(1, 1, 1, 4, 5), 1),
    "adaptive_avg_pool3d": lambda m, a, b: m.nn.functional.adaptive_avg_pool3d(
        a.reshape(1, 1, 1, 4, 5), 1),
    "reflect_pad": lambda m, a, b: m.nn.functional.pad(a.reshape(1, 4, 5), (2, 2),
                                                       mode="reflect"),
    "replicate_pad": lambda m, a, b: m.nn.functional.pad(a.reshape(1, 1, 4, 5), (1, 1, 1, 1),
                                                         mode="replicate"),
    "cdist": lambda m, a, b: m.cdist(a, b),
}


@pytest.mark.parametrize("name", sorted(FP32_CASES))
def test_float32_ops_run_in_float32_on_bfloat16_inputs(name):
    fn = FP32_CASES[name]
    (a, ta), (b, tb) = _pair((4, 5), 1), _pair((4, 5), 2)
    a, b = a.bfloat16().requires_grad_(), b.bfloat16()
    ta, tb = ta.bfloat16().requires_grad_(), tb.bfloat16()
    with mt.autocast("cpu"):
        y = fn(mt, a, b)
    with torch.autocast("cpu"):
        ty = fn(torch, ta, tb)
    _close(y, ty, rtol=1e-5, atol=1e-6)  # same bfloat16 inputs, float32 arithmetic
    y.sum().backward()
    ty.sum().backward()
    assert a.grad.dtype == mt.bfloat16
    np.testing.assert_allclose(a.grad.float().numpy(), ta.grad.float().numpy(),
                               rtol=BF16_RTOL, atol=1e-3)


def test_linear_module_float64_and_nesting():
    lin = mt.nn.Linear(3, 2)
    x = mt.ones(4, 3)
    with mt.autocast(device_type="cpu"):
        assert lin(x).dtype == mt.bfloat16
        assert lin.weight.dtype == mt.float32
        assert (x.double() @ x.double().T).dtype == mt.float64  # float64 is never cast
        with mt.autocast("cpu", enabled=False):
            assert lin(x).dtype == mt.float32
            assert not mt.is_autocast_enabled("cpu")
        with mt.autocast("cpu", dtype=mt.float16):
            assert mt.get_autocast_dtype("cpu") == mt.float16
            assert lin(x).dtype == mt.float16
        assert mt.get_autocast_dtype("cpu") == mt.bfloat16
        assert mt.is_autocast_enabled("cpu") and not mt.is_autocast_enabled()
    assert lin(x).dtype == mt.float32
    assert not mt.is_autocast_enabled("cpu")


def test_decorator_and_state_functions():
    @mt.autocast("cpu")
    def f(a, b):
        return a @ b

    assert f(mt.ones(2, 2), mt.ones(2, 2)).dtype == mt.bfloat16
    assert (mt.ones(2, 2) @ mt.ones(2, 2)).dtype == mt.float32
    assert mt.autocast_increment_nesting() == torch.autocast_increment_nesting()
    assert mt.autocast_decrement_nesting() == torch.autocast_decrement_nesting()
    assert mt.get_autocast_dtype("cuda") == mt.float16
    assert mt.is_autocast_cache_enabled() == torch.is_autocast_cache_enabled()
    mt.set_autocast_enabled("cpu", True)
    try:
        assert (mt.ones(2, 2) @ mt.ones(2, 2)).dtype == mt.bfloat16
    finally:
        mt.set_autocast_enabled("cpu", False)
    with pytest.warns(DeprecationWarning):
        assert mt.get_autocast_cpu_dtype() == mt.bfloat16
    with pytest.warns(DeprecationWarning):
        assert mt.is_autocast_cpu_enabled() is False


def test_autocast_in_one_thread_leaves_another_alone():
    import threading

    seen = []
    with mt.autocast("cpu"):
        t = threading.Thread(target=lambda: seen.append((mt.ones(2, 2) @ mt.ones(2, 2)).dtype))
        t.start()
        t.join()
    assert seen == [mt.float32]


def _warned(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, sorted({x.category.__name__ for x in w})


@pytest.mark.parametrize("make", [
    lambda m: m.autocast("cuda"), lambda m: m.autocast("cpu", dtype=m.float32),
    lambda m: m.autocast("cpu", dtype=m.float64), lambda m: m.cuda.amp.autocast(),
    lambda m: m.cpu.amp.autocast(), lambda m: m.amp.GradScaler("cuda"),
    lambda m: m.cuda.amp.GradScaler(), lambda m: m.cpu.amp.GradScaler(),
    lambda m: m.amp.GradScaler("cpu"), lambda m: m.amp.GradScaler(),
])
def test_warnings_and_disabling_as_torch(make):
    if mt.cuda.is_available():
        pytest.skip("these are the answers of a machine without a GPU")
    ours, ow = _warned(lambda: make(mt))
    theirs, tw = _warned(lambda: make(torch))
    assert ow == tw
    enabled = getattr(theirs, "_enabled", None)
    if isinstance(theirs, torch.amp.GradScaler):
        assert ours.is_enabled() == theirs.is_enabled()
        assert ours.state_dict() == theirs.state_dict()
        assert ours.get_scale() == theirs.get_scale()
    else:
        assert ours._enabled == enabled


@pytest.mark.parametrize("call", [
    lambda m: m.autocast(1), lambda m: m.autocast("nodevice"),
    lambda m: m.amp.is_autocast_available("nodevice"), lambda m: m.is_autocast_enabled("nodev"),
    lambda m: m.amp.GradScaler("cpu", growth_factor=1.0),
    lambda m: m.amp.GradScaler("cpu", backoff_factor=1.0),
    lambda m: m.amp.GradScaler("cpu").load_state_dict({}),
    lambda m: m.amp.GradScaler("cpu").scale(3.0),
    lambda m: m.amp.GradScaler("cpu").update(),
    lambda m: m.amp.GradScaler("cpu").step(None),
])
def test_bad_inputs_raise_torchs_error_types(call):
    with pytest.raises(Exception) as ours:
        call(mt)
    with pytest.raises(Exception) as theirs:
        call(torch)
    assert isinstance(ours.value, type(theirs.value))


def _loop(m, inject):
    """Five steps of SGD through a GradScaler; step ``inject`` gets an inf gradient."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    lin = m.nn.Linear(3, 2)
    with m.no_grad():
        lin.weight.copy_(m.tensor(w0))
        lin.bias.zero_()
    opt = m.optim.SGD(lin.parameters(), lr=0.1)
    scaler = m.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2)
    history = []
    for step in range(5):
        x = m.tensor(rng.standard_normal((4, 3)).astype(np.float32))
        opt.zero_grad()
        with m.autocast("cpu"):
            loss = (lin(x).float() ** 2).mean()
        scaler.scale(loss).backward()
        if step == inject:
            lin.bias.grad[0] = float("inf")
        out = scaler.step(opt)
        scaler.update()
        history.append((scaler.get_scale(), scaler._get_growth_tracker(), out,
                        lin.weight.detach().numpy().copy()))
    return history, scaler.state_dict()


def test_training_loop_with_an_inf_gradient_matches_torch():
    ours, osd = _loop(mt, inject=2)
    theirs, tsd = _loop(torch, inject=2)
    assert osd == tsd
    for (s, g, out, w), (ts, tg, tout, tw) in zip(ours, theirs):
        assert (s, g, out) == (ts, tg, tout)
        np.testing.assert_allclose(w, tw, rtol=1e-2, atol=1e-3)
    assert np.array_equal(ours[2][3], ours[1][3])  # the step with inf was skipped
    assert ours[2][0] == ours[1][0] * 0.5


def test_unscale_state_machine_and_state_dict_roundtrip():
    p = mt.nn.Parameter(mt.ones(3))
    opt = mt.optim.SGD([p], lr=0.1)
    s = mt.amp.GradScaler("cpu", init_scale=4.0)
    s.scale((p * 2).sum()).backward()
    assert p.grad.tolist() == [8.0, 8.0, 8.0]
    s.unscale_(opt)
    assert p.grad.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RuntimeError):
        s.unscale_(opt)
    with pytest.raises(RuntimeError):
        s.step(opt, closure=lambda: 0)
    s.step(opt)
    with pytest.raises(RuntimeError):
        s.step(opt)
    with pytest.raises(RuntimeError):
        s.unscale_(opt)
    s.update()
    s.update(32.0)
    assert s.get_scale() == 32.0
    with pytest.raises(AssertionError):
        s.update(mt.tensor([1.0, 2.0]))
    s2 = mt.amp.GradScaler("cpu")
    s2.load_state_dict(s.state_dict())
    assert s2.state_dict() == s.state_dict()
    s3 = pickle.loads(pickle.dumps(s))
    assert s3.get_scale() == 32.0


def test_custom_fwd_casts_and_turns_autocast_off():
    seen = {}

    class Mul(mt.autograd.Function):
        @staticmethod
        @mt.amp.custom_fwd(device_type="cpu", cast_inputs=mt.float32)
        def forward(ctx, x, w):
            seen["fwd"] = (x.dtype, mt.is_autocast_enabled("cpu"))
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        @mt.amp.custom_bwd(device_type="cpu")
        def backward(ctx, g):
            seen["bwd"] = mt.is_autocast_enabled("cpu")
            x, w = ctx.saved_tensors
            return g @ w.T, x.T @ g

    x = mt.ones(2, 3, dtype=mt.bfloat16, requires_grad=True)
    w = mt.ones(3, 2, requires_grad=True)
    with mt.autocast("cpu"):
        y = Mul.apply(x, w)
    assert y.dtype == mt.float32 and seen["fwd"] == (mt.float32, False)
    y.sum().backward()
    assert seen["bwd"] is True and x.grad.dtype == mt.bfloat16
    with pytest.raises(TypeError):
        mt.amp.custom_fwd(lambda ctx: None)


@pytest.fixture
def simulated_cuda_autocast(monkeypatch):
    """CUDA's policies applied to CPU tensors: the tables and entry points are exercised
    without a GPU (the dtypes asserted are those torch's CUDA autocast reference lists)."""
    from mpitensor._core import autocast as _autocast

    monkeypatch.setattr(_autocast, "_device_type", lambda t: "cuda")
    _autocast.set_enabled("cuda", True)
    yield
    _autocast.set_enabled("cuda", False)


CUDA_DTYPES = {
    "mv": (lambda a: mt.mv(a, a[0]), mt.float16),
    "addmv": (lambda a: mt.addmv(a[0], a, a[0]), mt.float16),
    "linear": (lambda a: F_linear(a, a), mt.float16),
    "exp": (lambda a: a.half().exp(), mt.float32),
    "log": (lambda a: a.half().abs().log(), mt.float32),
    "rsqrt": (lambda a: a.half().abs().rsqrt(), mt.float32),
    "arcsin": (lambda a: (a.half() / 10).arcsin(), mt.float32),
    "pow": (lambda a: a.half() ** 2, mt.float32),
    "rpow": (lambda a: 2 ** a.half(), mt.float32),
    "sum": (lambda a: a.half().sum(), mt.float32),
    "sum_dtype": (lambda a: a.half().sum(dtype=mt.float16), mt.float16),
    "cumsum": (lambda a: a.half().cumsum(0), mt.float32),
    "softmax": (lambda a: mt.softmax(a.half(), 1), mt.float32),
    "layer_norm": (lambda a: mt.nn.functional.layer_norm(a.half(), (4,)), mt.float32),
    "logsumexp": (lambda a: a.half().logsumexp(1), mt.float32),
    "dot_promote": (lambda a: mt.dot(a[0].half(), a[1]), mt.float32),
    "relu_unlisted": (lambda a: a.half().relu(), mt.float16),
    "exp_inplace_unlisted": (lambda a: a.half().exp_(), mt.float16),
}


def F_linear(a, w):  # noqa: N802
    return mt.nn.functional.linear(a, w)


@pytest.mark.parametrize("name", sorted(CUDA_DTYPES))
def test_cuda_policies_on_simulated_device(simulated_cuda_autocast, name):
    fn, want = CUDA_DTYPES[name]
    a = mt.tensor(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    assert fn(a).dtype == want


def test_cuda_binary_cross_entropy_is_refused(simulated_cuda_autocast):
    p = mt.full((3,), 0.5)
    with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
        mt.nn.functional.binary_cross_entropy(p, p)


NORMS = {
    "batch_norm_train": lambda m, x, w, b: m.nn.functional.batch_norm(
        x, m.zeros(4), m.ones(4), w, b, training=True),
    "batch_norm_eval": lambda m, x, w, b: m.nn.functional.batch_norm(
        x, m.full((4,), 0.1), m.full((4,), 2.0), w, b),
    "group_norm": lambda m, x, w, b: m.nn.functional.group_norm(x, 2, w, b),
    "layer_norm": lambda m, x, w, b: m.nn.functional.layer_norm(x, (4, 3), w.reshape(4, 1)
                                                                .expand(4, 3), None),
    "instance_norm": lambda m, x, w, b: m.nn.functional.instance_norm(x, weight=w, bias=b),
}


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_norms_take_a_half_input_with_float32_parameters(name, dtype):
    """As autocast hands them over (a conv's bfloat16 output, float32 weights): float32
    arithmetic, the input's dtype out, float32 parameter gradients."""
    fn = NORMS[name]
    (x, tx), (w, tw), (b, tb) = _pair((2, 4, 3), 0), _pair((4,), 1, grad=True), \
        _pair((4,), 2, grad=True)
    x = x.to(getattr(mt, dtype)).requires_grad_()
    tx = tx.to(getattr(torch, dtype)).requires_grad_()
    y, ty = fn(mt, x, w, b), fn(torch, tx, tw, tb)
    _close(y, ty, atol=0)
    y.float().pow(2).sum().backward()
    ty.float().pow(2).sum().backward()
    assert x.grad.dtype == getattr(mt, dtype) and w.grad.dtype == mt.float32
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=4 * BF16_RTOL, atol=1e-2)
    np.testing.assert_allclose(x.grad.float().numpy(), tx.grad.float().numpy(),
                               rtol=4 * BF16_RTOL, atol=5e-2)



def _block(m):
    """A transformer block and a conv/norm stack under CPU autocast, as programs write them;
    returns each stage's output and a gradient."""
    rng = np.random.default_rng(0)
    F = m.nn.functional  # noqa: N806 - the usual name
    mods = {"ln": m.nn.LayerNorm(8), "qkv": m.nn.Linear(8, 24), "proj": m.nn.Linear(8, 8),
            "bn": m.nn.BatchNorm1d(8), "emb": m.nn.Embedding(10, 8),
            "conv": m.nn.Conv1d(8, 8, 3, padding=1), "gn": m.nn.GroupNorm(2, 8)}
    for mod in mods.values():
        for p in mod.parameters():
            with m.no_grad():
                p.copy_(m.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32)))
    idx = m.tensor(rng.integers(0, 10, (2, 5)))
    out = {}
    with m.autocast("cpu"):
        out["emb"] = x = mods["emb"](idx)
        out["ln"] = h = mods["ln"](x)
        out["qkv"] = qkv = mods["qkv"](h)
        q, k, v = qkv.split(8, dim=-1)
        out["sdpa"] = att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out["resid"] = y = x + mods["proj"](att)
        out["gelu"] = g = F.gelu(y)
        out["conv"] = c = mods["conv"](g.transpose(1, 2))
        out["bn"] = b = mods["bn"](c)
        out["gn"] = mods["gn"](c)
        out["softmax"] = b.softmax(-1)
        out["loss"] = loss = F.cross_entropy(b.mean(-1), m.tensor([1, 2]))
    loss.backward()
    out["grad_qkv"] = mods["qkv"].weight.grad
    return out


def test_blocks_under_autocast_match_torch_stage_by_stage():
    ours, theirs = _block(mt), _block(torch)
    for key, y in ours.items():
        ty = theirs[key]
        # each stage re-rounds to bfloat16: allow two ulps of the stage's largest value
        scale = float(ty.detach().float().abs().max())
        _close(y, ty, rtol=0, atol=2 * 2.0**-7 * scale)


def _recurrent_and_attention(m):
    m.manual_seed(0)
    rng = np.random.default_rng(1)
    lstm = m.nn.LSTM(4, 5, num_layers=2, batch_first=True)
    gru = m.nn.GRU(4, 5)
    mha = m.nn.MultiheadAttention(8, 2, batch_first=True)
    for mod in (lstm, gru, mha):
        for p in mod.parameters():
            with m.no_grad():
                p.copy_(m.tensor(rng.uniform(-0.5, 0.5, tuple(p.shape)).astype(np.float32)))
    x = m.tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
    z = m.tensor(rng.standard_normal((2, 3, 8)).astype(np.float32))
    with m.autocast("cpu"):
        out, (h, c) = lstm(x)
        got = {"lstm": out, "lstm_h": h, "lstm_c": c, "gru": gru(x)[0]}
        got["mha"], got["mha_w"] = mha(z, z, z)
    (got["lstm"].float().sum() + got["mha"].float().sum()).backward()
    got["lstm_grad"] = lstm.weight_hh_l1.grad
    got["mha_grad"] = mha.in_proj_weight.grad
    return got


def test_lstm_and_multihead_attention_under_autocast_match_torch():
    ours, theirs = _recurrent_and_attention(mt), _recurrent_and_attention(torch)
    for key, y in ours.items():
        # torch's LSTM computes in bfloat16 throughout (ours in float32, rounded once): its
        # gates' roundings add up over the 3 steps and 2 layers, a few ulps of values below 1
        _close(y, theirs[key], rtol=0, atol=8 * 2.0**-8)


def test_scaler_inf_checks_that_libraries_call_match_torch():
    def run(m):
        p = m.nn.Parameter(m.ones(3))
        opt = m.optim.SGD([p], lr=0.1)
        s = m.amp.GradScaler("cpu", init_scale=8.0)
        s.scale((p * 2).sum()).backward()
        p.grad[1] = float("nan")
        flags = s._check_inf_per_device(opt)
        kept = p.grad.tolist()
        return ({str(k): v.tolist() for k, v in flags.items()},
                {str(k): v.tolist() for k, v in s._found_inf_per_device(opt).items()}, kept,
                float(s._get_scale_async()))

    ours, theirs = run(mt), run(torch)
    assert ours[0] == theirs[0] == ours[1] == theirs[1] == {"cpu": 1.0}
    np.testing.assert_array_equal(ours[2], theirs[2])  # not unscaled
    assert ours[3] == theirs[3] == 8.0
