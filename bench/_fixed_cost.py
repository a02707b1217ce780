# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py --fixed-cost: flash3's backward at one seqlen_k and several seqlen_q, fitted as
T = slope * sq + intercept (the per-tile fixed cost, in query rows)."""
from _abi import FLASH3_OK, Flash3Lib
from _calls import Flash3Call
from _common import fwd_flops, parse_len, parse_list, sustained_median


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


def run_fixed_cost(args, torch, dtype):
    """The backward runs one CTA per KV block (tile), which visits every query
    block, so with seqlen_k, batch and heads fixed (a fixed number of tiles and
    waves) T(sq) = waves * (a * sq + X) + pre/postprocess (also ~linear in sq)."""
    lib = Flash3Lib(args.lib)
    d = parse_list(args.hdims, int)[0]
    h, b = max(1, args.hidden // d), args.batch
    sk = parse_len(args.seqlen_k)
    stream = torch.cuda.current_stream().cuda_stream
    points = []
    for sq in parse_list(args.seqlens, parse_len):
        g = torch.Generator(device="cuda").manual_seed(sq)
        q = torch.randn((b, sq, h, d), device="cuda", dtype=dtype, generator=g)
        k = torch.randn((b, sk, h, d), device="cuda", dtype=dtype, generator=g)
        v = torch.randn((b, sk, h, d), device="cuda", dtype=dtype, generator=g)
        dout = torch.randn_like(q)
        f3 = Flash3Call(torch, lib, q, k, v, dout, lib.options(d ** -0.5), stream)
        if f3.status != FLASH3_OK or f3.bwd() != FLASH3_OK:
            print(f"sq={sq}: flash3 error: {lib.last_error()}")
            return 1
        ms = sustained_median(torch, f3.bwd, args.warmup_ms, args.iters)
        flops = 2.5 * fwd_flops(b, h, sq, sk, d, False)
        points.append((sq, ms))
        print(f"d={d} b={b} h={h} sq={sq:6d} sk={sk}: {ms:8.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
        del f3, q, k, v, dout
    slope, icept, resid = fit_line(points)
    x_rows = icept / slope
    line = f"fit: T = {slope * 1e3:.4f} us/query row * sq + {icept * 1e3:.1f} us (max residual {resid * 1e3:.1f} us)"
    line += f"; X = {x_rows:.0f} query rows per tile"
    if args.tile_m:
        line += f" = {x_rows / args.tile_m:.1f} iterations of {args.tile_m} rows"
    print(line)
    return 0
