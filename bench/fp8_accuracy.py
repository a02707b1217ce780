#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""FP8 accuracy with outliers (seed 6.4, the FlashAttention-3 paper's experiment), and the
quantization kernel's bandwidth.

Accuracy: Q, K, V ~ N(0, 1) plus N(0, 100) outliers (standard deviation 10) at rate 1e-3, bf16,
d = 128, batch 1, --heads heads, --seqlen tokens, not causal. The RMSE of O against a float64
attention of the same bf16 inputs, for:
  bf16                         flash3's bf16 forward
  fp8 per-tensor               one descale per tensor (quantize_fp8, heads_per_scale = heads)
  fp8 per-head                 one per (batch, head): FlashAttention-3's descale granularity
  fp8 block                    one per 128 tokens of each head (block_scales=True)
  fp8 per-tensor + Hadamard    q and k rotated (hadamard=True, one seed), v not
  fp8 block + Hadamard
All FP8 rows run flash3's FP8 forward on flash3.quantize_fp8's outputs.

Bandwidth: flash3.quantize_fp8 on (8, 16k, 2048 / d, d) bf16 for each d of --bw-hdims (512 MiB
in, 256 MiB out: large enough that the GPU time, not the call's host overhead, is timed), per mode
and kernel set (default: src/quant/quantize_fp8.cu; raw: quantize_fp8_raw.cu, FLASH3_QUANTIZE_RAW=1),
CUDA events over --iters calls after a warm-up, counting bytes read and written once (2 + 1
per element, plus the descales), next to torch's copy (x.clone(): 2 + 2 per element) in the
same process.

  PYTHONPATH=python python3 bench/fp8_accuracy.py [--bw-only] [--bw-hdims 64,128,256]
"""
import argparse
import os


def attention_f64(torch, q, k, v, chunk=1024):
    """float64 softmax(q k^T / sqrt(d)) v, (b, s, h, d), in query chunks."""
    b, s, h, d = q.shape
    qd, kd, vd = (x.double().permute(0, 2, 1, 3) for x in (q, k, v))  # (b, h, s, d)
    out = torch.empty_like(qd)
    for i in range(0, s, chunk):
        sc = qd[:, :, i:i + chunk] @ kd.transpose(-1, -2) / d ** 0.5
        out[:, :, i:i + chunk] = torch.softmax(sc, dim=-1) @ vd
    return out.permute(0, 2, 1, 3)


def timed(torch, fn, iters):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iters * 1e-3  # seconds per call


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bw-hdims", default="128", help="head dims of the bandwidth rows (comma-separated)")
    ap.add_argument("--bw-only", action="store_true", help="skip the accuracy rows")
    a = ap.parse_args()
    import torch
    import flash3

    if not a.bw_only:
        accuracy(torch, flash3, a)
    bandwidth(torch, flash3, a)


def accuracy(torch, flash3, a):
    d, s, h = 128, a.seqlen, a.heads
    g = torch.Generator(device="cuda").manual_seed(a.seed)

    def sample():
        x = torch.randn(1, s, h, d, device="cuda", generator=g)
        mask = torch.rand(1, s, h, d, device="cuda", generator=g) < 1e-3
        return (x + mask * 10.0 * torch.randn(1, s, h, d, device="cuda", generator=g)).to(torch.bfloat16)

    q, k, v = sample(), sample(), sample()
    ref = attention_f64(torch, q, k, v)

    def rmse(o):
        return ((o.double() - ref) ** 2).mean().sqrt().item()

    def fp8(block, hadamard):
        kw = dict(block_scales=True) if block else dict(heads_per_scale=h if block is None else 1)
        q8, qd = flash3.quantize_fp8(q, hadamard=hadamard, hadamard_seed=1234, **kw)
        k8, kd = flash3.quantize_fp8(k, hadamard=hadamard, hadamard_seed=1234, **kw)
        v8, vd = flash3.quantize_fp8(v, **kw)
        if qd.dim() == 2 and qd.shape[1] == 1:  # per tensor: (1, 1) -> the forward's (1, heads)
            qd, kd, vd = (x.expand(1, h) for x in (qd, kd, vd))
        return flash3.flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)

    rows = [("bf16", flash3.flash_attn_func(q, k, v))]
    for name, block, had in (("fp8 per-tensor", None, False), ("fp8 per-head", False, False),
                             ("fp8 block", True, False), ("fp8 per-tensor + Hadamard", None, True),
                             ("fp8 per-head + Hadamard", False, True), ("fp8 block + Hadamard", True, True)):
        rows.append((name, fp8(block, had)))
    print(f"accuracy: d {d}, seqlen {s}, heads {h}, N(0,1) + N(0,100) outliers at rate 1e-3, RMSE of O vs float64")
    base = None
    for name, o in rows:
        e = rmse(o)
        if name == "fp8 per-tensor":
            base = e
        ratio = f"  per-tensor / this = {base / e:.2f}" if base is not None and name != "fp8 per-tensor" else ""
        print(f"  {name:<28} {e:.3e}{ratio}")


def bandwidth(torch, flash3, a):
    for d in (int(v) for v in a.bw_hdims.split(",")):
        h = 2048 // d
        x = torch.randn(8, 16384, h, d, device="cuda").to(torch.bfloat16)
        n = x.numel()
        t_copy = timed(torch, lambda: x.clone(), a.iters)
        copy_bw = 4 * n / t_copy
        print(f"bandwidth: x (8, 16384, {h}, {d}) bf16; torch copy {copy_bw / 1e12:.2f} TB/s (read + write)")
        for name, kw in (("per-head", {}), ("per-head + Hadamard", dict(hadamard=True)),
                         ("block", dict(block_scales=True)),
                         ("block + Hadamard", dict(block_scales=True, hadamard=True))):
            for kernels in ("default", "raw"):  # quantize_fp8.cu, quantize_fp8_raw.cu
                os.environ["FLASH3_QUANTIZE_RAW"] = "1" if kernels == "raw" else "0"
                t = timed(torch, lambda: flash3.quantize_fp8(x, **kw), a.iters)
                descales = 8 * h * (128 if kw.get("block_scales") else 1) * 4
                bw = (3 * n + descales) / t
                print(f"  quantize_fp8 {name:<22} {kernels:<8} {t * 1e6:8.1f} us  {bw / 1e12:.2f} TB/s  "
                      f"{bw / copy_bw:.0%} of copy")
        os.environ.pop("FLASH3_QUANTIZE_RAW", None)


if __name__ == "__main__":
    main()
