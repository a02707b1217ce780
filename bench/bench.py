#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 benchmark: TFLOP/s of flash3 beside torch SDPA (cuDNN and FlashAttention-2).

Shapes follow the FlashAttention-3 paper: 16k tokens per batch (batch = 16384 // seqlen),
hidden 2048 (heads = 2048 // hdim), hdim in {64, 128, 256}, seqlen 512 .. 16k, causal
off/on, forward and backward (backward FLOPs = 2.5 x forward; forward FLOPs =
4 * b * h * sq * sk * d, halved for causal). The 14 headline rows (--headline) are
hdim 128 at 4k / 8k / 16k and hdims 64 and 256 at 8k / 16k, causal and not.

flash3 is loaded through its C ABI (include/flash3/flash3_c.h) with ctypes.

Modes:
  table (default)  every row checked against torch math SDPA in fp32 (tolerance rule
                   err <= 2 * err(plain bf16 math SDPA) + 1e-5, no NaN), then flash3, cuDNN
                   and FA2 timed; a markdown table, geomeans, optional CSV and plot.
  --ab [NAME=]PATH another flash3 build (repeatable), timed in the same process as --lib
                   (named by --name) and cuDNN, interleaved: --rounds rounds, each timing
                   every contender once, the first contender rotating; per contender the
                   median over rounds and the spread (max - min) / median. Run-to-run drift
                   between processes (clocks, L2 state) is as large as most kernel changes.
                   Libraries of either flash3_options layout (with or without struct_size)
                   can be compared. No correctness check.
  --steady         the interleaved mode against cuDNN under sustained load: each timing
                   after --warmup-ms (300) of back-to-back calls, --rounds 2 (both orders),
                   --gap-s 1 of idle before each round, headline rows unless --hdims /
                   --seqlens are given. Under the H200's power cap the clocks drop within
                   tens of milliseconds of continuous work, and not equally for every
                   kernel, so a short burst after an idle gap measures boost clocks a
                   training job does not see.
  --power          each contender back to back for --seconds while nvidia-smi samples power
                   and SM clock: mean power, clock, time and energy per call (headline rows
                   of the backward by default). The H200 holds its power cap under these
                   loads, so energy per call sets the sustained speed.
  --fixed-cost     flash3's backward at one --seqlen-k and several --seqlens (seqlen_q),
                   sustained, fitted as T = slope * sq + intercept: intercept / slope is what
                   a KV-block tile costs besides its query-block iterations (launch, first
                   loads, epilogue), in query rows (in iterations with --tile-m).
  --varlen         variable-length forward and backward (--passes), sustained and interleaved
                   like --steady:
                   (a) every headline row as a varlen batch of equal lengths next to the
                   fixed-length call on the same tensors (varlen / fixed); (b) a document mix
                   (--tokens in lengths drawn log-uniformly from 64..8192, causal, d = 128):
                   one varlen call next to one fixed-length call per document (flash3 and
                   cuDNN), in TFLOP/s of useful (causal) work.
  --pack-gqa       PackGQA on decode-like GQA rows: d = 128 (--hdims), 64 query heads on 8 KV
                   heads, batch 4 x 8k keys and batch 1 x 32k keys, seqlen_q 1 .. 64 (--seqlens),
                   non-causal (--causal): the forward with pack_gqa = 1 and 0 from the same
                   library, and cuDNN (SDPA, enable_gqa), sustained and interleaved like --steady;
                   time (us), effective K+V read bandwidth (bytes of K and V / time) and the
                   packed / unpacked speedup per row, both flash3 results checked against fp32
                   math SDPA under the tolerance rule (--no-check: not).
  --split-kv       split-KV on the decode rows (seqlen_q 1 (--seqlens), d = 128, 64 query heads on 8
                   KV heads, batch x seqlen_k 1 x 4k .. 128 x 16k): num_splits 0 (heuristic) and 1
                   from the same library, and cuDNN, each replayed from a CUDA graph of 10 calls,
                   sustained and interleaved like --steady; time per call (us), effective K+V read
                   bandwidth and cuDNN time / split time; both flash3 results checked on batch
                   element 0 (--no-check: not).
  --kvcache        the KV-cache decode step on the --split-kv rows: flash3_forward_kvcache on a full
                   cache (cache), with its last row appended by the call (append), and with rotary
                   on that row and q (rope), the append on paged copies of the cache (paged256,
                   paged64: page_table, pages in a random order), next to flash3_forward (split)
                   and cuDNN, num_splits 0, CUDA-graph replay; cuDNN time / append time.
  --from-csv CSV   no GPU: re-print the table of a CSV written by --csv (and --plot it).

Usage:
  python3 bench/bench.py                       # full table (about 10 minutes on an H200)
  python3 bench/bench.py --quick               # a small subset
  python3 bench/bench.py --hdims 128 --seqlens 4k,8k --passes fwd --causal on --csv out.csv
  python3 bench/bench.py --headline --rounds 2 --warmup-ms 300   # headline rows, sustained
  python3 bench/bench.py --lib old/libflash3.so --name old --ab new=build/libflash3.so \\
      --headline --passes fwd,bwd --warmup-ms 300               # new / old, one process
  python3 bench/bench.py --steady --passes fwd,bwd
  python3 bench/bench.py --power --passes bwd --hdims 128 --seqlens 4k --causal on
  python3 bench/bench.py --fixed-cost --hdims 128 --seqlen-k 4k --seqlens 2k,4k,8k,16k --tile-m 80
  python3 bench/bench.py --pack-gqa
  python3 bench/bench.py --split-kv
  python3 bench/bench.py --kvcache
  python3 bench/bench.py --from-csv out.csv --plot out.png
Profiling one kernel: ncu --kernel-name regex:flash_bwd_kernel --launch-count 1 python3
bench/bench.py --iters 1 --warmup 0 --no-check --passes bwd --hdims 128 --seqlens 8k --causal off;
its main loops' SASS: tools/sass_loops.py.
Exit status: 0 ok, 1 a check failed (or the library could not be loaded), 2 no Hopper GPU.
"""
# The modes live in the modules beside this file (bench/_*.py); bench.py keeps the command line
# and re-exports their names (bench_fp8.py and tests/unit import them from here).
# contextlib, csv, ctypes, math, statistics, subprocess and time: names bench has always had.
import argparse
import contextlib  # noqa: F401
import csv  # noqa: F401
import ctypes  # noqa: F401
import math  # noqa: F401
import os
import statistics  # noqa: F401
import subprocess  # noqa: F401
import sys
import time  # noqa: F401

from _abi import (  # noqa: F401
    f3_tensor,
    F3KVCacheArgs,
    F3Options,
    F3OptionsNoSize,
    F3OptionsV1,
    F3OptionsV2,
    F3OptionsV3,
    F3Tensor,
    FLASH3_BF16,
    FLASH3_CUDA_ERROR,
    FLASH3_FP16,
    FLASH3_FP32,
    FLASH3_FP8_E4M3,
    FLASH3_INTERNAL,
    FLASH3_INVALID_ARGUMENT,
    FLASH3_NOT_SUPPORTED,
    FLASH3_OK,
    Flash3Lib,
    _OPTION_FIELDS,
    _PACK_FIELDS,
    _SPLIT_FIELDS,
    STATUS_NAMES,
    _VARLEN_FIELDS,
)
from _calls import (  # noqa: F401
    fa3_forward,
    FA3KVCacheCall,
    Flash3Call,
    KVCacheCall,
    load_fa3,
)
from _common import (  # noqa: F401
    cudnn_sdpa_fn,
    each_row,
    events_median,
    fmt_len,
    fwd_flops,
    geomean,
    HEADLINE_ROWS,
    interleave,
    parse_ab,
    parse_causal,
    parse_len,
    parse_list,
    run_for,
    shape_pairs,
    sustained_median,
    time_cuda,
)
from _check import (  # noqa: F401
    CHECK_BUDGET,
    check_bwd,
    check_fwd,
    check_subset,
    _judge,
    _math_sdpa,
    _PlainMath,
)
from _table import (  # noqa: F401
    cell_ratio,
    cell_tflops,
    CONTENDERS,
    finish_table,
    has_fa3,
    _nograd_ctx,
    plot,
    print_row_line,
    print_summary,
    print_table,
    read_csv,
    RowResult,
    run_row,
    run_table,
    time_rounds,
    write_csv,
)
from _interleaved import (  # noqa: F401
    run_interleaved,
)
from _varlen import (  # noqa: F401
    doc_mix_lengths,
    f3_varlen_fwd,
    itertools_accumulate,
    run_varlen,
)
from _decode import (  # noqa: F401
    bottom_right_causal,
    check_gqa_outputs,
    cudnn_gqa_fwd,
    decode_call,
    graphed,
    PACK_GQA_HEADS,
    PACK_GQA_SEQLENS_Q,
    PACK_GQA_SHAPES,
    run_decode_rows,
    run_kvcache,
    run_pack_gqa,
    run_split_kv,
    SPLIT_KV_GRAPH_CALLS,
    SPLIT_KV_HEADS,
    SPLIT_KV_SHAPES,
)
from _power import (  # noqa: F401
    parse_smi_line,
    run_batch,
    run_power,
    segment_stats,
)
from _fixed_cost import (  # noqa: F401
    fit_line,
    run_fixed_cost,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libflash3.so"), help="flash3 shared library")
    ap.add_argument("--fa3", default=None, metavar="SO",
                    help="table mode: also time the official FlashAttention-3 from its built torch extension "
                         "(../shared/anchors/build_fa3.sh DIR train prints the path)")
    ap.add_argument("--hdims", default=None, help="head dims (default 64,128,256; --fixed-cost: its first)")
    ap.add_argument("--seqlens", default=None,
                    help="sequence lengths (default 512,1k,2k,4k,8k,16k; --fixed-cost: seqlen_q, default 1k,2k,4k,8k)")
    ap.add_argument("--headline", action="store_true",
                    help="the 14 headline rows (hdim 128 at 4k/8k/16k, hdims 64 and 256 at 8k/16k) instead of "
                         "--hdims x --seqlens")
    ap.add_argument("--passes", default=None, help="fwd, bwd or fwd,bwd (default fwd,bwd; --power: bwd)")
    ap.add_argument("--causal", default=None, help="on, off or both (default both; --pack-gqa: off)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--iters", type=int, default=None,
                    help="timed runs per measurement (default 30, fewer for big shapes; interleaved 50, --steady "
                         "100; --fixed-cost 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=None,
                    help="table: time flash3 / cuDNN / FA2 round-robin this many times per row (order rotating) and "
                         "report the median over rounds (default 1); interleaved: rounds per row (default 5, "
                         "--steady 2). A short burst without --warmup-ms favours the kernel that keeps its boost "
                         "clock longer under the power cap")
    ap.add_argument("--warmup-ms", type=float, default=None,
                    help="> 0: before each timing, run the contender back to back for this long, so it is timed at "
                         "the clocks sustained load gets under the power cap (default 0; --steady and --fixed-cost "
                         "300; the README tables use 300 with --rounds 2)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch (batch = tokens // seqlen)")
    ap.add_argument("--hidden", type=int, default=2048, help="hidden size (heads = hidden // hdim)")
    g = ap.add_argument_group("table mode")
    g.add_argument("--csv", default=None, help="write every row to this CSV file")
    g.add_argument("--plot", default=None, help="bar chart PNG of TFLOP/s per row (needs matplotlib)")
    g.add_argument("--quick", action="store_true", help="small subset: hdim 128, seqlens 1k and 8k, 10 iterations")
    g.add_argument("--no-check", action="store_true", help="skip the correctness check")
    g.add_argument("--from-csv", default=None, metavar="CSV", help="no GPU: the table (and --plot) of a --csv file")
    g = ap.add_argument_group("interleaved mode")
    g.add_argument("--ab", action="append", metavar="[NAME=]PATH",
                   help="another flash3 library to time against --lib in the same process (repeatable)")
    g.add_argument("--name", default="flash3", help="the contender name of --lib (default flash3)")
    g.add_argument("--steady", action="store_true", help="sustained-load comparison with cuDNN (presets above)")
    g.add_argument("--no-cudnn", action="store_true", help="leave cuDNN out")
    g.add_argument("--gap-s", type=float, default=None, help="idle seconds before each round (default 0; --steady 1)")
    g.add_argument("--softcap-too", type=float, default=0.0, metavar="CAP",
                   help="also time each flash3 build with softcap = CAP (contender NAME-softcap)")
    g.add_argument("--deterministic-too", action="store_true",
                   help="also time every library with opts.deterministic = 1 (contender NAME-det)")
    g = ap.add_argument_group("varlen mode")
    g.add_argument("--varlen", action="store_true", help="varlen against fixed length, and a document mix")
    g = ap.add_argument_group("PackGQA mode")
    g.add_argument("--pack-gqa", action="store_true",
                   help="pack_gqa on and off (and cuDNN) on decode-like GQA rows (presets above)")
    g = ap.add_argument_group("split-KV mode")
    g.add_argument("--split-kv", action="store_true",
                   help="num_splits 0 (heuristic) and 1 (and cuDNN) on decode rows, CUDA-graph replay (presets above)")
    g = ap.add_argument_group("KV-cache mode")
    g.add_argument("--kvcache-only", default="", metavar="NAMES",
                   help="--kvcache: only these flash3 contenders (comma-separated, e.g. append,paged256)")
    g.add_argument("--kvcache", action="store_true",
                   help="flash3_forward_kvcache (plain, append, append + rotary) on the split-KV decode rows")
    g = ap.add_argument_group("power mode")
    g.add_argument("--power", action="store_true", help="power, clock and energy per call under sustained load")
    g.add_argument("--seconds", type=float, default=4.0,
                   help="seconds per contender and row (nvidia-smi averages power over about 1 s: keep >= 4)")
    g = ap.add_argument_group("fixed-cost mode")
    g.add_argument("--fixed-cost", action="store_true", help="fit the backward's time against seqlen_q")
    g.add_argument("--seqlen-k", default="4k")
    g.add_argument("--batch", type=int, default=4)
    g.add_argument("--tile-m", type=int, default=0, help="query rows per iteration, to express X in iterations")
    args = ap.parse_args(argv)

    modes = [m for m in ("ab", "steady", "power", "fixed_cost", "from_csv", "varlen", "pack_gqa", "split_kv",
                         "kvcache")
             if getattr(args, m)]
    if "steady" in modes and "ab" in modes:
        modes.remove("steady")
    if len(modes) > 1:
        ap.error("choose one mode: --ab / --steady, --power, --fixed-cost, --varlen, --pack-gqa, --split-kv, "
                 "--kvcache or --from-csv")
    args.mode = {"ab": "interleaved", "steady": "interleaved"}.get(modes[0], modes[0]) if modes else "table"
    if args.varlen:
        args.mode = "varlen"
    if args.mode == "table" and (args.softcap_too > 0 or args.deterministic_too):
        args.mode = "interleaved"  # the extra contenders only exist there
    interleaved = args.mode == "interleaved"
    if args.varlen or args.pack_gqa or args.split_kv or args.kvcache:  # sustained and interleaved, as --steady
        args.steady = True
    if args.pack_gqa:
        args.seqlens = args.seqlens or PACK_GQA_SEQLENS_Q
        args.hdims = args.hdims or "128"
    if args.split_kv or args.kvcache:
        args.seqlens = args.seqlens or "1"
        args.hdims = args.hdims or "128"
    args.causal = args.causal or ("off" if args.pack_gqa or args.split_kv or args.kvcache else "both")
    if args.steady or (args.power and args.hdims is None and args.seqlens is None):
        args.headline = args.headline or (args.hdims is None and args.seqlens is None)
    if args.fixed_cost:
        args.seqlens = args.seqlens or "1k,2k,4k,8k"
        args.hdims = args.hdims or "128"
    args.hdims = args.hdims or "64,128,256"
    args.seqlens = args.seqlens or "512,1k,2k,4k,8k,16k"
    args.passes = args.passes or ("bwd" if args.power else "fwd,bwd")
    default_iters = 100 if args.steady else 50 if interleaved else 20 if args.fixed_cost else 30
    args.iters = args.iters if args.iters is not None else default_iters
    args.rounds = args.rounds if args.rounds is not None else (2 if args.steady else 5 if interleaved else 1)
    args.warmup_ms = args.warmup_ms if args.warmup_ms is not None else (
        300.0 if args.steady or args.fixed_cost else 0.0)
    args.gap_s = args.gap_s if args.gap_s is not None else (1.0 if args.steady else 0.0)
    return ap, args


def main(argv=None):
    ap, args = parse_args(argv)
    passes = parse_list(args.passes, lambda x: x.strip().lower())
    for p in passes:
        if p not in ("fwd", "bwd"):
            ap.error(f"--passes: unknown pass '{p}' (fwd, bwd)")
    if args.mode == "from_csv":
        results = read_csv(args.from_csv)
        finish_table(argparse.Namespace(csv=None, plot=args.plot), results,
                     [p for p in ("fwd", "bwd") if any(r.pss == p for r in results)])
        return 0
    causals = parse_causal(args.causal)

    # First thing: a Hopper GPU.
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"flash3: no Hopper GPU found (torch is not importable: {e})")
        return 2
    if not torch.cuda.is_available():
        print("flash3: no Hopper GPU found (torch.cuda.is_available() is False)")
        return 2
    cap = torch.cuda.get_device_capability()
    if tuple(cap) != (9, 0):
        print(f"flash3: no Hopper GPU found (device 0 is {torch.cuda.get_device_name()}, sm_{cap[0]}{cap[1]})")
        return 2

    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        SDPBackend = sdpa_kernel = None

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    f3_dtype = FLASH3_BF16 if args.dtype == "bf16" else FLASH3_FP16
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def sdpa_ctx(backend):
        if sdpa_kernel is not None:
            return sdpa_kernel(getattr(SDPBackend, backend))
        # Old torch: the boolean context manager.
        flags = dict(enable_flash=backend == "FLASH_ATTENTION", enable_math=backend == "MATH",
                     enable_mem_efficient=False)
        if backend == "CUDNN_ATTENTION":
            raise RuntimeError("this torch has no cuDNN SDPA backend")
        return torch.backends.cuda.sdp_kernel(**flags)

    if args.mode == "interleaved":
        return run_interleaved(args, torch, F, passes, causals, dtype)
    if args.mode == "power":
        return run_power(args, torch, F, passes, causals, dtype)
    if args.mode == "varlen":
        return run_varlen(args, torch, F, dtype)
    if args.mode == "fixed_cost":
        return run_fixed_cost(args, torch, dtype)
    if args.mode == "pack_gqa":
        return run_pack_gqa(args, torch, F, sdpa_ctx, dtype)
    if args.mode == "split_kv":
        return run_split_kv(args, torch, F, sdpa_ctx, dtype)
    if args.mode == "kvcache":
        return run_kvcache(args, torch, F, sdpa_ctx, dtype)
    return run_table(args, torch, F, sdpa_ctx, passes, causals, dtype, f3_dtype)


if __name__ == "__main__":
    sys.exit(main())
