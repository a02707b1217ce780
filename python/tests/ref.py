# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Reference attention for the flash3 tests (torch only; no flash3 import here).

Layout (batch, seqlen, heads, head_dim) as flash_attn_func. Masks as flash3 / FlashAttention-3:
bottom-right aligned, query i sees keys j with
    i + sk - sq - window_left <= j <= i + sk - sq + window_right
where a negative side is unbounded and causal sets window_right = 0. The visibility is evaluated
per element in int64 from the window values as given (no clamping, no "window >= seqlen"
shortcut): a window of 2**31 - 1 or 2**40 is unbounded here because it cuts nothing.
Rows that see no key give out = 0 and lse = -inf. softmax_scale None means 1/sqrt(head_dim);
any number is used as given (0 included). softcap > 0 (FlashAttention-3's soft-capping) maps each
scaled score s to softcap * tanh(s / softcap) before the mask (attention_ref, lse_lowp; sdpa_ref
has no softcap); 0 disables it.
"""
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def allowed_mask(sq, sk, causal=False, window=(-1, -1), device="cpu"):
    """(sq, sk) bool, True where query i may attend to key j."""
    wl, wr = window
    if causal:
        wr = 0
    i = torch.arange(sq, device=device).view(-1, 1)
    j = torch.arange(sk, device=device).view(1, -1)
    shift = sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if wl >= 0:
        ok &= j >= i + shift - wl
    if wr >= 0:
        ok &= j <= i + shift + wr
    return ok


def _expand_kv(q, k, v):
    hq, hk = q.shape[2], k.shape[2]
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=2)
        v = v.repeat_interleave(hq // hk, dim=2)
    return k, v


def sdpa_ref(q, k, v, causal=False, window=(-1, -1), softmax_scale=None):
    """out via torch SDPA, math backend, on fp32 upcasts of q, k, v (differentiable)."""
    qf, kf, vf = q.float(), k.float(), v.float()
    kf, vf = _expand_kv(qf, kf, vf)
    sq, sk = q.shape[1], k.shape[1]
    mask = allowed_mask(sq, sk, causal, window, q.device)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2),
                                           attn_mask=mask, scale=softmax_scale)
    o = o.transpose(1, 2)
    # Rows with no visible key: 0 (as flash3). The math backend already gives 0 for them in
    # recent torch (safe softmax); this keeps older versions NaN-free too.
    empty = ~mask.any(dim=1)
    if bool(empty.any()):
        o = o.masked_fill(empty.view(1, -1, 1, 1), 0.0)
    return o


def _softcap(s, softcap, dtype=None):
    """s -> softcap * tanh(s / softcap) (differentiable); computed in fp32 and, given a dtype,
    rounded once to it (the low-precision baseline, as tests/gpu/gpu_reference.cu's kLowp mode
    rounds the capped score). softcap 0 (or None) returns s unchanged."""
    if not softcap:
        return s
    c = softcap * torch.tanh(s.float() / softcap)
    return c if dtype is None else c.to(dtype)


def attention_ref(q, k, v, causal=False, window=(-1, -1), softmax_scale=None, upcast=True, softcap=0.0):
    """(out, lse) by explicit math, differentiable in both outputs, NaN-free for empty rows.

    upcast=True: in fp32 (the reference). upcast=False: in the inputs' dtype (the "plain
    PyTorch in bf16/fp16" baseline whose error sets the tolerance); lse is then computed in
    fp32 from the low-precision scores. softcap > 0: the scaled scores are capped,
    s -> softcap * tanh(s / softcap), before the mask (in fp32, rounded to the inputs' dtype
    when upcast=False); autograd differentiates through the tanh.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    k, v = _expand_kv(q, k, v)
    d = q.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    sq, sk = q.shape[1], k.shape[1]
    mask = allowed_mask(sq, sk, causal, window, q.device)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale if not upcast else q, k)
    if upcast:
        s = s * scale
    s = _softcap(s, softcap, None if upcast else s.dtype)
    s = s.float().masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    p = torch.exp(s - m)  # 0 where masked
    l = p.sum(dim=-1, keepdim=True)
    empty = l == 0
    l_safe = torch.where(empty, torch.ones_like(l), l)
    lse = torch.where(empty, torch.full_like(l, float("-inf")), torch.log(l_safe) + m).squeeze(-1)
    p = (p / l_safe).to(v.dtype)
    o = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return o.to(dtype if not upcast else torch.float32), lse


def max_err(a, b):
    """max |a - b| over entries where both are finite (inf/nan positions must agree)."""
    a = a.float()
    b = b.float()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    assert torch.equal(fa, fb), "non-finite entries differ"
    if not bool(fa.any()):
        return 0.0
    return (a[fa] - b[fa]).abs().max().item()


def lse_lowp(q, k, causal=False, window=(-1, -1), softmax_scale=None, softcap=0.0):
    """softmax_lse of a plain low-precision implementation, the baseline of the C++ GPU tests
    (tests/gpu/gpu_reference.cu, Mode::kLowPrecision): S = Q K^T accumulated in fp32, times the
    scale, rounded once to q's dtype, (softcap > 0) capped in fp32 and rounded to q's dtype
    again, masked; logsumexp in fp32."""
    dtype = q.dtype
    k, _ = _expand_kv(q, k, k)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mask = allowed_mask(q.shape[1], k.shape[1], causal, window, q.device)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    s = _softcap(s.to(dtype), softcap, dtype)
    s = s.float().masked_fill(~mask, float("-inf"))
    return torch.logsumexp(s, dim=-1)  # -inf for a row that sees no key


# FlashAttention-3's tolerance factor for softcap (flash3::ref::kSoftcapTolFactor): the kernels'
# hardware tanh approximation against a baseline whose saturated scores round to exactly +-1.
SOFTCAP_TOL_FACTOR = 3.0


def tol_factor(softcap):
    return SOFTCAP_TOL_FACTOR if softcap > 0 else 2.0


def check_close(ours, ref, lowp, eps, factor=2.0):
    """The C++ tests' tolerance rule (flash3::ref::check_close, src/reference/reference.cpp):
    max|ours - ref| <= factor * max|lowp - ref| + eps (factor 2; tol_factor(softcap) with
    softcap), and no NaN in ours. Where ref is inf (or NaN)
    an entry's error is 0 when it equals ref and inf otherwise; a NaN baseline entry is ignored.
    Returns (ok, err, base_err, bound, nan_count)."""
    y, x, lw = ours.double(), ref.double(), lowp.double()
    zero, inf = torch.zeros_like(x), torch.full_like(x, float("inf"))
    x_finite = torch.isfinite(x)
    e = torch.where(x_finite, (y - x).abs(), torch.where(y == x, zero, inf))
    y_nan = torch.isnan(y)
    e = torch.where(y_nan, zero, e)
    eb = torch.where(x_finite, (lw - x).abs(), torch.where(lw == x, zero, inf))
    eb = torch.where(torch.isnan(lw), zero, eb)
    err = e.max().item() if e.numel() else 0.0
    base_err = eb.max().item() if eb.numel() else 0.0
    nan_count = int(y_nan.sum().item())
    bound = factor * base_err + eps
    return nan_count == 0 and err <= bound, err, base_err, bound, nan_count


def rounding_atol(ref, dtype):
    """The dtype's rounding error at the magnitude of ref (FlashAttention's test atol idiom)."""
    r = ref.float()
    r = r[torch.isfinite(r)]
    if r.numel() == 0:
        return 0.0
    rd = r.to(dtype)
    return 2 * ((rd + 0.3 - 0.3) - rd).float().abs().max().item() + 1e-5


# ---------------------------------------------------------------------------
# KV-cache attention (flash_attn_with_kvcache): rotary embedding, append, attention per sequence.
# ---------------------------------------------------------------------------
def apply_rotary_ref(x, cos, sin, positions, interleaved):
    """x (batch, seqlen, heads, head_dim) fp16 / bf16 rotated at positions (batch, seqlen) (int64)
    with the rows of cos / sin (seqlen_ro, rotary_dim / 2) (x's dtype), bit-exact against flash3's
    kernels (include/flash3/flash3.h, KVCacheArgs): per pair (x0, x1), in fp32,
        x0' = fma(x0, c, -(x1 * s)),  x1' = fma(x0, s, x1 * c),
    rounded to x's dtype (round to nearest even); pairs (2j, 2j + 1) when interleaved, else
    (j, j + rotary_dim / 2); dims >= rotary_dim unchanged. A position outside [0, seqlen_ro)
    rotates by the identity (c = 1, s = 0; the tests keep positions inside the table).

    Why plain fp32 torch arithmetic is exact here: x, c and s are fp16 / bf16 values (at most 11
    significant bits), so each product x0 * c, x1 * s, ... has at most 22 significant bits and is
    exact in fp32 (24 bits) as long as it stays in fp32's normal range (asserted below). Then
    fma(x0, c, -(x1 * s)) is the exact x0 * c - x1 * s rounded once to fp32, and so is the fp32
    subtraction (x0 * c) - (x1 * s) of the two exact products: IEEE subtraction rounds its exact
    result once. The same holds for x1' (an addition). Any evaluation order of the kernel (fma
    either way round, or no fma) gives that same correctly rounded value; the final fp32 -> dtype
    rounding (RNE) is torch's .to(dtype). So the appended cache rows and the rotated q can be
    compared bit for bit.
    """
    dtype = x.dtype
    half = cos.shape[1]
    rd = 2 * half
    ro = cos.shape[0]
    valid = (positions >= 0) & (positions < ro)
    idx = positions.clamp(0, ro - 1)
    c = torch.where(valid.unsqueeze(-1), cos.float()[idx], torch.ones((), device=x.device))  # (b, s, half)
    s = torch.where(valid.unsqueeze(-1), sin.float()[idx], torch.zeros((), device=x.device))
    c, s = c.unsqueeze(2), s.unsqueeze(2)  # broadcast over the heads
    xf = x.float()
    if interleaved:
        x0, x1 = xf[..., 0:rd:2], xf[..., 1:rd:2]
    else:
        x0, x1 = xf[..., :half], xf[..., half:rd]
    p00, p11, p01, p10 = x0 * c, x1 * s, x0 * s, x1 * c
    for p, a, b in ((p00, x0, c), (p11, x1, s), (p01, x0, s), (p10, x1, c)):
        exact = a.double() * b.double()
        tiny = (exact != 0) & (exact.abs() < 2.0 ** -126)  # an fp32 subnormal product may be rounded
        assert torch.equal(p.double(), exact) and not bool(tiny.any()), \
            "apply_rotary_ref: an fp32 product is not exact (inputs outside the fp16/bf16 normal range?)"
    r0 = (p00 - p11).to(dtype)
    r1 = (p01 + p10).to(dtype)
    out = x.clone()
    if interleaved:
        out[..., 0:rd:2] = r0
        out[..., 1:rd:2] = r1
    else:
        out[..., :half] = r0
        out[..., half:rd] = r1
    return out


def rotary_advances_q(causal, window, seqlen_q, seqlen_cache):
    """Whether query i is rotated to position pos_b + i (causal or local attention) rather than
    pos_b: causal, or a window side that cuts something after FlashAttention-3's normalisation
    (left < seqlen_cache - 1, right < seqlen_q - 1; a negative side is unbounded)."""
    wl, wr = window
    return causal or 0 <= wl < seqlen_cache - 1 or 0 <= wr < seqlen_q - 1


def kvcache_ref(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                cache_batch_idx=None, cache_leftpad=None, rotary_seqlens=None, softmax_scale=None, causal=False,
                window=(-1, -1), rotary_interleaved=True, softcap=0.0):
    """flash_attn_with_kvcache by explicit torch math. Returns a dict:
        k_cache, v_cache  clones of the caches with the new rows k / v written at rows
                          [cache_seqlens[b], cache_seqlens[b] + seqlen_new) of entry
                          cache_batch_idx[b] (k rotated when rotary tables are given; rows at or
                          past seqlen_cache dropped); bit-exact (apply_rotary_ref)
        q_rot             q rotated as the kernels rotate it (bit-exact), or q
        out, lse          the fp32 reference: per sequence b, attention_ref(upcast=True) of
                          q_rot[b] over rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new) of
                          the updated entry (bottom-right masks with seqlen_k = that many rows,
                          GQA by head repetition); a sequence without keys gives 0 / -inf
        out_lowp, lse_lowp  the plain low-precision baseline (attention_ref(upcast=False),
                          lse_lowp) on the same inputs, for the tolerance rule
    cache_seqlens None: every entry holds seqlen_cache rows (k must be None). The int32 arrays are
    read on the host here (the test's side; flash3 never reads them on the host)."""
    b, sq = q.shape[0], q.shape[1]
    sc = k_cache.shape[1]
    dev = q.device
    s_new = 0 if k is None else k.shape[1]
    if cache_seqlens is None:
        assert k is None, "k / v need cache_seqlens"
        seqlens = torch.full((b,), sc, dtype=torch.int64)
    else:
        seqlens = cache_seqlens.long().cpu()
    idx = cache_batch_idx.long().cpu() if cache_batch_idx is not None else torch.arange(b)
    lpad = cache_leftpad.long().cpu() if cache_leftpad is not None else torch.zeros(b, dtype=torch.int64)
    rot0 = rotary_seqlens.long().cpu() if rotary_seqlens is not None else seqlens
    kc, vc = k_cache.clone(), v_cache.clone()
    rotary = rotary_cos is not None
    if k is not None:
        k_new = k
        if rotary:
            pos = (rot0.view(-1, 1) + torch.arange(s_new).view(1, -1)).to(dev)
            k_new = apply_rotary_ref(k, rotary_cos, rotary_sin, pos, rotary_interleaved)
        for i in range(b):
            rows = seqlens[i].item() + torch.arange(s_new)
            keep = rows < sc
            kc[idx[i].item(), rows[keep].to(dev)] = k_new[i, keep.to(dev)]
            vc[idx[i].item(), rows[keep].to(dev)] = v[i, keep.to(dev)]
    q_rot = q
    if rotary:
        steps = torch.arange(sq) if rotary_advances_q(causal, window, sq, sc) else torch.zeros(sq, dtype=torch.int64)
        q_rot = apply_rotary_ref(q, rotary_cos, rotary_sin, (rot0.view(-1, 1) + steps.view(1, -1)).to(dev),
                                 rotary_interleaved)
    hq, dv = q.shape[2], v_cache.shape[3]
    outs, lses, outs_low, lses_low = [], [], [], []
    for i in range(b):
        lo, hi = lpad[i].item(), seqlens[i].item() + s_new
        assert 0 <= lo <= hi <= sc, f"kvcache_ref: sequence {i}: rows [{lo}, {hi}) outside the cache (0, {sc})"
        qi = q_rot[i:i + 1]
        if hi == lo:  # no key: out 0, lse -inf (flash3's and FlashAttention-3's empty rows)
            outs.append(torch.zeros(1, sq, hq, dv, device=dev))
            outs_low.append(torch.zeros(1, sq, hq, dv, device=dev, dtype=q.dtype))
            lses.append(torch.full((1, hq, sq), float("-inf"), device=dev))
            lses_low.append(torch.full((1, hq, sq), float("-inf"), device=dev))
            continue
        ki, vi = kc[idx[i].item(), lo:hi].unsqueeze(0), vc[idx[i].item(), lo:hi].unsqueeze(0)
        o, lse = attention_ref(qi, ki, vi, causal, window, softmax_scale, upcast=True, softcap=softcap)
        o_low, _ = attention_ref(qi, ki, vi, causal, window, softmax_scale, upcast=False, softcap=softcap)
        outs.append(o)
        lses.append(lse)
        outs_low.append(o_low)
        lses_low.append(lse_lowp(qi, ki, causal, window, softmax_scale, softcap=softcap))
    return {
        "k_cache": kc, "v_cache": vc, "q_rot": q_rot,
        "out": torch.cat(outs), "lse": torch.cat(lses),
        "out_lowp": torch.cat(outs_low), "lse_lowp": torch.cat(lses_low),
    }
