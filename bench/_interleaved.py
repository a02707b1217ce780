# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py's interleaved mode (--ab, --steady): flash3 builds and cuDNN timed in one process,
round-robin, per contender the median over rounds and its spread."""
import sys

from _abi import FLASH3_OK, Flash3Lib
from _calls import Flash3Call
from _common import (cudnn_sdpa_fn, device_desc, each_row, fmt_len, geomean, interleave, median_spread, parse_ab,
                     sustained_desc)


def run_interleaved(args, torch, F, passes, causals, dtype):
    builds = [(args.name, args.lib)] + [parse_ab(s, i + 1) for i, s in enumerate(args.ab or [])]
    libs = []  # (contender name, Flash3Lib, deterministic, softcap)
    for name, path in builds:
        lib = Flash3Lib(path)
        libs.append((name, lib, False, 0.0))
        if args.deterministic_too:
            libs.append((name + "-det", lib, True, 0.0))
        if args.softcap_too > 0:
            libs.append((name + "-softcap", lib, False, args.softcap_too))
    names = [n for n, *_ in libs] + ([] if args.no_cudnn else ["cuDNN"])
    if len(names) < 2:
        print("bench.py: the interleaved mode needs two contenders (--ab, or cuDNN without --no-cudnn)")
        return 1
    print(f"{device_desc(torch)}{sustained_desc(args)} | gap {args.gap_s:g} s")
    for name, lib, det, cap in libs:
        if not det and cap == 0:
            print(f"  {name}: {lib.path} (flash3 {lib.version()})")
    print("| hdim | seqlen | causal | pass | " + " | ".join(f"{n} TFLOP/s (spread)" for n in names) +
          " | " + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |")
    print("|" + "---:|" * (4 + 2 * len(names) - 1))
    sys.stdout.flush()
    stream = torch.cuda.current_stream().cuda_stream
    ratios = {(pss, n): [] for pss in passes for n in names[1:]}  # (ratio, row label)
    failed = False
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v, dout) in each_row(torch, args, causals, passes, dtype):
        fns, calls = {}, []
        for name, lib, det, cap in libs:
            call = Flash3Call(torch, lib, q, k, v, dout, lib.options(scale, causal, det, cap), stream)
            fn = call.fwd if pss == "fwd" else call.bwd
            if call.status != FLASH3_OK or fn() != FLASH3_OK:
                print(f"  {name} d={hdim} s={seqlen} causal={causal} {pss}: {lib.last_error()}")
                failed = True
                continue
            fns[name] = fn
            calls.append(call)
        if not args.no_cudnn:
            try:
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                fns["cuDNN"] = cudnn_sdpa_fn(torch, F, qt, kt, vt, causal, scale, pss)
                fns["cuDNN"]()
            except RuntimeError as e:  # cuDNN cannot run this shape
                fns.pop("cuDNN", None)
                print(f"  cuDNN d={hdim} s={seqlen} causal={causal} {pss}: {str(e).strip()[:160]}")
        ms, spread = median_spread(interleave(torch, fns, args.rounds, args.iters, args.warmup_ms, args.gap_s))
        tf = {n: flops / (ms[n] * 1e-3) / 1e12 for n in ms}
        label = f"d={hdim} {fmt_len(seqlen)}{' causal' if causal else ''}"
        cells = [f"{tf[n]:.1f} ({100 * spread[n]:.0f}%)" if n in tf else "n/a" for n in names]
        rcells = []
        for n in names[1:]:
            if n in tf and names[0] in tf:
                ratios[(pss, n)].append((tf[n] / tf[names[0]], label))
                rcells.append(f"{tf[n] / tf[names[0]]:.3f}")
            else:
                rcells.append("-")
        print(f"| {hdim} | {fmt_len(seqlen)} | {'yes' if causal else 'no'} | {pss} | " + " | ".join(cells) +
              " | " + " | ".join(rcells) + " |")
        sys.stdout.flush()
        del fns, calls
    print()
    for (pss, n), rs in ratios.items():
        if rs:
            g = geomean([x for x, _ in rs])
            lo = min(rs)
            print(f"{pss}: geomean {n}/{names[0]} = {g:.3f} over {len(rs)} rows; lowest {lo[0]:.3f} ({lo[1]})")
    return 1 if failed else 0
