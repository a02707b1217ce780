# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py's decode-like GQA modes: --pack-gqa (pack_gqa on and off), --split-kv (num_splits 0
and 1, CUDA-graph replay) and --kvcache (flash3_forward_kvcache: cache, append, rotary, paged;
other builds and the official FlashAttention-3 beside them), each next to cuDNN, sustained and
interleaved."""
import math
import sys

from _abi import FLASH3_OK, Flash3Lib
from _calls import FA3KVCacheCall, Flash3Call, KVCacheCall, load_fa3
from _check import _judge, _PlainMath
from _common import (device_desc, fmt_len, geomean, interleave, median_spread, parse_ab, parse_causal, parse_len,
                     parse_list, sustained_desc)


# Decode-like GQA rows: (query heads, KV heads), the (batch, seqlen_k) shapes
# and the default seqlen_q list. A decode step's time is K and V streaming
# from memory: unpacked, the tile of each query head reads its group's K / V
# again (from L2 at best); packed, one tile per KV head reads them once.
PACK_GQA_HEADS = (64, 8)
PACK_GQA_SHAPES = ((4, 8192), (1, 32768))
PACK_GQA_SEQLENS_Q = "1,2,4,8,16,32,64"


def bottom_right_causal(torch, sq, sk, device):
    """(sq, sk) boolean mask of flash3's causal mask (aligned bottom-right: query i
    sees keys j <= i + sk - sq); torch SDPA's is_causal aligns top-left."""
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    return j <= i + (sk - sq)


def check_gqa_outputs(torch, F, sdpa_ctx, q, k, v, outs, scale, causal):
    """Each of `outs` ((b, sq, hq, d) results of one forward) against torch's math
    SDPA in fp32 under the tolerance rule (baseline: math SDPA in the input dtype),
    K / V repeated to q's heads. Returns (all pass, worst err / bound)."""
    g = q.shape[2] // k.shape[2]
    mask = bottom_right_causal(torch, q.shape[1], k.shape[1], q.device) if causal else None

    def sdpa(qx, kx, vx):
        kx, vx = kx.repeat_interleave(g, 2), vx.repeat_interleave(g, 2)
        with sdpa_ctx("MATH"):
            o = F.scaled_dot_product_attention(qx.transpose(1, 2), kx.transpose(1, 2), vx.transpose(1, 2),
                                               attn_mask=mask, scale=scale)
        return o.transpose(1, 2)
    with torch.no_grad():
        ref = sdpa(q.float(), k.float(), v.float())
        with _PlainMath(torch):
            base = sdpa(q, k, v)
        verdicts = [_judge(torch, o, ref, base) for o in outs]
    del ref, base
    torch.cuda.empty_cache()
    return all(x[0] for x in verdicts), max(x[1] / x[3] for x in verdicts)


def cudnn_gqa_fwd(torch, F, q, k, v, causal, scale):
    """cuDNN (torch SDPA) forward of (b, s, h, d) q on K / V with fewer heads:
    (fn, note). enable_gqa where this torch takes it (cuDNN reads the shared
    heads); else K / V repeated to q's heads once, outside the timing (the note
    says so). Raises when cuDNN cannot run the shape at all."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    # is_causal aligns top-left: flash3's bottom-right mask goes in as attn_mask when sq != sk.
    mask = None
    if causal and q.shape[1] != k.shape[1]:
        mask = bottom_right_causal(torch, q.shape[1], k.shape[1], q.device)
    is_causal = causal and mask is None

    def make(kx, vx, **kw):
        def fwd():
            with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kx, vx, attn_mask=mask, is_causal=is_causal, scale=scale,
                                                      **kw)
        return fwd
    fn = make(kt, vt, enable_gqa=True)
    try:
        fn()
        return fn, ""
    except (TypeError, RuntimeError) as e:
        g = q.shape[2] // k.shape[2]
        fn = make(kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1))
        fn()
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:100]
        return fn, f"K/V repeated to {q.shape[2]} heads (enable_gqa: {why})"


def mode_lib(args, feature, flag, what):
    """--lib for a decode mode, or None (the reason printed) when the build lacks `feature` (a
    Flash3Lib has_* attribute)."""
    lib = Flash3Lib(args.lib)
    if not getattr(lib, feature):
        print(f"bench.py {flag}: {lib.path} has no {what}")
        return None
    return lib


def cudnn_ratio(name):
    """run_decode_rows' ratio function: cuDNN's time / contender `name`'s (NaN without cuDNN)."""
    def ratio(ms):
        return ms["cuDNN"] / ms[name] if "cuDNN" in ms else float("nan")
    return ratio


def run_pack_gqa(args, torch, F, sdpa_ctx, dtype):
    lib = mode_lib(args, "has_pack_gqa", "--pack-gqa", "pack_gqa option (a build before PackGQA)")
    if lib is None:
        return 1
    return run_decode_rows(
        args, torch, F, sdpa_ctx, dtype, lib, PACK_GQA_HEADS, PACK_GQA_SHAPES,
        {"packed": dict(pack_gqa=True), "unpacked": dict(pack_gqa=False)},
        "TB/s = bytes of K and V / time; speedup = unpacked time / packed time; check: both flash3 results, "
        "worst err / bound",
        ("speedup", lambda ms: ms["unpacked"] / ms["packed"], "packed/unpacked speedup"), graph=False)


SPLIT_KV_HEADS = (64, 8)
# Issue rows (batch, seqlen_k): decode at seqlen_q = 1.
SPLIT_KV_SHAPES = ((1, 4096), (1, 16384), (1, 131072), (8, 16384), (8, 131072), (32, 131072), (128, 16384))
SPLIT_KV_GRAPH_CALLS = 10  # calls per captured graph; times are per call


def graphed(torch, launch, stream, calls=SPLIT_KV_GRAPH_CALLS):
    """A CUDA graph of `calls` back-to-back launch() calls captured on `stream`
    (launch issues its work there); returns its replay function."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        launch()  # warm up outside the capture (first-launch attributes, allocator)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            launch()
    return g.replay


def run_split_kv(args, torch, F, sdpa_ctx, dtype):
    lib = mode_lib(args, "has_num_splits", "--split-kv", "num_splits option (a build before split-KV)")
    if lib is None:
        return 1
    return run_decode_rows(
        args, torch, F, sdpa_ctx, dtype, lib, SPLIT_KV_HEADS, SPLIT_KV_SHAPES,
        {"split": dict(num_splits=0), "unsplit": dict(num_splits=1)},
        f"every contender replayed from a CUDA graph of {SPLIT_KV_GRAPH_CALLS} calls (us per call); TB/s = bytes "
        "of K and V / time; split = num_splits 0 (heuristic), unsplit = num_splits 1 (pack_gqa: heuristic for "
        "both); check: both flash3 results on batch element 0, worst err / bound",
        ("split / cuDNN", cudnn_ratio("split"), "split bandwidth / cuDNN's"), graph=True)


def decode_call(torch, lib, q, k, v, scale, causal, contender, stream):
    """A contender of run_decode_rows: its options, and "kvcache" (absent: flash3_forward;
    else KVCacheCall's mode: cache / append / rope); "lib" another build (--ab), "fa3" the
    official FlashAttention-3's operators instead of flash3."""
    o = dict(contender)
    kv = o.pop("kvcache", None)
    page_size = o.pop("page_size", 0)
    lib = o.pop("lib", lib)
    fa3 = o.pop("fa3", None)
    if fa3 is not None:
        return FA3KVCacheCall(torch, fa3, q, k, v, scale, causal, append=kv != "cache", page_size=page_size,
                              num_splits=o.get("num_splits", 0))
    opts = lib.options(scale, causal, **o)
    if kv is None:
        return Flash3Call(torch, lib, q, k, v, q, opts, stream)  # dout = q: the backward is never called
    return KVCacheCall(torch, lib, q, k, v, opts, stream, append=kv != "cache", rope=kv == "rope",
                       page_size=page_size)


def run_kvcache(args, torch, F, sdpa_ctx, dtype):
    lib = mode_lib(args, "has_kvcache", "--kvcache", "flash3_forward_kvcache (a build before the KV cache)")
    if lib is None:
        return 1
    contenders = {"split": dict(num_splits=0), "cache": dict(num_splits=0, kvcache="cache"),
                  "append": dict(num_splits=0, kvcache="append"), "rope": dict(num_splits=0, kvcache="rope"),
                  "paged256": dict(num_splits=0, kvcache="append", page_size=256),
                  "paged64": dict(num_splits=0, kvcache="append", page_size=64),
                  "paged1p": dict(num_splits=0, kvcache="append", page_size=-1)}
    if args.kvcache_only:
        contenders = {n: c for n, c in contenders.items() if n in args.kvcache_only.split(",")}
    # Other builds (--ab NAME=PATH): their append and paged contenders, suffixed @NAME.
    for i, spec in enumerate(args.ab or []):
        name, path = parse_ab(spec, i + 1)
        other = Flash3Lib(path)
        for n in ("append", "paged256", "paged64"):
            if n in contenders:
                contenders[f"{n}@{name}"] = dict(contenders[n], lib=other)
    if args.fa3:
        fa3 = load_fa3(torch, args.fa3)
        contenders.update({"fa3": dict(num_splits=0, kvcache="append", fa3=fa3),
                           "fa3paged256": dict(num_splits=0, kvcache="append", page_size=256, fa3=fa3),
                           "fa3paged64": dict(num_splits=0, kvcache="append", page_size=64, fa3=fa3)})
    return run_decode_rows(
        args, torch, F, sdpa_ctx, dtype, lib, SPLIT_KV_HEADS, SPLIT_KV_SHAPES, contenders,
        f"every contender replayed from a CUDA graph of {SPLIT_KV_GRAPH_CALLS} calls (us per call); TB/s = bytes "
        "of K and V / time; num_splits 0 for all: split = flash3_forward on k / v; cache = "
        "flash3_forward_kvcache on the same tensors as a full cache; append = the last row appended by the "
        "call (k_new / v_new, one row); rope = append with rotary on that row and q; paged256 / paged64 = "
        "append on a paged copy of the cache (page_table, pages of 256 / 64 rows in a random order), paged1p with "
        "one page per sequence; check: "
        "split, cache, append and paged on batch element 0, worst err / bound",
        ("cuDNN / append", cudnn_ratio("append"), "KV-cache decode step (append) bandwidth / cuDNN's"), graph=True)


def run_decode_rows(args, torch, F, sdpa_ctx, dtype, lib, heads, shapes, contenders, legend, ratio, graph):
    """The decode-like GQA table of --pack-gqa and --split-kv: per (batch, seqlen_k) of `shapes`
    and seqlen_q of --seqlens, the flash3 `contenders` ({name: options}) and cuDNN, sustained
    and interleaved; ratio = (column name, fn(ms by name), summary label). graph: each contender
    replayed from a CUDA graph of SPLIT_KV_GRAPH_CALLS calls, and only batch element 0 checked
    (the reference repeats K / V to every query head)."""
    stream = torch.cuda.Stream() if graph else None
    raw_stream = stream.cuda_stream if graph else torch.cuda.current_stream().cuda_stream
    per_call = SPLIT_KV_GRAPH_CALLS if graph else 1
    hq, hkv = heads
    d = parse_list(args.hdims, int)[0]
    print(f"{device_desc(torch)}{sustained_desc(args)} | gap {args.gap_s:g} s | flash3 {lib.version()} ({lib.path})")
    print(f"d = {d}, {hq} query heads on {hkv} KV heads; {legend}")
    names = list(contenders) + ([] if args.no_cudnn else ["cuDNN"])
    print("| batch | seqlen_k | seqlen_q | causal | " + " | ".join(f"{n} us (spread)" for n in names) + " | " +
          " | ".join(f"{n} TB/s" for n in names) + f" | {ratio[0]} | check |")
    print("|" + "---:|" * (4 + 2 * len(names) + 1) + "---|")
    sys.stdout.flush()
    ratios, failed, notes = [], False, set()
    for batch, sk in shapes:
        gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + sk)
        k, v = (torch.randn((batch, sk, hkv, d), device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        kv_bytes = 2 * k.numel() * k.element_size()
        for sq in parse_list(args.seqlens, parse_len):
            q = torch.randn((batch, sq, hq, d), device="cuda", dtype=dtype, generator=gen)
            for causal in parse_causal(args.causal):
                scale = 1.0 / math.sqrt(d)
                label = f"b={batch} sk={fmt_len(sk)} sq={sq}{' causal' if causal else ''}"
                # The calls may run on another stream: q / k / v, written on the current one, must be ready.
                torch.cuda.synchronize()
                calls = {n: decode_call(torch, lib, q, k, v, scale, causal, o, raw_stream)
                         for n, o in contenders.items()}
                torch.cuda.synchronize()
                bad = [n for n, c in calls.items() if c.status != FLASH3_OK]
                if bad:
                    print(f"  {label} {'/'.join(bad)}: {lib.last_error()}")
                    failed = True
                    continue
                check = "-"
                if not args.no_check:
                    n_check = 1 if graph else batch
                    ok, worst = check_gqa_outputs(torch, F, sdpa_ctx, q[:n_check], k[:n_check], v[:n_check],
                                                  [c.out[:n_check] for c in calls.values()
                                                   if getattr(c, "check", True)], scale, causal)
                    check = f"{'PASS' if ok else 'FAIL'} ({worst:.2f})"
                    failed |= not ok
                fns = {n: graphed(torch, c.fwd, stream) if graph else c.fwd for n, c in calls.items()}
                if not args.no_cudnn:
                    try:
                        fn, note = cudnn_gqa_fwd(torch, F, q, k, v, causal, scale)
                        fns["cuDNN"] = graphed(torch, fn, stream) if graph else fn
                        if note:
                            notes.add(note)
                    except (RuntimeError, TypeError, ImportError) as e:  # cuDNN cannot run this shape
                        print(f"  cuDNN {label}: {(str(e).strip().splitlines() or [type(e).__name__])[0][:160]}")
                ms, spread = median_spread(interleave(torch, fns, args.rounds, args.iters, args.warmup_ms, args.gap_s),
                                           per_call)
                us = [f"{1e3 * ms[n]:.1f} ({100 * spread[n]:.0f}%)" if n in ms else "n/a" for n in names]
                tbs = [f"{kv_bytes / (ms[n] * 1e-3) / 1e12:.2f}" if n in ms else "n/a" for n in names]
                r = ratio[1](ms)
                ratios.append((r, label))
                print(f"| {batch} | {fmt_len(sk)} | {sq} | {'yes' if causal else 'no'} | " + " | ".join(us) + " | " +
                      " | ".join(tbs) + f" | {r:.3f} | {check} |")
                sys.stdout.flush()
                del calls, fns
            del q
        del k, v
        torch.cuda.empty_cache()
    for note in sorted(notes):
        print(f"cuDNN: {note}")
    if ratios and all(math.isfinite(x) for x, _ in ratios):
        lo = min(ratios)
        print(f"\n{ratio[2]}: geomean {geomean([x for x, _ in ratios]):.3f} over {len(ratios)} rows; "
              f"lowest {lo[0]:.3f} ({lo[1]})")
    return 1 if failed else 0
