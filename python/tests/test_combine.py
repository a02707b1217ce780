# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3.flash_attn_combine (split-KV combine, FlashAttention-3's flash_attn_combine) against a
float64 torch reference, and the num_splits argument of flash_attn_func / flash_attn_varlen_func
(accepted; bad values raise before anything is launched)."""
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flash3 needs a Hopper (sm_90) GPU", allow_module_level=True)

from builds import skip_unless_built  # noqa: E402

from flash3 import flash_attn_combine, flash_attn_func, flash_attn_varlen_func  # noqa: E402

DEV = "cuda"


def reference(out_partial, lse_partial):
    """float64: lse = logsumexp over the splits, out = sum_s exp(lse_s - lse) * out_s, splits at -inf
    weigh 0 (their out_partial is not read), a row with every split at -inf gives (0, -inf)."""
    op = out_partial.double()
    lp = lse_partial.double()
    lse = torch.logsumexp(lp, dim=0)  # -inf where every split is -inf
    finite = torch.isfinite(lse)
    w = torch.exp(lp - torch.where(finite, lse, torch.zeros_like(lse)).unsqueeze(0))
    w = torch.where(torch.isneginf(lp), torch.zeros_like(w), w)
    op = torch.where(torch.isneginf(lp).unsqueeze(-1), torch.zeros_like(op), op)  # NaN partials of -inf splits
    out = (w.unsqueeze(-1) * op).sum(0)
    out = torch.where(finite.unsqueeze(-1), out, torch.zeros_like(out))
    return out, lse


def make_partials(splits, b, s, h, d, seed=0, neg_inf_frac=0.3):
    g = torch.Generator(device=DEV).manual_seed(seed)
    op = torch.randn(splits, b, s, h, d, device=DEV, generator=g)
    lp = torch.rand(splits, b, s, h, device=DEV, generator=g) * 12 - 6
    drop = torch.rand(splits, b, s, h, device=DEV, generator=g) < neg_inf_frac
    lp[drop] = -math.inf
    if s > 1:
        lp[:, :, 0] = -math.inf  # rows with every split at -inf
    if s > 2:
        lp[:, :, 1] += torch.where(torch.arange(splits, device=DEV) % 2 == 0, 80.0, -80.0).view(-1, 1, 1)
    op[torch.isneginf(lp)] = math.nan  # never read
    return op, lp


def _tol(dtype):
    return {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}[dtype]


def check(out, lse, op, lp, dtype):
    want_out, want_lse = reference(op, lp)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    atol, rtol = _tol(dtype)
    torch.testing.assert_close(out.double(), want_out, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 2, 7, 256])
@pytest.mark.parametrize("d", [64, 128, 256, 36, 5])
def test_matches_reference(out_dtype, splits, d):
    b, s, h = 2, 5, 3
    op, lp = make_partials(splits, b, s, h, d, seed=splits * 1000 + d)
    out, lse = flash_attn_combine(op, lp, out_dtype=out_dtype)
    dtype = torch.float32 if out_dtype is None else out_dtype
    check(out, lse, op, lp, dtype)
    # FlashAttention-3's softmax_lse layout: a (b, s, h) view of a (b, h, s) tensor.
    assert lse.transpose(1, 2).is_contiguous()


def test_strided_inputs_and_out():
    """Non-contiguous partials (FlashAttention-3's (splits, b, h, s, d) storage), an out= view with
    padded heads (written in place, padding untouched)."""
    splits, b, s, h, d = 5, 2, 9, 4, 128
    op_store, lp_store = make_partials(splits, b, h, s, d, seed=7)  # (splits, b, h, s, ...)
    op = op_store.transpose(2, 3)  # (splits, b, s, h, d), not contiguous
    lp = lp_store.transpose(2, 3)
    big = torch.full((b, s, h, d + 8), math.nan, device=DEV, dtype=torch.bfloat16)
    out_view = big[..., :d]
    out, lse = flash_attn_combine(op, lp, out=out_view, out_dtype=torch.bfloat16)
    assert out.data_ptr() == out_view.data_ptr()
    check(out, lse, op, lp, torch.bfloat16)
    assert torch.isnan(big[..., d:]).all(), "padding written"
    # An out with a non-unit head_dim stride is written through a temporary.
    big2 = torch.zeros(b, s, h, 2 * d, device=DEV, dtype=torch.float16)
    out2, _ = flash_attn_combine(op, lp, out=big2[..., ::2], out_dtype=torch.float16)
    check(out2, lse, op, lp, torch.float16)
    assert (big2[..., 1::2] == 0).all()


def test_odd_head_dim_with_out():
    """head_dim not a multiple of 4 is padded internally (as FlashAttention-3 does); out= keeps its shape."""
    op, lp = make_partials(3, 1, 4, 2, 6, seed=3)
    out = torch.empty(1, 4, 2, 6, device=DEV)
    out2, lse = flash_attn_combine(op, lp, out=out)
    assert out2 is out
    check(out, lse, op, lp, torch.float32)


def test_empty():
    op = torch.empty(3, 0, 4, 2, 64, device=DEV)
    lp = torch.empty(3, 0, 4, 2, device=DEV)
    out, lse = flash_attn_combine(op, lp)
    assert out.shape == (0, 4, 2, 64) and lse.shape == (0, 4, 2)


def test_splits_reconstruct_attention():
    """Attention over a key range split in parts, each part's (out, lse) combined, equals attention
    over the whole range (the forward's softmax_lse is (b, h, s): transposed to (b, s, h))."""
    skip_unless_built(torch.bfloat16, 128, 128)
    b, sq, sk, h, d = 2, 64, 512, 4, 128
    q = torch.randn(b, sq, h, d, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(b, sk, h, d, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(b, sk, h, d, device=DEV, dtype=torch.bfloat16)
    outs, lses = [], []
    for part in range(4):
        sl = slice(part * sk // 4, (part + 1) * sk // 4)
        o, l = flash_attn_func(q, k[:, sl], v[:, sl], softmax_scale=d ** -0.5, return_lse=True)
        outs.append(o.float())
        lses.append(l.transpose(1, 2))
    out, lse = flash_attn_combine(torch.stack(outs), torch.stack(lses), out_dtype=torch.bfloat16)
    want, want_lse = flash_attn_func(q, k, v, softmax_scale=d ** -0.5, return_lse=True)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse.transpose(1, 2), atol=1e-3, rtol=1e-4)


# ---------------------------------------------------------------------------
# Errors: raised before anything is launched, naming the argument.
# ---------------------------------------------------------------------------
def _partials(splits=3, d=64):
    return make_partials(splits, 2, 3, 4, d, neg_inf_frac=0.0)


@pytest.mark.parametrize("name,make,exc,subs", [
    ("out_partial_4d", lambda: (_partials()[0][0], _partials()[1]), ValueError, ["out_partial", "5-d"]),
    ("out_partial_fp16", lambda: (_partials()[0].half(), _partials()[1]), TypeError, ["out_partial.dtype"]),
    ("lse_partial_fp64", lambda: (_partials()[0], _partials()[1].double()), TypeError, ["lse_partial.dtype"]),
    ("lse_partial_shape", lambda: (_partials()[0], _partials()[1][:2]), ValueError, ["lse_partial", "shape"]),
    ("too_many_splits", lambda: _partials(splits=257), ValueError, ["num_splits", "257"]),
    ("head_dim_512", lambda: _partials(d=512), ValueError, ["head_dim", "512"]),
    ("cpu", lambda: tuple(t.cpu() for t in _partials()), ValueError, ["out_partial", "CUDA"]),
])
def test_errors(name, make, exc, subs):
    op, lp = make()
    with pytest.raises(exc) as e:
        flash_attn_combine(op, lp)
    for sub in subs:
        assert sub in str(e.value), (name, str(e.value))


def test_error_out_arguments():
    op, lp = _partials()
    with pytest.raises(TypeError, match="out_dtype"):
        flash_attn_combine(op, lp, out_dtype=torch.int32)
    out = torch.full((2, 3, 4, 64), 7.0, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="out.dtype"):
        flash_attn_combine(op, lp, out=out)  # out_dtype defaults to float32, as in FlashAttention-3
    bad = torch.full((2, 3, 4, 32), 7.0, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out has shape"):
        flash_attn_combine(op, lp, out=bad, out_dtype=torch.bfloat16)
    assert (bad == 7.0).all() and (out == 7.0).all(), "outputs written by a rejected call"
    # out overlapping out_partial: rejected by the library before launching.
    alias = op[0]
    keep = op.clone()
    with pytest.raises(ValueError, match="overlaps"):
        flash_attn_combine(op, lp, out=alias)
    assert torch.equal(op.nan_to_num(), keep.nan_to_num())


# ---------------------------------------------------------------------------
# num_splits of the forward functions.
# ---------------------------------------------------------------------------
def test_num_splits_accepted():
    """1 (default), 0 (heuristic) and n > 1 give the same results up to fp32 rounding."""
    skip_unless_built(torch.bfloat16, 128, 128)
    q = torch.randn(2, 4, 8, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(2, 2048, 2, 128, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(2, 2048, 2, 128, device=DEV, dtype=torch.bfloat16)
    want, want_lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    for n in (0, 2, 3, 16, 256):
        out, lse = flash_attn_func(q, k, v, causal=True, num_splits=n, return_lse=True)
        torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2, msg=f"num_splits={n}")
        torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-5, msg=f"num_splits={n}")


@pytest.mark.parametrize("bad", [-1, 257, 2 ** 40])
def test_num_splits_bad_values(bad):
    skip_unless_built(torch.bfloat16, 128, 128)
    q = torch.randn(1, 4, 2, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"num_splits is {bad}"):
        flash_attn_func(q, q, q, num_splits=bad)
    cu = torch.tensor([0, 4], device=DEV, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"num_splits is {bad}"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 4, 4, num_splits=bad)
    # The operators check it too (direct calls, bypassing the Python wrapper).
    with pytest.raises(ValueError, match=f"num_splits is {bad}"):
        torch.ops.flash3.fwd(q, q, q, None, False, -1, -1, 0.0, False, -1, bad)


def test_num_splits_bad_type():
    q = torch.randn(1, 4, 2, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="num_splits"):
        flash_attn_func(q, q, q, num_splits=2.5)
