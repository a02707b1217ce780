#!/usr/bin/env python3
"""Per-tile fixed cost of the backward main loop.

The backward runs one CTA per KV block (tile); a tile visits every query
block, so its time is about  a * seqlen_q + X,  where X is what a tile costs
besides its query-block iterations (launch, barrier setup, the first K / Q
load latency, the epilogue, the dQ drain). With seqlen_k, batch and heads
fixed the number of tiles, and so of waves, stays the same, and the backward
time is linear in seqlen_q:

    T(sq) = waves * (a * sq + X) + (preprocess + postprocess, also ~linear in sq)

This script times flash3's backward (all three kernels, CUDA events, sustained
load) for several seqlen_q at one seqlen_k and fits T = slope * sq + intercept
by least squares. intercept / slope is X in query rows; divided by the tile's
query rows it is X in query-block iterations: what a persistent kernel could
hide at most (see docs/performance.md, 2026-11-30 eighth session).

  python3 bench/fixed_cost.py --lib build/libflash3.so --hdim 128 --seqlen-k 4k \\
      --seqlens-q 1k,2k,4k,8k --batch 4 --causal off
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (shares the C ABI bindings and timers)


def fit_line(points):
    """Least-squares y = slope * x + intercept over (x, y) points (at least two
    distinct x); returns (slope, intercept, largest absolute residual)."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if n < 2 or sxx == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    icept = my - slope * mx
    resid = max(abs(p[1] - (slope * p[0] + icept)) for p in points)
    return slope, icept, resid


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/libflash3.so")
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen-k", default="4k")
    ap.add_argument("--seqlens-q", default="1k,2k,4k,8k")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=0, help="0: 2048 / hdim (the paper shapes' hidden size)")
    ap.add_argument("--tile-m", type=int, default=0, help="query rows per iteration, to express X in iterations")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup-ms", type=float, default=300.0)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    lib = bench.Flash3Lib(args.lib)
    d = args.hdim
    h = args.heads or 2048 // d
    b = args.batch
    sk = bench.parse_len(args.seqlen_k)
    sqs = [bench.parse_len(x) for x in args.seqlens_q.split(",")]
    stream = torch.cuda.current_stream().cuda_stream
    points = []
    for sq in sqs:
        g = torch.Generator(device="cuda").manual_seed(sq)
        q = torch.randn((b, sq, h, d), device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn((b, sk, h, d), device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn((b, sk, h, d), device="cuda", dtype=torch.bfloat16, generator=g)
        dout = torch.randn_like(q)
        opts = lib.lib.flash3_default_options()
        opts.softmax_scale = d ** -0.5
        f3 = bench.Flash3Call(torch, lib, q, k, v, dout, opts, stream)
        if f3.status != bench.FLASH3_OK or f3.bwd() != bench.FLASH3_OK:
            print(f"sq={sq}: flash3 error: {lib.last_error()}")
            return 1
        ms = bench.sustained_median(torch, f3.bwd, args.warmup_ms, args.iters)
        flops = 2.5 * bench.fwd_flops(b, h, sq, sk, d, False)
        points.append((sq, ms))
        print(f"d={d} b={b} h={h} sq={sq:6d} sk={sk}: {ms:8.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
    slope, icept, resid = fit_line(points)
    x_rows = icept / slope
    line = f"fit: T = {slope * 1e3:.4f} us/query row * sq + {icept * 1e3:.1f} us (max residual {resid * 1e3:.1f} us)"
    line += f"; X = {x_rows:.0f} query rows per tile"
    if args.tile_m:
        line += f" = {x_rows / args.tile_m:.1f} iterations of {args.tile_m} rows"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
