# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py: the correctness checks (the tolerance rule against torch's math SDPA)."""

# ---------------------------------------------------------------------------
# Correctness (tolerance rule), on a subset of batches and heads for big shapes.
# ---------------------------------------------------------------------------
CHECK_BUDGET = 1 << 28  # score elements (b_sub * h_sub * sq * sk) per check


def check_subset(b, h, s):
    per = s * s
    bh = max(1, CHECK_BUDGET // per)
    h_sub = min(h, bh)
    b_sub = min(b, max(1, bh // h_sub))
    return b_sub, h_sub


class _PlainMath:
    """torch's math SDPA backend computing in the input dtype (no upcast to fp32)."""

    def __init__(self, torch):
        self.cuda = torch.backends.cuda
        self.prev = None

    def __enter__(self):
        if hasattr(self.cuda, "allow_fp16_bf16_reduction_math_sdp"):
            self.prev = self.cuda.fp16_bf16_reduction_math_sdp_allowed()
            self.cuda.allow_fp16_bf16_reduction_math_sdp(True)
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            self.cuda.allow_fp16_bf16_reduction_math_sdp(self.prev)
        return False


def _math_sdpa(torch, F, sdpa_ctx, q, k, v, scale, causal):
    # (b, s, h, d) in, (b, s, h, d) out
    with sdpa_ctx("MATH"):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                           scale=scale)
    return o.transpose(1, 2)


def _judge(torch, ours, ref, base):
    ours, ref, base = ours.float(), ref.float(), base.float()
    nan = int(torch.isnan(ours).sum().item())
    err = (ours - ref).abs().nan_to_num(nan=0.0).max().item() if ours.numel() else 0.0
    berr = (base - ref).abs().nan_to_num(nan=0.0).max().item() if ours.numel() else 0.0
    bound = 2.0 * berr + 1e-5
    return nan == 0 and err <= bound, err, berr, bound, nan


def check_fwd(torch, F, sdpa_ctx, r, q, k, v, out, scale, causal):
    b, s, h, _ = q.shape
    bs, hs = check_subset(b, h, s)
    qs, ks, vs = (x[:bs, :, :hs] for x in (q, k, v))
    with torch.no_grad():
        ref = _math_sdpa(torch, F, sdpa_ctx, qs.float(), ks.float(), vs.float(), scale, causal)
        with _PlainMath(torch):
            base = _math_sdpa(torch, F, sdpa_ctx, qs, ks, vs, scale, causal)
        ok, err, berr, bound, nan = _judge(torch, out[:bs, :, :hs], ref, base)
    r.err, r.bound = err, bound
    r.check = "PASS" if ok else "FAIL"
    sub = "" if (bs, hs) == (b, h) else f" (b<{bs},h<{hs})"
    if not ok:
        print(f"  CHECK FAIL fwd d={q.shape[3]} s={s} causal={causal}{sub}: err={err:.3g} baseline={berr:.3g} "
              f"bound={bound:.3g} nan={nan}")
    del ref, base
    torch.cuda.empty_cache()


def check_bwd(torch, F, sdpa_ctx, r, q, k, v, dout, grads, scale, causal):
    b, s, h, _ = q.shape
    bs, hs = check_subset(b, h, s)
    bs, hs = max(1, bs // 2), max(1, hs // 2) if hs > 1 else 1  # the backward keeps more alive
    sl = (slice(0, bs), slice(None), slice(0, hs))
    do = dout[sl]

    def grads_of(dt_q, dt_k, dt_v, plain):
        qg = q[sl].detach().to(dt_q).requires_grad_(True)
        kg = k[sl].detach().to(dt_k).requires_grad_(True)
        vg = v[sl].detach().to(dt_v).requires_grad_(True)
        if plain:
            with _PlainMath(torch):
                o = _math_sdpa(torch, F, sdpa_ctx, qg, kg, vg, scale, causal)
                g = torch.autograd.grad(o, (qg, kg, vg), do.to(o.dtype))
        else:
            o = _math_sdpa(torch, F, sdpa_ctx, qg, kg, vg, scale, causal)
            g = torch.autograd.grad(o, (qg, kg, vg), do.to(o.dtype))
        return [x.detach() for x in g]

    ref = grads_of(torch.float32, torch.float32, torch.float32, False)
    base = grads_of(q.dtype, k.dtype, v.dtype, True)
    worst_ok, worst = True, None
    for name, ours, rf, bs_ in zip(("dq", "dk", "dv"), grads, ref, base):
        ok, err, berr, bound, nan = _judge(torch, ours[sl], rf, bs_)
        if worst is None or err / bound > worst[1] / worst[3]:
            worst = (name, err, berr, bound, nan)
        if not ok:
            worst_ok = False
            print(f"  CHECK FAIL bwd {name} d={q.shape[3]} s={s} causal={causal}: err={err:.3g} baseline={berr:.3g} "
                  f"bound={bound:.3g} nan={nan}")
    r.err, r.bound = worst[1], worst[3]
    r.check = "PASS" if worst_ok else "FAIL"
    del ref, base
    torch.cuda.empty_cache()
