# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3.flash_attn_func vs torch: forward (out, lse) and gradients (dq, dk, dv, through lse too).

Tolerance of out and the gradients (FlashAttention's rule): err(flash3 vs fp32 reference) <=
2 * err(plain PyTorch in the same low precision vs fp32 reference) + atol, atol the dtype's
rounding error at the reference's magnitude. The fp32 reference is torch SDPA, math backend, on
fp32 upcasts, or the explicit math of ref.attention_ref.
Tolerance of softmax_lse: the C++ GPU tests' rule (ref.check_close), err <= 2 * err(plain
low-precision lse, ref.lse_lowp) + 1e-5, no NaN, -inf exactly where the reference has it.

Mask and scale cases follow FlashAttention-3's rules (window sides drawn uniformly in
[0, seqlen_k) as in FlashAttention's own tests, windows beyond the sequence and beyond int32,
causal with a window, softmax_scale None / 0 / other numbers).

softcap (FlashAttention-3's tanh soft-capping, s -> softcap * tanh(s / softcap) after the scale,
before the mask): out, softmax_lse, dq, dk, dv against ref.attention_ref(softcap=...) with the
same rules at FlashAttention-3's softcap factor 3 instead of 2 (ref.tol_factor: the kernels'
hardware tanh approximation; the low-precision baseline rounds the capped scores to the dtype,
as the C++ GPU reference does), softcap 5 and 30 over dtypes, head dims, masks and MHA / GQA, softcap 1
(saturated scores), explicit softmax_scale (0 included), local windows, deterministic backward,
torch.compile and opcheck. They skip where the build lacks the softcap kernels (CMake
FLASH3_FEATURES without "softcap").

pack_gqa (PackGQA, forward only): GQA and MQA with pack_gqa None / True / False, seqlen_q 1, 7
and 133 (one row, a partial group of rows, more than one tile once packed), no mask / causal /
local, against the same reference with the same rules (the results do not depend on it); the
backward after a packed forward; softcap and MHA with pack_gqa=True (no packed kernel: the
unpacked one runs); torch.compile and opcheck with pack_gqa.

Gradient tests skip (with the reason) while this build has no backward kernel for the case.
"""
import random
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flash3 needs a Hopper (sm_90) GPU", allow_module_level=True)

import flash3  # noqa: E402
from flash3 import flash_attn_func  # noqa: E402
from builds import skip_unless_built as _skip_unless_built  # noqa: E402
from builds import skip_unless_softcap_built as _skip_unless_softcap_built  # noqa: E402
from builds import softcap_built  # noqa: E402
from ref import attention_ref, check_close, lse_lowp, max_err, rounding_atol, sdpa_ref, tol_factor  # noqa: E402

DEVICE = "cuda"
EPS_LSE = 1e-5  # kEpsLse of tests/gpu/test_fwd_gpu.cpp
INT32_MAX = 2 ** 31 - 1

HDIMS = [(64, 64), (128, 128), (256, 256), (192, 128)]
SEQLENS = [(128, 128), (1000, 1000), (113, 1023), (1023, 113)]
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "window128x0": (False, (128, 0))}
HEADS = {"mha": (4, 4), "gqa": (8, 2)}


def _inputs(b, sq, sk, hq, hk, d, dv, dtype, requires_grad=False, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device=DEVICE, dtype=dtype, generator=g)
    k = torch.randn(b, sk, hk, d, device=DEVICE, dtype=dtype, generator=g)
    v = torch.randn(b, sk, hk, dv, device=DEVICE, dtype=dtype, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _assert_close_fa(name, ours, ref, base, dtype, rtol=2.0):
    """FlashAttention rule: |ours - ref| <= rtol * |base - ref| + atol."""
    e_ours = max_err(ours, ref)
    e_base = max_err(base, ref)
    atol = rounding_atol(ref, dtype)
    assert not torch.isnan(ours).any(), f"{name}: NaN"
    assert e_ours <= rtol * e_base + atol, (
        f"{name}: max|flash3 - ref| = {e_ours:.3e} > {rtol} * max|torch {dtype} - ref| ({e_base:.3e}) + {atol:.1e}")


def _assert_lse_close(lse, q, k, v, causal=False, window=(-1, -1), softmax_scale=None, what="", softcap=0.0):
    """The C++ rule: max|lse - ref| <= 2 * max|lse_lowp - ref| + EPS_LSE, no NaN."""
    q, k, v = q.detach(), k.detach(), v.detach()
    _, lse_ref = attention_ref(q, k, v, causal, window, softmax_scale, upcast=True, softcap=softcap)
    lse_low = lse_lowp(q, k, causal, window, softmax_scale, softcap=softcap)
    ok, err, base, bound, nans = check_close(lse, lse_ref, lse_low, EPS_LSE, tol_factor(softcap))
    assert ok, (f"lse{what}: max|flash3 - ref| = {err:.3e} > {tol_factor(softcap)} * max|lowp - ref| ({base:.3e}) + {EPS_LSE:.0e} "
                f"= {bound:.3e}; NaN entries: {nans}")


def _check_fwd_bwd(q, k, v, causal, window, softmax_scale=None, backward=True, what="", softcap=0.0,
                   deterministic=False, pack_gqa=None):
    """flash3 vs ref.attention_ref (explicit fp32 math, int64 mask): out and lse, then dq, dk, dv
    of a loss using both out and lse. q, k, v require grad. Returns flash3's (out, lse, grads)."""
    dtype = q.dtype
    sq, hq, dv = q.shape[1], q.shape[2], v.shape[3]
    g = torch.Generator(device=DEVICE).manual_seed(q.shape[1] * 7 + k.shape[1])
    g_out = torch.randn(q.shape[0], sq, hq, dv, device=DEVICE, generator=g)
    g_lse = torch.randn(q.shape[0], hq, sq, device=DEVICE, generator=g)

    def run(fn):
        for t in (q, k, v):
            t.grad = None
        out, lse = fn()
        if not backward:
            return out.detach(), lse.detach(), None
        # -inf lse entries (rows that see no key) carry no gradient
        loss = (out.float() * g_out).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * g_lse).sum()
        loss.backward()
        return out.detach(), lse.detach(), tuple(t.grad.clone() for t in (q, k, v))

    out, lse, grads = run(lambda: flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                                  window_size=window, softcap=softcap, deterministic=deterministic,
                                                  pack_gqa=pack_gqa, return_lse=True))
    out_r, _, grads_r = run(lambda: attention_ref(q, k, v, causal, window, softmax_scale, upcast=True,
                                                  softcap=softcap))
    out_b, _, grads_b = run(lambda: attention_ref(q, k, v, causal, window, softmax_scale, upcast=False,
                                                  softcap=softcap))
    _assert_close_fa(f"out{what}", out, out_r, out_b, dtype, tol_factor(softcap))
    _assert_lse_close(lse, q, k, v, causal, window, softmax_scale, what, softcap=softcap)
    if backward:
        for name, o, r, b in zip(("dq", "dk", "dv"), grads, grads_r, grads_b):
            _assert_close_fa(f"{name}{what}", o, r, b, dtype, tol_factor(softcap))
    return out, lse, grads


# ---------------------------------------------------------------------------
# Forward.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{a}_sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("hdim", HDIMS, ids=[f"d{a}x{b}" for a, b in HDIMS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_forward(dtype, hdim, seqlens, mask, heads):
    d, dv = hdim
    sq, sk = seqlens
    causal, window = MASKS[mask]
    hq, hk = HEADS[heads]
    _skip_unless_built(dtype, d, dv)
    q, k, v = _inputs(2, sq, sk, hq, hk, d, dv, dtype)
    out, lse = flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    assert out.shape == (2, sq, hq, dv) and out.dtype == dtype
    assert lse.shape == (2, hq, sq) and lse.dtype == torch.float32
    out_ref = sdpa_ref(q, k, v, causal, window)
    out_base, _ = attention_ref(q, k, v, causal, window, upcast=False)
    _assert_close_fa("out", out, out_ref, out_base, dtype)
    # lse: natural log, (b, hq, sq); -inf exactly where a row sees no key.
    _assert_lse_close(lse, q, k, v, causal, window)


def test_return_conventions():
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(1, 64, 64, 2, 2, 128, 128, torch.bfloat16)
    out = flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor)
    out2, lse = flash_attn_func(q, k, v, return_attn_probs=True)  # FlashAttention-3's name
    out3, lse3 = flash_attn_func(q, k, v, return_lse=True)
    assert torch.equal(out, out2) and torch.equal(out, out3) and torch.equal(lse, lse3)
    # positional order of flash_attn_interface: (q, k, v, softmax_scale, causal, qv, q_descale,
    # k_descale, v_descale, window_size, ...)
    o_pos = flash_attn_func(q, k, v, None, True, None, None, None, None, (-1, -1))
    o_kw = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(o_pos, o_kw)


SCALES = [None, 0.0, 0.05, 0.3, 1.0]


@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("scale", SCALES, ids=[f"scale{x}" for x in SCALES])
def test_softmax_scale(scale, causal):
    """None means 1/sqrt(head_dim); a number is used as given, 0 included (uniform weights)."""
    _skip_unless_built(torch.bfloat16, 64, 64)
    q, k, v = _inputs(2, 200, 300, 4, 4, 64, 64, torch.bfloat16, requires_grad=True)
    _check_fwd_bwd(q, k, v, causal, (-1, -1), scale, backward=False)


@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("scale", SCALES, ids=[f"scale{x}" for x in SCALES])
def test_softmax_scale_backward(scale, causal):
    """The backward uses the forward's scale: None and 0.0 stay distinct through autograd."""
    _skip_unless_built(torch.bfloat16, 64, 64, backward=True)
    q, k, v = _inputs(2, 200, 300, 4, 2, 64, 64, torch.bfloat16, requires_grad=True, seed=5)
    _check_fwd_bwd(q, k, v, causal, (-1, -1), scale)


def test_softmax_scale_zero_is_uniform_attention():
    """softmax_scale=0: out is the mean of v over the visible keys, lse = log(count), dq = dk = 0."""
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    sq, sk = 300, 200
    q, k, v = _inputs(1, sq, sk, 2, 2, 128, 128, torch.bfloat16, requires_grad=True, seed=11)
    out, lse = flash_attn_func(q, k, v, softmax_scale=0.0, window_size=(50, 20), return_lse=True)
    i = torch.arange(sq, device=DEVICE).view(-1, 1)
    j = torch.arange(sk, device=DEVICE).view(1, -1)
    vis = (j >= i + sk - sq - 50) & (j <= i + sk - sq + 20)
    count = vis.sum(dim=1).double()
    mean_v = torch.einsum("qk,bkhd->bqhd", vis.double(), v.detach().double()) / count.clamp(min=1).view(1, -1, 1, 1)
    expected_lse = torch.where(count > 0, count.log(), torch.full_like(count, float("-inf")))
    torch.testing.assert_close(out.double(), mean_v, atol=1e-2, rtol=1e-2)
    expected_lse = expected_lse.expand_as(lse)
    ok, err, _, _, _ = check_close(lse, expected_lse, expected_lse, EPS_LSE)
    assert ok, f"lse err {err:.3e} vs log(count)"
    dq, dk, _ = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert torch.count_nonzero(dq) == 0 and torch.count_nonzero(dk) == 0


def test_strided_inputs_from_packed_qkv():
    """q, k, v as views of one packed (b, s, 3, h, d) tensor: non-contiguous but head_dim stride 1."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    qkv = torch.randn(2, 257, 3, 4, 128, device=DEVICE, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous()
    out = flash_attn_func(q, k, v, causal=True)
    ref = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("layout", ["b_s_3_h_d", "b_s_hq+2hk_d"])
def test_qkvpacked(layout, causal):
    """flash_attn_qkvpacked_func is flash_attn_func on the views of qkv: the same out, lse and,
    through the views, the same gradient of qkv (deterministic backward: bitwise)."""
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    g = torch.Generator(device=DEVICE).manual_seed(7)
    if layout == "b_s_3_h_d":
        qkv = torch.randn(2, 257, 3, 4, 128, device=DEVICE, dtype=torch.bfloat16, generator=g)
        kw = {}

        def views(t):
            return t.unbind(dim=2)
    else:  # GQA: 8 q heads, 2 kv heads
        qkv = torch.randn(2, 257, 8 + 2 * 2, 128, device=DEVICE, dtype=torch.bfloat16, generator=g)
        kw = dict(num_heads_q=8)

        def views(t):
            return t.split([8, 2, 2], dim=2)
    qkv.requires_grad_(True)
    out, lse = flash3.flash_attn_qkvpacked_func(qkv, causal=causal, deterministic=True, return_attn_probs=True,
                                                **kw)
    assert out.shape == (2, 257, qkv.shape[3] if qkv.dim() == 5 else 8, 128)
    g_out = torch.randn(out.shape, device=DEVICE, dtype=out.dtype, generator=g)
    (dqkv,) = torch.autograd.grad(out, (qkv,), g_out)
    ref_in = qkv.detach().clone().requires_grad_(True)
    out_r, lse_r = flash_attn_func(*views(ref_in), causal=causal, deterministic=True, return_attn_probs=True)
    (dqkv_r,) = torch.autograd.grad(out_r, (ref_in,), g_out)
    torch.testing.assert_close(out, out_r, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse_r, atol=0, rtol=0)
    assert dqkv.shape == qkv.shape
    torch.testing.assert_close(dqkv, dqkv_r, atol=0, rtol=0)
    # And against the reference itself (so the comparison above cannot pass by both being wrong).
    q, k, v = (t.detach() for t in views(qkv))
    expected = sdpa_ref(q, k, v, causal, (-1, -1))
    base, _ = attention_ref(q, k, v, causal, (-1, -1), upcast=False)
    _assert_close_fa("out", out.detach(), expected, base, torch.bfloat16)


def test_empty_batch_and_seqlen():
    _skip_unless_built(torch.bfloat16, 64, 64)
    q, k, v = _inputs(0, 16, 16, 2, 2, 64, 64, torch.bfloat16)
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    assert out.shape == (0, 16, 2, 64) and lse.shape == (0, 2, 16)
    q, k, v = _inputs(2, 0, 16, 2, 2, 64, 64, torch.bfloat16)
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    assert out.shape == (2, 0, 2, 64) and lse.shape == (2, 2, 0)


def test_inference_mode_and_no_grad():
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(1, 128, 128, 2, 2, 128, 128, torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        a = flash_attn_func(q, k, v)
    assert a.grad_fn is None and not a.requires_grad
    with torch.inference_mode():
        b = flash_attn_func(q.detach(), k.detach(), v.detach())
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_current_stream():
    """The kernel runs on the caller's current stream."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 512, 512, 4, 4, 128, 128, torch.bfloat16)
    ref = flash_attn_func(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flash_attn_func(q, k, v)
        done = torch.cuda.Event()
        done.record(s)
    done.synchronize()
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


# ---------------------------------------------------------------------------
# Backward.
# ---------------------------------------------------------------------------
def _grads(fn, q, k, v, g_out, g_lse=None):
    for t in (q, k, v):
        t.grad = None
    out, lse = fn(q, k, v)
    loss = (out.float() * g_out).sum()
    if g_lse is not None:
        loss = loss + (lse * g_lse).sum()
    loss.backward()
    return out, lse, q.grad.clone(), k.grad.clone(), v.grad.clone()


@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{a}_sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("hdim", HDIMS, ids=[f"d{a}x{b}" for a, b in HDIMS])
def test_backward(hdim, seqlens, mask, heads, dtype=torch.bfloat16):
    d, dv = hdim
    sq, sk = seqlens
    causal, window = MASKS[mask]
    hq, hk = HEADS[heads]
    _skip_unless_built(dtype, d, dv, backward=True)
    q, k, v = _inputs(2, sq, sk, hq, hk, d, dv, dtype, requires_grad=True)
    g_out = torch.randn(2, sq, hq, dv, device=DEVICE)

    def ours(q, k, v):
        return flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)

    def ref(q, k, v):
        return sdpa_ref(q, k, v, causal, window), None

    def base(q, k, v):
        return attention_ref(q, k, v, causal, window, upcast=False)

    _, _, dq, dk, dv_ = _grads(ours, q, k, v, g_out)
    _, _, dq_r, dk_r, dv_r = _grads(ref, q, k, v, g_out)
    _, _, dq_b, dk_b, dv_b = _grads(base, q, k, v, g_out)
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    _assert_close_fa("dq", dq, dq_r, dq_b, dtype)
    _assert_close_fa("dk", dk, dk_r, dk_b, dtype)
    _assert_close_fa("dv", dv_, dv_r, dv_b, dtype)


@pytest.mark.parametrize("use_out", [True, False], ids=["out_and_lse", "lse_only"])
@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("hdim", [(64, 64), (128, 128)], ids=["d64", "d128"])
def test_backward_through_lse(hdim, causal, use_out, dtype=torch.bfloat16):
    """The loss uses the returned softmax_lse: gradients include the dlse term."""
    d, dv = hdim
    _skip_unless_built(dtype, d, dv, backward=True)
    b, sq, sk, hq, hk = 2, 300, 517, 4, 2  # sq <= sk: no empty rows (lse finite everywhere)
    q, k, v = _inputs(b, sq, sk, hq, hk, d, dv, dtype, requires_grad=True, seed=3)
    g_out = torch.randn(b, sq, hq, dv, device=DEVICE) if use_out else torch.zeros(b, sq, hq, dv, device=DEVICE)
    g_lse = torch.randn(b, hq, sq, device=DEVICE)

    def run(fn):
        for t in (q, k, v):
            t.grad = None
        out, lse = fn()
        loss = (lse * g_lse).sum()
        if use_out:
            loss = loss + (out.float() * g_out).sum()
        loss.backward()
        # lse does not depend on v: with the lse-only loss the references leave v.grad None
        return tuple(torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in (q, k, v))

    ours = run(lambda: flash_attn_func(q, k, v, causal=causal, return_lse=True))
    ref = run(lambda: attention_ref(q, k, v, causal, upcast=True))
    base = run(lambda: attention_ref(q, k, v, causal, upcast=False))
    for name, o, r, bb in zip(("dq", "dk", "dv"), ours, ref, base):
        _assert_close_fa(name, o, r, bb, dtype)


def test_unused_lse_is_not_a_gradient():
    """return_lse=True but the loss ignores lse: same grads as return_lse=False."""
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    q, k, v = _inputs(2, 256, 256, 4, 4, 128, 128, torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 256, 4, 128, device=DEVICE, dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=True, deterministic=True)
    a = torch.autograd.grad(out, (q, k, v), g)
    out, _ = flash_attn_func(q, k, v, causal=True, deterministic=True, return_lse=True)
    b = torch.autograd.grad(out, (q, k, v), g)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
def test_deterministic_backward_is_bitwise_reproducible(causal, heads):
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    hq, hk = HEADS[heads]
    q, k, v = _inputs(2, 1000, 1000, hq, hk, 128, 128, torch.bfloat16, requires_grad=True, seed=7)
    g = torch.randn(2, 1000, hq, 128, device=DEVICE, dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        out = flash_attn_func(q, k, v, causal=causal, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), g))
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic backward passes"


def test_grad_of_non_contiguous_dout():
    """dout arriving expanded / strided (e.g. from out.sum() or a slice) is handled."""
    _skip_unless_built(torch.bfloat16, 64, 64, backward=True)
    q, k, v = _inputs(2, 128, 128, 4, 4, 64, 64, torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v)
    dq1, = torch.autograd.grad(out.sum(), (q,))  # dout: expanded ones (all strides 0)
    out = flash_attn_func(q, k, v)
    dq2, = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert torch.equal(dq1, dq2)


# ---------------------------------------------------------------------------
# Mask rules (FlashAttention-3's): negative = unbounded, causal forces right = 0 and keeps left,
# sides beyond the sequence (and beyond int32) cut nothing.
# ---------------------------------------------------------------------------
BIG_WINDOWS = {
    "l-1_rINT32MAX": (False, (-1, INT32_MAX)),
    "lINT32MAX_r-1": (False, (INT32_MAX, -1)),
    "l2pow40_r0": (False, (2 ** 40, 0)),
    "lINT32MAX_rINT32MAX": (False, (INT32_MAX, INT32_MAX)),
    "l-2_r-2pow40": (False, (-2, -2 ** 40)),
    "causal_l2pow40_r2pow40": (True, (2 ** 40, 2 ** 40)),
    "causal_l-7_r5": (True, (-7, 5)),
    "causal_l100_rINT32MAX": (True, (100, INT32_MAX)),
}
BIG_WINDOW_SEQLENS = [(1000, 1000), (113, 1023), (1023, 113)]


@pytest.mark.parametrize("seqlens", BIG_WINDOW_SEQLENS, ids=[f"sq{a}_sk{b}" for a, b in BIG_WINDOW_SEQLENS])
@pytest.mark.parametrize("window", list(BIG_WINDOWS), ids=list(BIG_WINDOWS))
def test_window_beyond_sequence(window, seqlens):
    """Windows larger than the sequence, up to Python ints beyond int32, match the reference
    (whose int64 mask sees them as cutting nothing); forward and backward."""
    causal, ws = BIG_WINDOWS[window]
    sq, sk = seqlens
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, sq, sk, 4, 2, 128, 128, torch.bfloat16, requires_grad=True, seed=13)
    _check_fwd_bwd(q, k, v, causal, ws, backward=flash3.backward_is_built(torch.bfloat16, 128, 128))


def test_window_int32max_left_sq_longer_than_sk():
    """seqlen_q 2048 > seqlen_k 512 with window (2**31 - 1, 0): the first 1536 queries see no key
    (out 0, lse -inf), the others a bottom-right causal mask."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 2048, 512, 4, 4, 128, 128, torch.bfloat16, requires_grad=True, seed=17)
    _check_fwd_bwd(q, k, v, False, (INT32_MAX, 0), backward=flash3.backward_is_built(torch.bfloat16, 128, 128))
    out, lse = flash_attn_func(q.detach(), k.detach(), v.detach(), window_size=(INT32_MAX, 0), return_lse=True)
    assert torch.count_nonzero(out[:, :1536]) == 0 and bool(torch.isneginf(lse[:, :, :1536]).all())
    assert bool(torch.isfinite(lse[:, :, 1536:]).all())


def _run_fwd_bwd_deterministic(q, k, v, g, **kwargs):
    out, lse = flash_attn_func(q, k, v, deterministic=True, return_lse=True, **kwargs)
    grads = torch.autograd.grad(out, (q, k, v), g) if q.requires_grad else ()
    return (out, lse, *grads)


@pytest.mark.parametrize("right", [1, 5, INT32_MAX, 2 ** 40, -1], ids=["r1", "r5", "rINT32MAX", "r2pow40", "r-1"])
@pytest.mark.parametrize("left", [-1, 0, 64, 2 ** 40], ids=["l-1", "l0", "l64", "l2pow40"])
def test_causal_ignores_window_right(left, right):
    """causal=True with window_size=(left, right) is causal with (left, 0), bitwise, forward and
    (deterministic) backward; FlashAttention-3 code passes e.g. (left, -1) or (left, 5) with causal."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    bwd = flash3.backward_is_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 333, 517, 4, 2, 128, 128, torch.bfloat16, requires_grad=bwd, seed=19)
    g = torch.randn(2, 333, 4, 128, device=DEVICE, dtype=torch.bfloat16)
    got = _run_fwd_bwd_deterministic(q, k, v, g, causal=True, window_size=(left, right))
    want = _run_fwd_bwd_deterministic(q, k, v, g, causal=True, window_size=(left, 0))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), f"{name}: causal with window ({left}, {right}) differs from ({left}, 0)"


def test_causal_with_left_window_is_local_attention():
    """causal=True with a finite left window: local attention, j in [i + sk - sq - left, i + sk - sq]."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 700, 900, 4, 4, 128, 128, torch.bfloat16, requires_grad=True, seed=23)
    _check_fwd_bwd(q, k, v, True, (96, 7), backward=flash3.backward_is_built(torch.bfloat16, 128, 128))


def test_window_values_outside_int64_and_int32():
    """flash_attn_func takes any Python int (beyond int64 too); the operator takes int64 and maps
    values above INT32_MAX to INT32_MAX, negative ones to -1: all of these are (-1, -1) here."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(1, 256, 384, 2, 2, 128, 128, torch.bfloat16)
    want_out, want_lse = flash_attn_func(q, k, v, window_size=(-1, -1), return_lse=True)
    for ws in [(2 ** 70, -2 ** 70), (-2 ** 70, 2 ** 70), (2 ** 63 - 1, -2 ** 63)]:
        out, lse = flash_attn_func(q, k, v, window_size=ws, return_lse=True)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), f"window_size={ws}"
    for wl, wr in [(2 ** 40, 2 ** 40), (2 ** 63 - 1, -2 ** 63), (-5, INT32_MAX + 1)]:
        out, lse = torch.ops.flash3.fwd(q, k, v, None, False, wl, wr, 0.0, False)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), f"op window ({wl}, {wr})"


def _random_window_cases(n=40):
    """Shapes in turn; drawn per index with a fixed seed: head dims, heads, dtype, causal, and the
    window sides uniform in [0, seqlen_k) as in FlashAttention's tests."""
    shapes = [(128, 128), (113, 203), (256, 512), (512, 256), (1000, 1000), (113, 1023), (1023, 113),
              (64, 2048), (2048, 64), (1, 700), (700, 1)]
    hdims = [(64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128)]
    cases = []
    for i in range(n):
        r = random.Random(1000 + i)
        sq, sk = shapes[i % len(shapes)]
        d, dv = r.choice(hdims)
        heads = r.choice(list(HEADS))
        dtype = "fp16" if r.random() < 0.25 else "bf16"
        causal = r.random() < 0.4
        window = (r.randrange(sk), r.randrange(sk))
        cases.append((i, dtype, d, dv, sq, sk, heads, causal, window))
    return cases


RANDOM_WINDOW_CASES = _random_window_cases()


def _random_case_id(c):
    i, dtype, d, dv, sq, sk, heads, causal, (wl, wr) = c
    return f"{i:02d}-{dtype}-d{d}x{dv}-sq{sq}_sk{sk}-{heads}-{'causal-' if causal else ''}w{wl}_{wr}"


@pytest.mark.parametrize("case", RANDOM_WINDOW_CASES, ids=[_random_case_id(c) for c in RANDOM_WINDOW_CASES])
def test_random_window(case):
    i, dtype_name, d, dv, sq, sk, heads, causal, window = case
    dtype = torch.float16 if dtype_name == "fp16" else torch.bfloat16
    _skip_unless_built(dtype, d, dv)
    hq, hk = HEADS[heads]
    q, k, v = _inputs(2, sq, sk, hq, hk, d, dv, dtype, requires_grad=True, seed=100 + i)
    _check_fwd_bwd(q, k, v, causal, window, backward=flash3.backward_is_built(dtype, d, dv),
                   what=f" (causal={causal}, window={window})")


def test_opcheck():
    """torch.library.opcheck: schema, fake (meta) impl vs the real kernel, autograd registration,
    AOT dispatch (the torch.compile path), static and dynamic shapes."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 128, 192, 4, 2, 128, 128, torch.bfloat16)
    tests = ("test_schema", "test_faketensor")
    # numbers as softmax_scale (0 included), int64 windows, causal with a right window (ignored)
    arg_lists = [(None, True, -1, -1), (0.0, False, -1, -1), (0.3, True, 2 ** 40, 5), (None, False, 17, INT32_MAX)]
    for scale, causal, wl, wr in arg_lists:
        torch.library.opcheck(torch.ops.flash3.fwd.default, (q, k, v, scale, causal, wl, wr, 0.0, False),
                              test_utils=tests)
    if flash3.backward_is_built(torch.bfloat16, 128, 128):
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        for scale, causal, wl, wr in arg_lists:
            torch.library.opcheck(torch.ops.flash3.fwd.default, (q, k, v, scale, causal, wl, wr, 0.0, False),
                                  test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                              "test_aot_dispatch_dynamic"))


# ---------------------------------------------------------------------------
# softcap: s -> softcap * tanh(s / softcap) after the scale, before the mask; forward and
# backward (dS through the tanh), against ref.attention_ref(softcap=...).
# ---------------------------------------------------------------------------
def _softcap_cases():
    """dtype x head dim x softcap {5, 30} x mask {none, causal}; MHA / GQA alternate with the head
    dim and the mask (each dtype, softcap and mask meets both, and so does each head dim); the
    sequence lengths drawn per case from SEQLENS (a hash of the case)."""
    cases = []
    for dname in ("bf16", "fp16"):
        for hi, (d, dv) in enumerate(HDIMS):
            for softcap in (5.0, 30.0):
                for mi, mask in enumerate(("none", "causal")):
                    heads = list(HEADS)[(hi + mi) % 2]
                    key = f"softcap-{dname}-d{d}x{dv}-{softcap}-{mask}-{heads}"
                    seed = zlib.crc32(key.encode())
                    sq, sk = SEQLENS[seed % len(SEQLENS)]
                    cases.append((dname, d, dv, softcap, mask, heads, sq, sk, seed))
    return cases


SOFTCAP_CASES = _softcap_cases()


def _softcap_case_id(c):
    dname, d, dv, softcap, mask, heads, sq, sk, _ = c
    return f"{dname}-d{d}x{dv}-cap{softcap:g}-{mask}-{heads}-sq{sq}_sk{sk}"


@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=[_softcap_case_id(c) for c in SOFTCAP_CASES])
def test_softcap(case):
    """out, softmax_lse and (where the backward softcap kernel is built) dq, dk, dv of a loss using
    out and softmax_lse, against the fp32 reference with the capped scores."""
    dname, d, dv, softcap, mask, heads, sq, sk, seed = case
    dtype = torch.float16 if dname == "fp16" else torch.bfloat16
    causal, window = MASKS[mask]
    hq, hk = HEADS[heads]
    _skip_unless_softcap_built(dtype, d, dv)
    backward = flash3.backward_is_built(dtype, d, dv) and softcap_built(dtype, d, dv, backward=True)
    q, k, v = _inputs(2, sq, sk, hq, hk, d, dv, dtype, requires_grad=True, seed=seed % 1000)
    # scores of a few units at 1/sqrt(d) (N(0, 1) inputs): scaled up so that softcap 5 bends many
    # of them and softcap 30 some
    scale = 4.0 / d ** 0.5
    out, lse, _ = _check_fwd_bwd(q, k, v, causal, window, scale, backward=backward, softcap=softcap,
                                 what=f" (softcap={softcap}, causal={causal})")
    assert out.shape == (2, sq, hq, dv) and out.dtype == dtype
    assert lse.shape == (2, hq, sq) and lse.dtype == torch.float32
    # the capped scores are in (-softcap, softcap): lse <= log(visible keys) + softcap
    bound = torch.log(torch.tensor(float(sk))).item() + softcap * (1 + 1e-3) + 1e-3
    assert bool((lse[torch.isfinite(lse)] <= bound).all()), f"lse above log(seqlen_k) + softcap = {bound}"


@pytest.mark.parametrize("scale", [None, 0.0, 2.0], ids=["scaleNone", "scale0", "scale2"])
@pytest.mark.parametrize("softcap", [1.0, 5.0, 30.0], ids=["cap1", "cap5", "cap30"])
def test_softcap_scale_and_window(softcap, scale):
    """softcap with the default and explicit softmax_scale (0: every capped score 0, uniform
    weights; 2: softcap 1 and 5 saturate most scores) and a local window (causal with a left
    side), forward and backward."""
    dtype = torch.bfloat16
    _skip_unless_softcap_built(dtype, 128, 128)
    backward = flash3.backward_is_built(dtype, 128, 128) and softcap_built(dtype, 128, 128, backward=True)
    q, k, v = _inputs(2, 333, 517, 8, 2, 128, 128, dtype, requires_grad=True, seed=29)
    for causal, window in ((False, (-1, -1)), (True, (96, -1)), (False, (200, 7))):
        _check_fwd_bwd(q, k, v, causal, window, scale, backward=backward, softcap=softcap,
                       what=f" (softcap={softcap}, scale={scale}, causal={causal}, window={window})")


def test_softcap_scale_zero_is_uniform_attention():
    """softcap with softmax_scale=0: every capped score is 0, so out is the mean of v over the
    visible keys and lse = log(count), as without softcap (bitwise the same forward is not
    required: another kernel)."""
    _skip_unless_softcap_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(1, 300, 200, 2, 2, 128, 128, torch.bfloat16, seed=31)
    out, lse = flash_attn_func(q, k, v, softmax_scale=0.0, softcap=5.0, window_size=(50, 20), return_lse=True)
    want_out, want_lse = flash_attn_func(q, k, v, softmax_scale=0.0, window_size=(50, 20), return_lse=True)
    torch.testing.assert_close(out, want_out, atol=1e-2, rtol=1e-2)
    ok, err, _, _, _ = check_close(lse, want_lse, want_lse, EPS_LSE)
    assert ok, f"lse err {err:.3e} vs softcap-free softmax_scale=0"


def test_softcap_zero_is_no_softcap():
    """softcap=0.0 (the default) disables the capping: bitwise the plain kernel's results; a
    softcap far above every score gives (nearly) the plain results too."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 257, 300, 4, 2, 128, 128, torch.bfloat16, seed=37)
    want_out, want_lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    out, lse = flash_attn_func(q, k, v, causal=True, softcap=0.0, return_lse=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    if softcap_built(torch.bfloat16, 128, 128):
        out, lse = flash_attn_func(q, k, v, causal=True, softcap=1e4, return_lse=True)
        torch.testing.assert_close(out, want_out, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
def test_softcap_deterministic_backward_is_bitwise_reproducible(causal, heads):
    _skip_unless_softcap_built(torch.bfloat16, 128, 128, backward=True)
    hq, hk = HEADS[heads]
    q, k, v = _inputs(2, 1000, 1000, hq, hk, 128, 128, torch.bfloat16, requires_grad=True, seed=41)
    g = torch.randn(2, 1000, hq, 128, device=DEVICE, dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        out = flash_attn_func(q, k, v, causal=causal, softcap=30.0, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), g))
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic softcap backward passes"
    # and it is the right gradient
    _check_fwd_bwd(q, k, v, causal, (-1, -1), backward=True, softcap=30.0, deterministic=True,
                   what=" (softcap 30, deterministic)")


def test_softcap_compile_and_opcheck():
    """softcap through torch.compile(fullgraph=True) (forward and backward) computes what eager
    does; torch.library.opcheck of fwd with softcap (fake implementation, autograd, AOT dispatch)."""
    _skip_unless_softcap_built(torch.bfloat16, 128, 128)
    bwd = flash3.backward_is_built(torch.bfloat16, 128, 128) and softcap_built(torch.bfloat16, 128, 128, True)
    q, k, v = _inputs(2, 256, 320, 4, 2, 128, 128, torch.bfloat16, requires_grad=bwd, seed=43)
    g = torch.randn(2, 256, 4, 128, device=DEVICE, dtype=torch.bfloat16)

    def f(q, k, v):
        a, la = flash_attn_func(q, k, v, softcap=30.0, causal=True, deterministic=True, return_lse=True)
        b = flash_attn_func(q, k, v, softcap=5.0, softmax_scale=0.3, window_size=(64, 5), deterministic=True)
        return a, la, b

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    results = []
    for fn in (f, compiled):
        a, la, b = fn(q, k, v)
        grads = torch.autograd.grad((a.float() * g).sum() + la.sum() + (b.float() * g).sum(), (q, k, v)) if bwd else ()
        results.append((a.detach(), la.detach(), b.detach(), *grads))
    for name, x, y in zip(("out", "lse", "out2", "dq", "dk", "dv"), results[1], results[0]):
        if name == "lse" or name.startswith("out"):
            assert torch.equal(x, y), f"{name}: compiled differs from eager"
        else:  # the compiled graph may sum the loss's terms into dout / dlse in another order
            torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2)
    tests = ("test_schema", "test_faketensor")
    if bwd:
        tests += ("test_autograd_registration", "test_aot_dispatch_dynamic")
    arg_lists = [(None, True, -1, -1, 30.0), (0.3, False, 64, 5, 5.0), (0.0, False, -1, -1, 1.0)]
    for scale, causal, wl, wr, softcap in arg_lists:
        torch.library.opcheck(torch.ops.flash3.fwd.default, (q, k, v, scale, causal, wl, wr, softcap, True),
                              test_utils=tests)


# ---------------------------------------------------------------------------
# pack_gqa (PackGQA, forward only): the query heads of a KV head packed into one tile. Only the
# speed depends on it: every value must meet the reference with the usual rules.
# ---------------------------------------------------------------------------
PACK_GQA = [None, True, False]
PACK_IDS = ["packNone", "packTrue", "packFalse"]
PACK_HEADS = {"gqa": (8, 2), "mqa": (4, 1)}
PACK_SEQLENS = [(1, 300), (7, 300), (128 + 5, 300), (128 + 5, 64)]  # (seqlen_q, seqlen_k)
PACK_MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "local": (False, (17, 3))}
PACK_HDIMS = [(64, 64), (128, 128), (192, 128)]


@pytest.mark.parametrize("pack_gqa", PACK_GQA, ids=PACK_IDS)
@pytest.mark.parametrize("mask", list(PACK_MASKS), ids=list(PACK_MASKS))
@pytest.mark.parametrize("seqlens", PACK_SEQLENS, ids=[f"sq{a}_sk{b}" for a, b in PACK_SEQLENS])
@pytest.mark.parametrize("heads", list(PACK_HEADS), ids=list(PACK_HEADS))
@pytest.mark.parametrize("hdim", PACK_HDIMS, ids=[f"d{a}x{b}" for a, b in PACK_HDIMS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_pack_gqa(dtype, hdim, heads, seqlens, mask, pack_gqa):
    """out and softmax_lse (and, in bf16, the gradients of a loss using both: the backward never
    packs, whatever the forward did) against the reference for every pack_gqa."""
    d, dv = hdim
    sq, sk = seqlens
    hq, hk = PACK_HEADS[heads]
    causal, window = PACK_MASKS[mask]
    _skip_unless_built(dtype, d, dv)
    backward = dtype == torch.bfloat16 and flash3.backward_is_built(dtype, d, dv)
    seed = zlib.crc32(f"{d}x{dv}-{heads}-{sq}-{sk}".encode())
    q, k, v = _inputs(2, sq, sk, hq, hk, d, dv, dtype, requires_grad=backward, seed=seed)
    _check_fwd_bwd(q, k, v, causal, window, backward=backward, pack_gqa=pack_gqa,
                   what=f" (pack_gqa={pack_gqa}, hq={hq}, hkv={hk}, causal={causal}, window={window})")


@pytest.mark.parametrize("pack_gqa", PACK_GQA, ids=PACK_IDS)
def test_pack_gqa_without_a_packed_kernel(pack_gqa):
    """MHA and softcap have no packed kernel: pack_gqa=True runs the unpacked one (no error, same
    results as pack_gqa=False)."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 133, 300, 4, 4, 128, 128, torch.bfloat16, seed=51)
    want = flash_attn_func(q, k, v, causal=True, pack_gqa=False, return_lse=True)
    got = flash_attn_func(q, k, v, causal=True, pack_gqa=pack_gqa, return_lse=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), "MHA: pack_gqa changed the result"
    _check_fwd_bwd(q, k, v, True, (-1, -1), backward=False, pack_gqa=pack_gqa, what=f" (MHA, pack_gqa={pack_gqa})")
    if softcap_built(torch.bfloat16, 128, 128):
        q, k, v = _inputs(2, 7, 300, 8, 2, 128, 128, torch.bfloat16, seed=52)
        want = flash_attn_func(q, k, v, softcap=30.0, pack_gqa=False, return_lse=True)
        got = flash_attn_func(q, k, v, softcap=30.0, pack_gqa=pack_gqa, return_lse=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), "softcap: pack_gqa changed the result"
        _check_fwd_bwd(q, k, v, False, (-1, -1), backward=False, softcap=30.0, pack_gqa=pack_gqa,
                       what=f" (softcap 30, pack_gqa={pack_gqa})")


def test_pack_gqa_compile_and_opcheck():
    """pack_gqa through torch.compile(fullgraph=True) computes what eager does; torch.library.opcheck
    of fwd with an explicit pack_gqa (schema, fake implementation, autograd, AOT dispatch)."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    bwd = flash3.backward_is_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 7, 320, 8, 2, 128, 128, torch.bfloat16, requires_grad=bwd, seed=53)

    def f(q, k, v):
        a, la = flash_attn_func(q, k, v, causal=True, pack_gqa=True, deterministic=True, return_lse=True)
        b = flash_attn_func(q, k, v, pack_gqa=False, window_size=(64, 5), deterministic=True)
        c = flash_attn_func(q, k, v, pack_gqa=None, deterministic=True)
        return a, la, b, c

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    for x, y in zip(compiled(q, k, v), f(q, k, v)):
        assert torch.equal(x.detach(), y.detach()), "compiled differs from eager"
    tests = ("test_schema", "test_faketensor")
    if bwd:
        tests += ("test_autograd_registration", "test_aot_dispatch_dynamic")
    for pack in (-1, 0, 1):
        torch.library.opcheck(torch.ops.flash3.fwd.default, (q, k, v, None, True, -1, -1, 0.0, True, pack),
                              test_utils=tests)


# ---------------------------------------------------------------------------
# torch.compile and CUDA graphs.
# ---------------------------------------------------------------------------
class TinyAttention(torch.nn.Module):
    def __init__(self, dim=256, heads=4, kv_heads=2, head_dim=64):
        super().__init__()
        self.h, self.hk, self.d = heads, kv_heads, head_dim
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, self.h + 2 * self.hk, self.d).split([self.h, self.hk, self.hk], dim=2)
        out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
        return self.o(out.reshape(b, s, -1)) + lse.mean()


def test_compile_fullgraph_forward():
    _skip_unless_built(torch.bfloat16, 64, 64)
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = TinyAttention().to(DEVICE, torch.bfloat16)
    x = torch.randn(2, 256, 256, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = m(x)
        compiled = torch.compile(m, fullgraph=True)(x)  # fullgraph=True: any graph break raises
    torch.testing.assert_close(compiled, eager, atol=2e-2, rtol=2e-2)


def test_compile_fullgraph_forward_backward():
    _skip_unless_built(torch.bfloat16, 64, 64, backward=True)
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = TinyAttention().to(DEVICE, torch.bfloat16)
    x = torch.randn(2, 256, 256, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)

    def step(model):
        for p in m.parameters():
            p.grad = None
        x.grad = None
        y = model(x)
        y.float().square().mean().backward()
        return y.detach(), x.grad.clone(), m.qkv.weight.grad.clone()

    eager = step(m)
    compiled = step(torch.compile(m, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_compile_fullgraph_scale_and_window():
    """softmax_scale=0.0 and causal with a right window pass the fake implementation; the
    compiled call computes what the eager one does."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    torch._dynamo.reset()
    q, k, v = _inputs(2, 256, 320, 4, 2, 128, 128, torch.bfloat16)

    def f(q, k, v):
        a = flash_attn_func(q, k, v, softmax_scale=0.0)
        b = flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, window_size=(64, 5))
        c = flash_attn_func(q, k, v, window_size=(2 ** 40, 2 ** 31 - 1))
        return a, b, c

    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    for x, y in zip(compiled, eager):
        assert torch.equal(x, y)


def _graph_capture(fn, warmup=3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        result = fn()
    return g, result


def test_cuda_graph_forward():
    _skip_unless_built(torch.bfloat16, 128, 128)
    q, k, v = _inputs(2, 512, 700, 8, 2, 128, 128, torch.bfloat16)
    g, (out, lse) = _graph_capture(lambda: flash_attn_func(q, k, v, causal=True, return_lse=True))
    for seed in (1, 2):
        nq, nk, nv = _inputs(2, 512, 700, 8, 2, 128, 128, torch.bfloat16, seed=seed)
        q.copy_(nq)
        k.copy_(nk)
        v.copy_(nv)
        g.replay()
        ref_out, ref_lse = flash_attn_func(nq, nk, nv, causal=True, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_cuda_graph_forward_backward():
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    q, k, v = _inputs(2, 512, 700, 8, 2, 128, 128, torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 512, 8, 128, device=DEVICE, dtype=torch.bfloat16)

    def step():
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))

    g, static = _graph_capture(step)
    for seed in (1, 2):
        nq, nk, nv = _inputs(2, 512, 700, 8, 2, 128, 128, torch.bfloat16, seed=seed)
        with torch.no_grad():
            q.copy_(nq)
            k.copy_(nk)
            v.copy_(nv)
        dout.normal_()
        g.replay()
        eager = step()
        torch.cuda.synchronize()
        for name, a, b in zip(("out", "dq", "dk", "dv"), static, eager):
            assert torch.equal(a, b), f"{name}: graph replay differs from eager"


def test_math_sanity_of_reference():
    """The explicit-math reference agrees with torch SDPA, and with the closed form of
    softmax_scale=0 (keeps the test oracle honest)."""
    q, k, v = _inputs(2, 113, 1023, 8, 2, 64, 64, torch.float32)
    windows = [(False, (-1, -1)), (True, (-1, -1)), (False, (128, 0)), (False, (5, 17)), (True, (40, 9)),
               (False, (2 ** 40, INT32_MAX)), (True, (-3, 2 ** 40)), (False, (INT32_MAX, 0))]
    for causal, window in windows:
        for scale in (None, 0.3):
            a = sdpa_ref(q, k, v, causal, window, softmax_scale=scale)
            b, _ = attention_ref(q, k, v, causal, window, softmax_scale=scale)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # causal keeps the left window and drops the right one; huge sides cut nothing
    from ref import allowed_mask
    assert torch.equal(allowed_mask(300, 200, True, (40, 9)), allowed_mask(300, 200, False, (40, 0)))
    assert bool(allowed_mask(300, 200, False, (2 ** 40, INT32_MAX)).all())
    # softmax_scale=0: the mean of v over the visible keys, lse = log(count)
    mask = allowed_mask(113, 1023, False, (5, 17), DEVICE)
    out, lse = attention_ref(q, k, v, False, (5, 17), softmax_scale=0.0)
    vv = v.repeat_interleave(4, dim=2)
    mean_v = torch.einsum("qk,bkhd->bqhd", mask.float(), vv) / mask.sum(dim=1).float().view(1, -1, 1, 1)
    torch.testing.assert_close(out, mean_v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, mask.sum(dim=1).float().log().expand_as(lse), atol=1e-5, rtol=1e-5)
    # softcap: with softmax_scale=0 still uniform; far above every score, no capping; the capped
    # scores stay in (-softcap, softcap), so lse <= log(count) + softcap; the gradient through the
    # tanh matches finite differences (float64)
    out_c, lse_c = attention_ref(q, k, v, False, (5, 17), softmax_scale=0.0, softcap=5.0)
    torch.testing.assert_close(out_c, out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse_c, lse, atol=1e-6, rtol=1e-6)
    for causal, window in windows[:3]:
        a, la = attention_ref(q, k, v, causal, window, softmax_scale=0.3, softcap=1e6)
        b, lb = attention_ref(q, k, v, causal, window, softmax_scale=0.3)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
        _, lc = attention_ref(q, k, v, causal, window, softmax_scale=3.0, softcap=2.0)
        count = allowed_mask(113, 1023, causal, window, DEVICE).sum(dim=1).float()
        assert bool((lc <= count.log() + 2.0 + 1e-4).all())
    qd, kd, vd = (torch.randn(1, 5, 2, 8, dtype=torch.float64, device=DEVICE, requires_grad=True) for _ in range(3))

    def capped(q, k, v):  # attention_ref's math in float64 (attention_ref itself upcasts to fp32)
        s = 2.0 * torch.tanh(torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.7 / 2.0)
        s = s.masked_fill(~allowed_mask(5, 5, True, device=DEVICE), float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v), torch.logsumexp(s, dim=-1)

    assert torch.autograd.gradcheck(lambda a, b, c: capped(a, b, c)[0], (qd, kd, vd))
    out64, lse64 = capped(qd, kd, vd)
    out32, lse32 = attention_ref(qd, kd, vd, True, softmax_scale=0.7, softcap=2.0)
    torch.testing.assert_close(out32.double(), out64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse32.double(), lse64, atol=1e-5, rtol=1e-5)
