# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py's table mode (the default): every row checked, then flash3, cuDNN, FA2 (and the
official FlashAttention-3 with --fa3) timed; the markdown table, geomeans, CSV and plot
(--from-csv re-prints them)."""
import contextlib
import csv
import ctypes
import os
import statistics
import sys

from _abi import FLASH3_FP32, FLASH3_NOT_SUPPORTED, FLASH3_OK, STATUS_NAMES, Flash3Lib, f3_tensor
from _calls import fa3_forward, load_fa3
from _check import check_bwd, check_fwd
from _common import HEADLINE_ROWS, device_desc, each_row, fmt_len, geomean, time_cuda

# Table-mode contenders: flash3, cuDNN and FlashAttention-2 through torch SDPA, and the
# official FlashAttention-3 when --fa3 names its torch extension.
CONTENDERS = ("flash3", "cudnn", "fa2", "fa3")


class RowResult:
    def __init__(self, hdim, seqlen, causal, pss, batch, heads):
        self.hdim, self.seqlen, self.causal, self.pss = hdim, seqlen, causal, pss
        self.batch, self.heads = batch, heads
        self.flops = 0.0
        self.ms = {w: None for w in CONTENDERS}
        self.note = {w: "" for w in CONTENDERS}
        self.check = "-"
        self.err = self.bound = None

    def tflops(self, who):
        ms = self.ms[who]
        return self.flops / (ms * 1e-3) / 1e12 if ms else None

    def ratio(self, a, b):
        ta, tb = self.tflops(a), self.tflops(b)
        return ta / tb if ta and tb else None


# ---------------------------------------------------------------------------
# Table mode.
# ---------------------------------------------------------------------------
def run_table(args, torch, F, sdpa_ctx, passes, causals, dtype, f3_dtype):
    iters, warmup = args.iters, args.warmup
    if args.quick:
        args.headline, args.hdims, args.seqlens = False, "128", "1k,8k"
        iters, warmup = min(iters, 10), min(warmup, 3)
    lib, lib_error = None, ""
    try:
        lib = Flash3Lib(args.lib)
    except OSError as e:
        lib_error = f"cannot load {args.lib}: {e}"
        print(f"flash3: {lib_error}; timing the baselines only")
    if lib is not None and not lib.lib.flash3_device_is_supported():
        print("flash3: the library says this device is not supported; timing the baselines only")
        lib_error = "device not supported by flash3"
        lib = None

    fa3 = load_fa3(torch, args.fa3) if args.fa3 else None
    print(f"{device_desc(torch)} | flash3 {lib.version() if lib else '(not loaded)'} | dtype {args.dtype}"
          f"{f' | FA3 {args.fa3}' if fa3 else ''}")
    sys.stdout.flush()

    stream = torch.cuda.current_stream().cuda_stream
    results = []
    any_fail = False
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v) in each_row(torch, args, causals, passes, dtype, 3):
        r = RowResult(hdim, seqlen, causal, pss, q.shape[0], q.shape[2])
        r.flops = flops
        try:
            run_row(torch, F, lib, lib_error, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, iters, warmup,
                    not args.no_check, args.rounds, args.warmup_ms, fa3)
        except torch.cuda.OutOfMemoryError as e:  # keep going with the next row
            r.check = "OOM"
            print(f"  out of memory: {e}")
            torch.cuda.empty_cache()
        any_fail |= r.check.startswith("FAIL")
        results.append(r)
        print_row_line(r)
        sys.stdout.flush()

    finish_table(args, results, passes)
    if lib is None:
        return 1
    return 1 if any_fail else 0


def finish_table(args, results, passes):
    print()
    print_table(results)
    print_summary(results, passes)
    if args.csv:
        write_csv(args.csv, results)
        print(f"\nwrote {args.csv}")
    if args.plot:
        plot(args.plot, results)


def run_row(torch, F, lib, lib_error, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, iters, warmup, do_check,
            rounds=1, warmup_ms=0.0, fa3=None):
    # rounds == 1: each contender is timed right after its probe / check.
    # rounds > 1: the contenders that ran are collected (who -> (fn, context
    # factory)) and timed round-robin at the end (time_rounds), so their
    # buffers stay alive: `keep`.
    timers, keep = {}, []

    def measure(who, fn, ctx=None):
        if rounds <= 1:
            r.ms[who] = time_cuda(torch, fn, iters, warmup, warmup_ms=warmup_ms)
        else:
            timers[who] = (fn, ctx)

    if lib is None:
        r.note["flash3"] = "no library" if lib_error else "n/a"
    else:
        keep += _row_flash3(torch, F, lib, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, do_check, measure)
    _row_sdpa(torch, F, sdpa_ctx, r, q, k, v, scale, measure)
    if fa3 is None:
        r.note["fa3"] = "-"
    else:
        keep += _row_fa3(torch, fa3, r, q, k, v, scale, measure)

    if timers:
        time_rounds(torch, r, timers, iters, warmup, rounds, warmup_ms)


def _row_flash3(torch, F, lib, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, do_check, measure):
    """run_row's flash3: its forward (and backward) on the row, checked, then measure()d; returns
    the buffers and structs the timed calls use."""
    causal, pss = r.causal, r.pss
    b, s, h, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
    tq, tk, tv = f3_tensor(q, f3_dtype), f3_tensor(k, f3_dtype), f3_tensor(v, f3_dtype)
    to, tl = f3_tensor(out, f3_dtype), f3_tensor(lse, FLASH3_FP32)
    opts = lib.options(scale, causal)
    P = ctypes.byref
    fwd_args = (P(tq), P(tk), P(tv), P(to), P(tl), P(opts), ctypes.c_void_p(stream))
    keep = []

    if not lib.lib.flash3_forward_is_built(f3_dtype, d, d):
        r.note["flash3"] = "not built"
    else:
        st = lib.lib.flash3_forward(*fwd_args)
        torch.cuda.synchronize()
        if st != FLASH3_OK:
            _flash3_error(r, lib, st, "forward", d, s, causal)
        elif pss == "fwd":
            if do_check:
                check_fwd(torch, F, sdpa_ctx, r, q, k, v, out, scale, causal)
            measure("flash3", lambda: lib.lib.flash3_forward(*fwd_args))
        else:  # bwd
            if not lib.lib.flash3_backward_is_built(f3_dtype, d, d):
                r.note["flash3"] = "not built"
            else:
                dout = torch.randn_like(q)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                tdo = f3_tensor(dout, f3_dtype)
                tdq, tdk, tdv = f3_tensor(dq, f3_dtype), f3_tensor(dk, f3_dtype), f3_tensor(dv, f3_dtype)
                ws_bytes = lib.lib.flash3_backward_workspace_size(P(tq), P(tk), P(tv), P(opts))
                ws = torch.empty(max(int(ws_bytes), 1), device=q.device, dtype=torch.uint8)
                bwd_args = (P(tq), P(tk), P(tv), P(to), P(tdo), P(tl), None, P(tdq), P(tdk), P(tdv), P(opts),
                            ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws_bytes), ctypes.c_void_p(stream))
                st = lib.lib.flash3_backward(*bwd_args)
                torch.cuda.synchronize()
                if st != FLASH3_OK:
                    _flash3_error(r, lib, st, "backward", d, s, causal)
                else:
                    if do_check:
                        check_bwd(torch, F, sdpa_ctx, r, q, k, v, dout, (dq, dk, dv), scale, causal)
                    measure("flash3", lambda: lib.lib.flash3_backward(*bwd_args))
                keep += [dout, dq, dk, dv, ws, tdo, tdq, tdk, tdv]
    return keep + [out, lse, tq, tk, tv, to, tl]


def _flash3_error(r, lib, st, what, d, s, causal):
    """A flash3 call that returned status st: the row's note, and the library's message."""
    msg = lib.last_error()
    r.note["flash3"] = "not supported yet" if st == FLASH3_NOT_SUPPORTED else f"error ({STATUS_NAMES.get(st, st)})"
    print(f"  flash3 {what} d={d} s={s} causal={causal}: {msg}")


def _row_sdpa(torch, F, sdpa_ctx, r, q, k, v, scale, measure):
    """run_row's torch SDPA baselines (cuDNN and FlashAttention-2), each probed, then measure()d."""
    causal, pss = r.causal, r.pss
    # SDPA layout (b, h, s, d): transposed views of the same (b, s, h, d) tensors.
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for who, backend in (("cudnn", "CUDNN_ATTENTION"), ("fa2", "FLASH_ATTENTION")):
        try:
            if pss == "fwd":
                def fn():
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
                with torch.no_grad(), sdpa_ctx(backend):
                    fn()  # raises here when the backend cannot run this shape
                    measure(who, fn, lambda backend=backend: _nograd_ctx(torch, sdpa_ctx, backend))
            else:
                qg = q.detach().requires_grad_(True)
                kg = k.detach().requires_grad_(True)
                vg = v.detach().requires_grad_(True)
                with sdpa_ctx(backend):
                    o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                       is_causal=causal, scale=scale)
                do = torch.randn_like(o)

                def fn(o=o, do=do, g=(qg, kg, vg)):  # backward only: the graph of the precomputed output is kept
                    return torch.autograd.grad(o, g, do, retain_graph=True)
                with sdpa_ctx(backend):
                    fn()
                    measure(who, fn, lambda backend=backend: sdpa_ctx(backend))
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001  (backend cannot run this shape)
            _not_available(r, who, e, q)


def _row_fa3(torch, fa3, r, q, k, v, scale, measure):
    """run_row's official FlashAttention-3, probed, then measure()d; returns the buffers its
    timed calls use."""
    causal, pss = r.causal, r.pss
    keep = []
    try:
        with torch.no_grad():
            out3, lse3 = fa3_forward(fa3, q, k, v, scale, causal)
            if pss == "fwd":
                measure("fa3", lambda: fa3_forward(fa3, q, k, v, scale, causal), lambda: torch.no_grad())
            else:
                do3 = torch.randn_like(out3)
                g3 = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))

                def fn3(o=out3, lse=lse3, do=do3, g=g3):
                    return fa3.bwd(do, q, k, v, o, lse, *g, softmax_scale=scale, is_causal=causal)
                fn3()
                measure("fa3", fn3, lambda: torch.no_grad())
                keep += [do3, *g3]
        keep += [out3, lse3]
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001  (not built for this shape)
        _not_available(r, "fa3", e, q)
    return keep


def _not_available(r, who, e, q):
    """A baseline that cannot run the row (exception e): the row's note, and the first line of e."""
    d, s = q.shape[3], q.shape[1]
    r.note[who] = "n/a"
    msg = str(e).strip().splitlines()
    print(f"  {who} d={d} s={s} causal={r.causal} {r.pss}: not available "
          f"({msg[0][:160] if msg else type(e).__name__})")


def _nograd_ctx(torch, sdpa_ctx, backend):
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(sdpa_ctx(backend))
    return stack


def time_rounds(torch, r, timers, iters, warmup, rounds, warmup_ms=0.0):
    """r.ms[who] = median over `rounds` rounds of time_cuda(fn); each round times every
    contender once, the first contender rotating from round to round."""
    names = list(timers)
    times = {n: [] for n in names}
    for rnd in range(rounds):
        k = rnd % len(names)
        for who in names[k:] + names[:k]:
            fn, ctx = timers[who]
            with (ctx() if ctx else contextlib.nullcontext()):
                times[who].append(time_cuda(torch, fn, iters, warmup, warmup_ms=warmup_ms))
    for who in names:
        r.ms[who] = statistics.median(times[who])


# ---------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------
def cell_tflops(r, who):
    t = r.tflops(who)
    return f"{t:.1f}" if t else (r.note[who] or "-")


def cell_ratio(x):
    return f"{x:.3f}" if x else "-"


def has_fa3(results):
    return any(r.ms["fa3"] or r.note["fa3"] not in ("", "-") for r in results)


def print_row_line(r):
    fa3 = f" | FA3 {cell_tflops(r, 'fa3'):>6}" if has_fa3([r]) else ""
    print(f"hdim {r.hdim:3d} seqlen {fmt_len(r.seqlen):>4} causal {str(r.causal):5} {r.pss}: "
          f"flash3 {cell_tflops(r, 'flash3'):>17} | cuDNN {cell_tflops(r, 'cudnn'):>6} | FA2 {cell_tflops(r, 'fa2'):>6}"
          f"{fa3} TFLOP/s | check {r.check}")


def print_table(results):
    fa3 = has_fa3(results)
    hdr = ["hdim", "seqlen", "causal", "pass", "flash3 TFLOP/s", "cuDNN TFLOP/s", "FA2 TFLOP/s"]
    hdr += ["FA3 TFLOP/s"] if fa3 else []
    hdr += ["flash3/cuDNN", "flash3/FA2"] + (["flash3/FA3"] if fa3 else []) + ["check"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" if h in ("causal", "pass", "check") else "---:" for h in hdr) + "|")
    for r in results:
        row = [str(r.hdim), fmt_len(r.seqlen), "yes" if r.causal else "no", r.pss, cell_tflops(r, "flash3"),
               cell_tflops(r, "cudnn"), cell_tflops(r, "fa2")]
        row += [cell_tflops(r, "fa3")] if fa3 else []
        row += [cell_ratio(r.ratio("flash3", "cudnn")), cell_ratio(r.ratio("flash3", "fa2"))]
        row += [cell_ratio(r.ratio("flash3", "fa3"))] if fa3 else []
        print("| " + " | ".join(row + [r.check]) + " |")


def print_summary(results, passes):
    print()
    baselines = (("cudnn", "cuDNN"), ("fa2", "FA2")) + ((("fa3", "FA3"),) if has_fa3(results) else ())
    for pss in passes:
        rows = [r for r in results if r.pss == pss]
        ran = [r for r in rows if r.ms["flash3"]]
        parts = []
        for who, name in baselines:
            ratios = [r.ratio("flash3", who) for r in ran if r.ratio("flash3", who)]
            g = geomean(ratios)
            low = min(ratios) if ratios else None
            parts.append(f"geomean flash3/{name} = {f'{g:.3f}' if g else '-'} over {len(ratios)} rows"
                         f"{f' (lowest {low:.3f})' if low else ''}")
        print(f"{pss}: flash3 ran on {len(ran)}/{len(rows)} rows; " + "; ".join(parts))
        headline = [r for r in rows if (r.hdim, r.seqlen) in HEADLINE_ROWS]
        for who, name in baselines[:1] + baselines[2:]:
            iv = [r.ratio("flash3", who) for r in headline if r.ms["flash3"] and r.ratio("flash3", who)]
            gi = geomean(iv)
            print(f"{pss}: headline rows (hdim128 4k/8k/16k, hdim64+256 8k/16k, causal+noncausal: 14): "
                  f"geomean flash3/{name} = {f'{gi:.3f}' if gi else '-'} over {len(iv)}/14 rows"
                  f"{f' (lowest {min(iv):.3f})' if iv else ''}"
                  f"{'' if len(headline) == 14 else f' ({len(headline)} of them benchmarked)'}")


def write_csv(path, results):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["hdim", "seqlen", "causal", "pass", "batch", "heads", "flops"] +
                   [f"{who}_ms" for who in CONTENDERS] + [f"{who}_tflops" for who in CONTENDERS] +
                   [f"flash3_over_{who}" for who in CONTENDERS[1:]] + [f"{who}_note" for who in CONTENDERS] +
                   ["check", "err", "bound"])

        def num(x, fmt="{:.6g}"):
            return fmt.format(x) if x is not None else ""

        for r in results:
            w.writerow([r.hdim, r.seqlen, int(r.causal), r.pss, r.batch, r.heads, f"{r.flops:.6g}"] +
                       [num(r.ms[who]) for who in CONTENDERS] + [num(r.tflops(who)) for who in CONTENDERS] +
                       [num(r.ratio("flash3", who)) for who in CONTENDERS[1:]] + [r.note[who] for who in CONTENDERS] +
                       [r.check, num(r.err), num(r.bound)])


def read_csv(path):
    """RowResults from a CSV written by write_csv (CSVs without FA3 columns too)."""
    results = []
    with open(path) as f:
        for row in csv.DictReader(f):
            r = RowResult(int(row["hdim"]), int(row["seqlen"]), row["causal"] == "1", row["pass"], int(row["batch"]),
                          int(row["heads"]))
            r.flops = float(row["flops"])
            for who in CONTENDERS:
                r.ms[who] = float(row[f"{who}_ms"]) if row.get(f"{who}_ms") else None
                r.note[who] = row.get(f"{who}_note") or ""
            r.check = row["check"]
            r.err = float(row["err"]) if row["err"] else None
            r.bound = float(row["bound"]) if row["bound"] else None
            results.append(r)
    return results


def plot(path, results):
    """Bar chart PNG of flash3 / cuDNN / FA2 TFLOP/s, one panel per pass."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        print(f"--plot: matplotlib is not available ({e}); no plot written")
        return
    passes = [p for p in ("fwd", "bwd") if any(r.pss == p for r in results)]
    if not passes:
        print("--plot: no rows; no plot written")
        return
    n = max(sum(r.pss == p for r in results) for p in passes)
    fig, axes = plt.subplots(len(passes), 1, figsize=(max(8, 0.35 * n), 4.2 * len(passes)), squeeze=False)
    for ax, pss in zip(axes[:, 0], passes):
        sel = [r for r in results if r.pss == pss]
        width = 0.27
        for i, (who, name) in enumerate((("flash3", "flash3"), ("cudnn", "cuDNN"), ("fa2", "FA2"))):
            ys = [r.tflops(who) or 0.0 for r in sel]
            ax.bar([x + (i - 1) * width for x in range(len(sel))], ys, width, label=name)
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels([f"d{r.hdim} {fmt_len(r.seqlen)}{' c' if r.causal else ''}" for r in sel], rotation=70,
                           ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{'forward' if pss == 'fwd' else 'backward'} (16k tokens, hidden 2048; c = causal)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
