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
