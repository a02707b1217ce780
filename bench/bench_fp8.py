#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""FP8 (e4m3) forward against flash3's own bf16 forward, one process, sustained load.

The 14 headline rows (16k tokens, hidden 2048: batch = 16384 / seqlen, heads =
2048 / d; d = 128 at 4k / 8k / 16k, d = 64 and 256 at 8k / 16k; causal and not).
Inputs: N(0, 1) bf16, quantized per (batch, KV head) to e4m3 with descales
(amax / 448), or with --block-scales per 128 tokens of each head. Each row: flash3 bf16 and flash3 fp8 forward TFLOP/s (4 b h s^2 d,
halved for causal; median of CUDA-event-timed calls after --warmup-ms of
back-to-back calls), their ratio, and the FP8 output's max error against the bf16
output as a sanity check (the correctness tests are tests/gpu/test_fp8_gpu.cpp).

  python3 bench/bench_fp8.py --lib build/libflash3.so --warmup-ms 300
"""
import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402


def quantize(torch, x):
    """(b, s, h, d) -> e4m3 tensor and (b, h) fp32 descales, one per (batch, head)."""
    amax = x.float().abs().amax(dim=(1, 3)).clamp(min=1e-12)  # (b, h)
    descale = amax / 448.0
    x8 = (x.float() / descale[:, None, :, None]).to(torch.float8_e4m3fn)
    return x8, descale.contiguous()


def quantize_blocks(torch, x):
    """(b, s, h, d) -> e4m3 tensor and (b, h, ceil(s / 128)) fp32 block descales."""
    b, s, h, d = x.shape
    nb = (s + 127) // 128
    xp = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, nb * 128 - s))
    amax = xp.abs().view(b, nb, 128, h, d).amax(dim=(2, 4)).clamp(min=1e-12)  # (b, nb, h)
    descale = amax / 448.0
    x8 = (xp / descale.repeat_interleave(128, dim=1)[:, :, :, None])[:, :s].to(torch.float8_e4m3fn)
    return x8.contiguous(), descale.transpose(1, 2).contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libflash3.so")
    ap.add_argument("--warmup-ms", type=float, default=300.0)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rows", default="", help="d:seqlen[:c] list (default: the 14 headline rows)")
    ap.add_argument("--fp8-only", action="store_true", help="time the FP8 forward only (a build without bf16)")
    ap.add_argument("--block-scales", action="store_true",
                    help="FP8 inputs with block descales (batch, heads, seqlen / 128) instead of (batch, heads)")
    a = ap.parse_args()
    import torch
    lib = B.Flash3Lib(a.lib)
    T = ctypes.POINTER(B.F3Tensor)
    O = ctypes.POINTER(lib.Options)
    fn = lib.lib.flash3_forward_fp8
    fn.restype = ctypes.c_int
    fn.argtypes = [T, T, T, T, T, T, T, T, O, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    rows = []
    if a.rows:
        for r in a.rows.split(","):
            parts = r.split(":")
            rows.append((int(parts[0]), int(parts[1]), len(parts) > 2 and parts[2] == "c"))
    else:
        rows = [(d, s, c) for d, s in B.HEADLINE_ROWS for c in (False, True)]
    stream = torch.cuda.current_stream().cuda_stream
    ratios = []
    print(f"{'row':>16} {'bf16':>8} {'fp8':>8} {'fp8/bf16':>9} {'max|fp8-bf16|':>14}")
    for d, s, causal in rows:
        b, h = max(1, 16384 // s), 2048 // d
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        scale = d ** -0.5
        opts = lib.options(scale, causal=causal)
        out16 = torch.empty_like(q)
        lse16 = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        t16 = [B.f3_tensor(x, B.FLASH3_BF16) for x in (q, k, v, out16)]
        tl16 = B.f3_tensor(lse16, B.FLASH3_FP32)
        P = ctypes.byref
        args16 = (P(t16[0]), P(t16[1]), P(t16[2]), P(t16[3]), P(tl16), P(opts), ctypes.c_void_p(stream))
        qfn = quantize_blocks if a.block_scales else quantize
        (q8, qd), (k8, kd), (v8, vd) = (qfn(torch, x) for x in (q, k, v))
        out8 = torch.empty_like(q)
        lse8 = torch.empty_like(lse16)
        t8 = [B.f3_tensor(x, B.FLASH3_FP8_E4M3) for x in (q8, k8, v8)] + [B.f3_tensor(out8, B.FLASH3_BF16)]
        tl8 = B.f3_tensor(lse8, B.FLASH3_FP32)
        td = [B.f3_tensor(x, B.FLASH3_FP32) for x in (qd, kd, vd)]
        args8 = (P(t8[0]), P(t8[1]), P(t8[2]), P(t8[3]), P(tl8), P(td[0]), P(td[1]), P(td[2]), P(opts), None, 0,
                 ctypes.c_void_p(stream))
        calls = (("bf16", lambda: lib.lib.flash3_forward(*args16)), ("fp8", lambda: fn(*args8)))
        for name, call in calls[1:] if a.fp8_only else calls:
            st = call()
            if st != 0:
                print(f"{name} d{d} {s}: status {st}: {lib.last_error()}")
                return 1
        torch.cuda.synchronize()
        err = float("nan") if a.fp8_only else (out8.float() - out16.float()).abs().max().item()
        ms16 = float("nan") if a.fp8_only else B.sustained_median(torch, lambda: lib.lib.flash3_forward(*args16),
                                                                   a.warmup_ms, a.iters)
        ms8 = B.sustained_median(torch, lambda: fn(*args8), a.warmup_ms, a.iters)
        fl = B.fwd_flops(b, h, s, s, d, causal)
        tf16, tf8 = fl / ms16 / 1e9, fl / ms8 / 1e9
        if not a.fp8_only:
            ratios.append(tf8 / tf16)
        label = f"d{d} {B.fmt_len(s)}{' causal' if causal else ''}"
        print(f"{label:>16} {tf16:8.1f} {tf8:8.1f} {tf8 / tf16:9.3f} {err:14.4f}", flush=True)
    if ratios:
        print(f"geomean fp8/bf16 {B.geomean(ratios):.3f} over {len(ratios)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
