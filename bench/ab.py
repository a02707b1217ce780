#!/usr/bin/env python3
"""A/B timing of several flash3 builds (and cuDNN) in one process, interleaved.

Run-to-run spread on the H200 is a few percent between processes (clocks, L2
state), which is as large as the effects being measured when a tile size or a
schedule changes. This tool loads every library given with --lib (ctypes handles
of the same C ABI, symbols kept local to each), and for each shape times them
round-robin: --rounds rounds, each timing every contender for --iters runs
(median of CUDA-event timings; the order rotates from round to round), so slow
drifts and warm-up effects hit all contenders alike. The
reported number per contender is the median over rounds; the spread column is
(max - min) / median over the rounds.

  python3 bench/ab.py --lib A=build/libflash3.so --lib B=build-x/libflash3.so \\
      --hdims 128 --seqlens 8k,16k --causal both --passes fwd

Shapes as in bench.py (16k tokens, hidden 2048). No correctness check here:
run bench.py (which checks every row) for the numbers that are reported.
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the C ABI mirror and the timing helper)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", action="append", required=True, help="NAME=path/to/libflash3.so (repeatable)")
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--seqlens", default="8k")
    ap.add_argument("--causal", default="both", choices=["on", "off", "both"])
    ap.add_argument("--passes", default="fwd", help="fwd, bwd or fwd,bwd")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--warmup-ms", type=float, default=0.0,
                    help="> 0: time each contender after this long of back-to-back calls (sustained load: "
                         "the clocks the power cap allows for that kernel), --iters timed calls after it")
    ap.add_argument("--deterministic-too", action="store_true",
                    help="also time every library with opts.deterministic = 1 (contender NAME-det; "
                         "the cost of deterministic mode, backward)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("ab.py: needs a Hopper (sm_90) GPU")
        sys.exit(2)
    libs = []
    for spec in args.lib:
        name, _, path = spec.partition("=")
        lib = bench.Flash3Lib(path)
        libs.append((name, lib, False))
        if args.deterministic_too:
            libs.append((name + "-det", lib, True))
    stream = torch.cuda.current_stream().cuda_stream
    names = [n for n, _, _ in libs] + ([] if args.no_cudnn else ["cuDNN"])
    print("| hdim | seqlen | causal | pass | " + " | ".join(f"{n} TFLOP/s (spread)" for n in names) +
          " | " + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |")
    print("|" + "---:|" * (4 + 2 * len(names) - 1))
    for hdim in bench.parse_list(args.hdims, int):
        for seqlen in bench.parse_list(args.seqlens, bench.parse_len):
            b, h = max(1, args.tokens // seqlen), max(1, args.hidden // hdim)
            torch.manual_seed(7 + hdim + seqlen)
            q, k, v, dout = (torch.randn((b, seqlen, h, hdim), device="cuda", dtype=torch.bfloat16)
                             for _ in range(4))
            scale = 1.0 / math.sqrt(hdim)
            for causal in {"on": [True], "off": [False], "both": [False, True]}[args.causal]:
                for pss in bench.parse_list(args.passes, str):
                    fns = {}
                    for name, lib, det in libs:
                        opts = lib.lib.flash3_default_options()
                        opts.softmax_scale, opts.causal, opts.deterministic = scale, int(causal), int(det)
                        call = bench.Flash3Call(torch, lib, q, k, v, dout, opts, stream)
                        fns[name] = call.fwd if pss == "fwd" else call.bwd
                        if call.status != bench.FLASH3_OK or fns[name]() != bench.FLASH3_OK:
                            raise SystemExit(f"{name}: {lib.last_error()}")
                    if not args.no_cudnn:
                        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                        fns["cuDNN"] = bench.cudnn_sdpa_fn(torch, F, qt, kt, vt, causal, scale, pss)
                    times = {n: [] for n in names}
                    for rnd in range(args.rounds):
                        # Rotate who goes first: the first contender after a pause
                        # otherwise meets lower clocks every round.
                        for n in names[rnd % len(names):] + names[:rnd % len(names)]:
                            if args.warmup_ms > 0:
                                times[n].append(bench.sustained_median(torch, fns[n], args.warmup_ms, args.iters))
                            else:
                                times[n].append(bench.time_cuda(torch, fns[n], args.iters, 10, budget_s=2.0))
                    flops = bench.fwd_flops(b, h, seqlen, seqlen, hdim, causal) * (1.0 if pss == "fwd" else 2.5)
                    tf = {n: flops / (statistics.median(times[n]) * 1e-3) / 1e12 for n in names}
                    spread = {n: (max(times[n]) - min(times[n])) / statistics.median(times[n]) for n in names}
                    print(f"| {hdim} | {bench.fmt_len(seqlen)} | {'yes' if causal else 'no'} | {pss} | " +
                          " | ".join(f"{tf[n]:.1f} ({100 * spread[n]:.0f}%)" for n in names) + " | " +
                          " | ".join(f"{tf[n] / tf[names[0]]:.3f}" for n in names[1:]) + " |")
                    sys.stdout.flush()
            del q, k, v, dout
            fns, call = {}, None  # the last row's outputs and workspaces
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
