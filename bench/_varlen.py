# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py --varlen: variable-length forward and backward against fixed length (equal
lengths), and a document mix, sustained and interleaved."""
import ctypes
import math
import sys

from _abi import FLASH3_BF16, FLASH3_FP16, FLASH3_FP32, FLASH3_OK, Flash3Lib, f3_tensor
from _calls import Flash3Call
from _common import (cudnn_sdpa_fn, device_desc, each_row, fmt_len, fwd_flops, geomean, interleave, median_spread,
                     parse_causal, parse_list, sustained_desc)


def f3_varlen_fwd(torch, lib, q, k, v, lens_q, lens_k, scale, causal, stream, pss="fwd"):
    """flash3's varlen forward (pss "fwd") or backward ("bwd": after one
    forward, with a random dout and the scratch from
    flash3_backward_workspace_size) on (total, h, d) tensors with sequence
    lengths lens_q / lens_k: a zero-argument callable returning the status
    (the buffers it needs are kept alive by the closure)."""
    P = ctypes.byref
    dt = FLASH3_BF16 if q.dtype == torch.bfloat16 else FLASH3_FP16
    cu = [torch.tensor([0] + list(itertools_accumulate(x)), device=q.device, dtype=torch.int32)
          for x in (lens_q, lens_k)]
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), device=q.device, dtype=q.dtype)
    lse = torch.empty((q.shape[1], q.shape[0]), device=q.device, dtype=torch.float32)
    opts = lib.options(scale, causal)
    opts.cu_seqlens_q = ctypes.cast(cu[0].data_ptr(), ctypes.POINTER(ctypes.c_int32))
    opts.cu_seqlens_k = ctypes.cast(cu[1].data_ptr(), ctypes.POINTER(ctypes.c_int32))
    opts.max_seqlen_q, opts.max_seqlen_k = max(lens_q), max(lens_k)
    opts.num_sequences = len(lens_q)
    t = [f3_tensor(x, dt) for x in (q, k, v, out)]
    tl = f3_tensor(lse, FLASH3_FP32)
    keep = [cu, out, lse, opts, t, tl]
    st = ctypes.c_void_p(stream)

    def fn():
        _ = keep
        return lib.lib.flash3_forward(P(t[0]), P(t[1]), P(t[2]), P(t[3]), P(tl), P(opts), st)
    if pss == "fwd":
        return fn
    status = fn()
    dout = torch.randn_like(out)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    tg = [f3_tensor(x, dt) for x in [dout] + grads]
    ws_bytes = lib.lib.flash3_backward_workspace_size(P(t[0]), P(t[1]), P(t[2]), P(opts))
    ws = torch.empty(max(int(ws_bytes), 1), device=q.device, dtype=torch.uint8)
    keep += [dout, grads, tg, ws]

    def bwd():
        _ = keep
        if status != FLASH3_OK:
            return status
        return lib.lib.flash3_backward(P(t[0]), P(t[1]), P(t[2]), P(t[3]), P(tg[0]), P(tl), None, P(tg[1]), P(tg[2]),
                                       P(tg[3]), P(opts), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws_bytes),
                                       st)
    return bwd


def itertools_accumulate(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def doc_mix_lengths(tokens, lo=64, hi=8192, seed=0):
    """Lengths drawn log-uniformly from [lo, hi] until `tokens` are used (the last one cut)."""
    import random
    rng = random.Random(seed)
    lens, left = [], tokens
    while left > 0:
        n = min(left, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
        lens.append(n)
        left -= n
    return lens


def run_varlen(args, torch, F, dtype):
    lib = Flash3Lib(args.lib)
    stream = torch.cuda.current_stream().cuda_stream
    print(f"{device_desc(torch)}{sustained_desc(args)} | flash3 {lib.version()} ({lib.path})")
    failed = False

    def timed(fns):
        return median_spread(interleave(torch, fns, args.rounds, args.iters, args.warmup_ms, args.gap_s))

    passes = parse_list(args.passes, lambda x: x.strip().lower())
    print("\n(a) equal lengths: varlen against fixed length")
    print("| hdim | seqlen | causal | pass | fixed TFLOP/s | varlen TFLOP/s | varlen/fixed |")
    print("|---:|---:|---:|---|---:|---:|---:|")
    ratios = {p: [] for p in passes}
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v, dout) in each_row(torch, args, parse_causal(args.causal),
                                                                             passes, dtype):
        b, sq, h, d = q.shape
        call = Flash3Call(torch, lib, q, k, v, dout, lib.options(scale, causal), stream)
        vfn = f3_varlen_fwd(torch, lib, q.reshape(b * sq, h, d), k.reshape(b * sq, -1, d), v.reshape(b * sq, -1, d),
                            [sq] * b, [sq] * b, scale, causal, stream, pss)
        ffn = call.fwd if pss == "fwd" else call.bwd
        if call.status != FLASH3_OK or ffn() != FLASH3_OK or vfn() != FLASH3_OK:
            print(f"  d={hdim} s={seqlen} {pss}: {lib.last_error()}")
            failed = True
            continue
        ms, spread = timed({"fixed": ffn, "varlen": vfn})
        tf = {n: flops / (ms[n] * 1e-3) / 1e12 for n in ms}
        ratios[pss].append(tf["varlen"] / tf["fixed"])
        print(f"| {hdim} | {fmt_len(seqlen)} | {'yes' if causal else 'no'} | {pss} | {tf['fixed']:.1f} "
              f"({100 * spread['fixed']:.0f}%) | {tf['varlen']:.1f} ({100 * spread['varlen']:.0f}%) | "
              f"{ratios[pss][-1]:.3f} |")
        sys.stdout.flush()
        del call, vfn
    for p, rs in ratios.items():
        if rs:
            print(f"{p}: geomean varlen/fixed = {geomean(rs):.3f} over {len(rs)} rows; lowest {min(rs):.3f}")

    lens = doc_mix_lengths(args.tokens)
    hdim, heads = 128, max(1, args.hidden // 128)
    scale = 1.0 / math.sqrt(hdim)
    useful = sum(fwd_flops(1, heads, n, n, hdim, True) for n in lens)
    print(f"\n(b) document mix: {len(lens)} causal documents, {sum(lens)} tokens (lengths {min(lens)}..{max(lens)}), "
          f"d = {hdim}, {heads} heads; TFLOP/s of useful (causal) forward work")
    torch.manual_seed(7)
    total = sum(lens)
    q, k, v = (torch.randn((total, heads, hdim), device="cuda", dtype=dtype) for _ in range(3))
    print("| pass | contender | ms | TFLOP/s | spread |")
    print("|---|---|---:|---:|---:|")
    for pss in passes:
        mult = 1.0 if pss == "fwd" else 2.5
        fns = {"flash3 varlen": f3_varlen_fwd(torch, lib, q, k, v, lens, lens, scale, True, stream, pss)}
        per_doc, per_doc_cudnn, starts = [], [], [0] + list(itertools_accumulate(lens))
        for i, n in enumerate(lens):
            qs, ks, vs = (x[starts[i]:starts[i + 1]].unsqueeze(0) for x in (q, k, v))
            per_doc.append(Flash3Call(torch, lib, qs, ks, vs, torch.randn_like(qs), lib.options(scale, True), stream))
            if not args.no_cudnn:
                per_doc_cudnn.append(cudnn_sdpa_fn(torch, F, qs.transpose(1, 2), ks.transpose(1, 2),
                                                   vs.transpose(1, 2), True, scale, pss))
        fns["flash3 per document"] = (lambda: [c.fwd() for c in per_doc]) if pss == "fwd" else \
            (lambda: [c.bwd() for c in per_doc])
        if per_doc_cudnn:
            fns["cuDNN per document"] = lambda: [f() for f in per_doc_cudnn]
        if fns["flash3 varlen"]() != FLASH3_OK:
            print(f"  varlen {pss}: {lib.last_error()}")
            failed = True
            continue
        ms, spread = timed(fns)
        for n in fns:
            print(f"| {pss} | {n} | {ms[n]:.3f} | {mult * useful / (ms[n] * 1e-3) / 1e12:.1f} | "
                  f"{100 * spread[n]:.0f}% |")
        sys.stdout.flush()
    return 1 if failed else 0
