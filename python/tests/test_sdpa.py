# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 as torch's SDPA FlashAttention implementation (flash3.sdpa).

After torch.nn.attention.activate_flash_attention_impl("flash3"), F.scaled_dot_product_attention
on CUDA fp16 / bf16 runs flash3's forward and backward: out and the gradients are checked against
torch's math backend in fp32 with FlashAttention's rule (python/tests/ref.py: err <= 2 * err of
the same math in the inputs' dtype + the dtype's rounding at the result's magnitude), the
profiler shows flash3's operators, calls flash3 cannot serve give torch's result
(attn_mask, dropout, fp32, a head dim this build lacks), deactivation restores torch's kernels,
and torch.compile's SDPA path runs flash3 too. The registration tests run without a GPU.
"""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flash3  # noqa: E402
from flash3 import sdpa  # noqa: E402

HAS_API = sdpa.is_supported_by_torch()
needs_api = pytest.mark.skipif(not HAS_API, reason=f"torch {torch.__version__} has no register_flash_attention_impl "
                               "/ torch.library.get_kernel (2.11+)")
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="flash3 needs a Hopper (sm_90) GPU")
DEVICE = "cuda"


@pytest.fixture
def active():
    """flash3 active for the test, torch's default afterwards (whatever the test did)."""
    sdpa.activate()
    sdpa.stats(reset=True)
    yield
    torch.nn.attention.restore_flash_attention_impl()


def _built_or_skip(dtype, d, backward=True):
    if not flash3.forward_is_built(dtype, d, d) or (backward and not flash3.backward_is_built(dtype, d, d)):
        pytest.skip(f"{dtype} d={d} not built")


def _inputs(b, hq, hk, sq, sk, d, dtype, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(b, hq, sq, d, device=DEVICE, dtype=dtype, generator=g)
    k = torch.randn(b, hk, sk, d, device=DEVICE, dtype=dtype, generator=g)
    v = torch.randn(b, hk, sk, d, device=DEVICE, dtype=dtype, generator=g)
    do = torch.randn(b, hq, sq, d, device=DEVICE, dtype=dtype, generator=g)
    return q, k, v, do


def _math(q, k, v, do, causal, scale, gqa, upcast):
    """out and grads of SDPA's math backend, in fp32 (upcast) or in the inputs' dtype."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t = [x.detach().float() if upcast else x.detach().clone() for x in (q, k, v)]
    for x in t:
        x.requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(*t, is_causal=causal, scale=scale, enable_gqa=gqa)
    grads = torch.autograd.grad(o, t, do.float() if upcast else do)
    return o, grads


def _within_rule(ours, ref, lowp, dtype):
    from ref import max_err, rounding_atol

    err, base = max_err(ours, ref), max_err(lowp, ref)
    bound = 2 * base + rounding_atol(ref, dtype)
    return err <= bound, f"err {err:.3e} > bound {bound:.3e} (low-precision baseline {base:.3e})"


# ---------------------------------------------------------------------------
# Registration (no GPU needed).
# ---------------------------------------------------------------------------
@needs_api
def test_registered_on_import_never_activated():
    assert "flash3" in torch.nn.attention.list_flash_attention_impls()
    assert torch.nn.attention.current_flash_attention_impl() != "flash3"
    assert not sdpa.is_active()


@needs_api
def test_activate_and_restore_installs_and_removes_kernels():
    prio = list(torch._C._get_sdp_priority_order())
    sdpa.activate()
    try:
        assert torch.nn.attention.current_flash_attention_impl() == "flash3"
        assert sdpa.is_active()
        assert int(torch._C._get_sdp_priority_order()[0]) == int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    assert torch.nn.attention.current_flash_attention_impl() is None
    assert not sdpa.is_active()
    assert list(torch._C._get_sdp_priority_order()) == prio


def test_register_without_the_api_is_a_no_op(monkeypatch):
    monkeypatch.setattr(sdpa, "is_supported_by_torch", lambda: False)
    assert sdpa.register() is False
    with pytest.raises(RuntimeError, match="register_flash_attention_impl"):
        sdpa.activate()


# ---------------------------------------------------------------------------
# On a Hopper GPU.
# ---------------------------------------------------------------------------
CASES = [  # (b, hq, hk, sq, sk, d, causal, scale)
    (2, 8, 8, 512, 512, 128, False, None),
    (2, 8, 8, 1000, 1000, 128, True, None),
    (1, 8, 2, 777, 777, 64, True, None),      # GQA (enable_gqa)
    (2, 4, 4, 256, 1024, 256, False, 0.05),   # seqlen_q != seqlen_k, explicit scale
    (1, 4, 4, 333, 333, 96, True, None),
]


@needs_api
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}x{}s{}x{}d{}{}{}".format(
    *c[:6], "c" if c[6] else "", "" if c[7] is None else "s"))
def test_forward_backward_against_math(active, dtype, case):
    b, hq, hk, sq, sk, d, causal, scale = case
    _built_or_skip(dtype, d)
    q, k, v, do = _inputs(b, hq, hk, sq, sk, d, dtype)
    gqa = hq != hk
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale, enable_gqa=gqa)
    grads = torch.autograd.grad(out, (qg, kg, vg), do)
    st = sdpa.stats()
    assert st.get("forward", 0) >= 1 and st.get("backward", 0) >= 1, st
    ref_o, ref_g = _math(q, k, v, do, causal, scale, gqa, upcast=True)
    low_o, low_g = _math(q, k, v, do, causal, scale, gqa, upcast=False)
    assert out.shape == ref_o.shape and out.dtype == dtype
    ok, msg = _within_rule(out, ref_o, low_o, dtype)
    assert ok, "out: " + msg
    for name, ours, ref, low in zip(("dq", "dk", "dv"), grads, ref_g, low_g):
        ok, msg = _within_rule(ours, ref, low, dtype)
        assert ok, f"{name}: {msg}"


@needs_api
@needs_hopper
def test_profiler_shows_flash3(active):
    _built_or_skip(torch.bfloat16, 128)
    q, k, v, do = _inputs(2, 4, 4, 256, 256, 128, torch.bfloat16)
    q.requires_grad_(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(do)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    assert "flash3::fwd" in names and "flash3::bwd" in names, sorted(n for n in names if "flash" in n.lower())
    kernels = [n for n in names if "flash3" in n and n not in ("flash3::fwd", "flash3::bwd")]
    assert kernels, sorted(names)  # the CUDA kernels (namespace flash3)


@needs_api
@needs_hopper
def test_fallbacks_give_torchs_result(active):
    """Calls flash3 does not serve run torch's kernels: results equal those with flash3 inactive."""
    _built_or_skip(torch.bfloat16, 64)
    q, k, v, _ = _inputs(2, 4, 4, 128, 128, 64, torch.bfloat16, seed=1)
    mask = torch.rand(128, 128, device=DEVICE) > 0.2
    calls = {
        "attn_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "fp32": lambda: F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True),
        "dropout": lambda: (torch.manual_seed(0), F.scaled_dot_product_attention(q, k, v, dropout_p=0.3))[1],
    }
    unbuilt = next((d for d in (40, 72, 104, 120, 136, 152, 168, 200, 224, 248)
                    if not flash3.forward_is_built(torch.bfloat16, d, d)), None)
    if unbuilt is not None:
        qu, ku, vu, _ = _inputs(1, 2, 2, 64, 64, unbuilt, torch.bfloat16, seed=2)
        calls["head_dim"] = lambda: F.scaled_dot_product_attention(qu, ku, vu)
    ours = {name: fn() for name, fn in calls.items()}
    assert sdpa.stats().get("forward", 0) == 0, sdpa.stats()
    torch.nn.attention.restore_flash_attention_impl()
    for name, fn in calls.items():
        torch.testing.assert_close(ours[name], fn(), rtol=0, atol=0, msg=name)
    sdpa.activate()  # (the fixture restores again)


@needs_api
@needs_hopper
def test_deactivation_restores_torchs_kernels():
    _built_or_skip(torch.bfloat16, 128)
    q, k, v, _ = _inputs(1, 4, 4, 256, 256, 128, torch.bfloat16, seed=3)
    before = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    sdpa.activate()
    try:
        sdpa.stats(reset=True)
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert sdpa.stats().get("forward") == 1
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    sdpa.stats(reset=True)
    after = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert sdpa.stats() == {}
    torch.testing.assert_close(after, before, rtol=0, atol=0)


@needs_api
@needs_hopper
def test_torch_compile_runs_flash3(active):
    _built_or_skip(torch.bfloat16, 128)
    q, k, v, do = _inputs(2, 4, 4, 256, 256, 128, torch.bfloat16, seed=4)

    @torch.compile(fullgraph=True)
    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    qg = q.clone().requires_grad_(True)
    out = attn(qg, k, v)
    (dq,) = torch.autograd.grad(out, qg, do)
    st = sdpa.stats()
    assert st.get("forward", 0) >= 1 and st.get("backward", 0) >= 1, st
    ref_o, ref_g = _math(q, k, v, do, True, None, False, upcast=True)
    low_o, low_g = _math(q, k, v, do, True, None, False, upcast=False)
    assert _within_rule(out, ref_o, low_o, torch.bfloat16)[0]
    assert _within_rule(dq, ref_g[0], low_g[0], torch.bfloat16)[0]
    assert math.isfinite(out.float().sum().item())
