# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py: what the modes share: argument parsing helpers, FLOP counts, the rows of a run,
CUDA-event timing (single, sustained, interleaved), cuDNN through torch SDPA, the header lines."""
import argparse
import math
import statistics
import time


def parse_len(s):
    s = s.strip().lower()
    if s.endswith("k"):
        return int(float(s[:-1]) * 1024)
    return int(s)


def parse_list(s, conv):
    return [conv(x) for x in s.replace(";", ",").split(",") if x.strip()]


def parse_causal(s):
    s = s.strip().lower()
    if s in ("both", "all"):
        return [False, True]
    out = []
    for x in parse_list(s, str):
        x = x.strip().lower()
        if x in ("on", "1", "true", "yes", "causal"):
            out.append(True)
        elif x in ("off", "0", "false", "no", "noncausal"):
            out.append(False)
        else:
            raise argparse.ArgumentTypeError(f"--causal: unknown value '{x}' (on, off, both)")
    return out


def fmt_len(n):
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def fwd_flops(b, h, sq, sk, d, causal):
    f = 4.0 * b * h * sq * sk * d
    return f / 2 if causal else f


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# The (hdim, seqlen) pairs of the headline rows (each causal and not: 14 rows).
HEADLINE_ROWS = [(128, 4096), (128, 8192), (128, 16384), (64, 8192), (64, 16384), (256, 8192), (256, 16384)]


def parse_ab(spec, i):
    name, sep, path = spec.partition("=")
    return (name, path) if sep else (f"ab{i}", spec)


def device_desc(torch):
    """The first fields of every mode's header line: the device, torch's and cuDNN's versions."""
    return (f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN "
            f"{torch.backends.cudnn.version()}")


def sustained_desc(args):
    """The header fields of the sustained, interleaved modes: dtype, rounds, iterations, warm-up."""
    return f" | dtype {args.dtype} | rounds {args.rounds} | iters {args.iters} | warmup {args.warmup_ms:g} ms"


def shape_pairs(args):
    """(hdim, seqlen) pairs of the run: the headline pairs, or --hdims x --seqlens."""
    if args.headline:
        return list(HEADLINE_ROWS)
    return [(d, s) for d in parse_list(args.hdims, int) for s in parse_list(args.seqlens, parse_len)]


def each_row(torch, args, causals, passes, dtype, n=4):
    """(hdim, seqlen, causal, pass, softmax scale, FLOPs, inputs) for every row of the run;
    inputs: n paper-shape tensors (q, k, v[, dout]) of (b, s, h, d) with batch = tokens //
    seqlen and heads = hidden // hdim, shared by the rows of one (hdim, seqlen) pair."""
    for hdim, seqlen in shape_pairs(args):
        batch, heads = max(1, args.tokens // seqlen), max(1, args.hidden // hdim)
        torch.manual_seed(1234 + hdim + seqlen)
        x = [torch.randn((batch, seqlen, heads, hdim), device="cuda", dtype=dtype) for _ in range(n)]
        for causal in causals:
            for pss in passes:
                f = fwd_flops(batch, heads, seqlen, seqlen, hdim, causal) * (1.0 if pss == "fwd" else 2.5)
                yield hdim, seqlen, causal, pss, 1.0 / math.sqrt(hdim), f, x
        del x
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------
def run_for(torch, fn, ms):
    """Calls fn() back to back for about `ms` milliseconds of wall time."""
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()


def time_cuda(torch, fn, iters, warmup, budget_s=3.0, warmup_ms=0.0):
    """Median milliseconds of fn() over up to `iters` runs, each bracketed by CUDA events
    (warmup_ms > 0: after that long of back-to-back calls, i.e. under sustained load)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run_for(torch, fn, warmup_ms)
    # One probe run decides how many iterations fit the time budget (big shapes get fewer).
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    probe_ms = max(s.elapsed_time(e), 1e-3)
    return events_median(torch, fn, int(max(5, min(iters, budget_s * 1000.0 / probe_ms))))


def events_median(torch, fn, n):
    """Median milliseconds of n back-to-back runs of fn(), each bracketed by CUDA events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(st.elapsed_time(en) for st, en in zip(starts, ends))


def sustained_median(torch, fn, warmup_ms, iters):
    """Median milliseconds of `iters` timed runs of fn(), after running it back to
    back for `warmup_ms` (so that, under the power cap, the clocks have settled
    to what sustained use of this kernel gets)."""
    run_for(torch, fn, warmup_ms)
    return events_median(torch, fn, iters)


def interleave(torch, fns, rounds, iters, warmup_ms, gap_s):
    """{name: [ms per round]}: each round times every contender once (after
    warmup_ms of back-to-back calls when > 0), the first one rotating from
    round to round; gap_s of idle before each round."""
    names = list(fns)
    times = {n: [] for n in names}
    for rnd in range(rounds):
        if gap_s > 0:
            torch.cuda.synchronize()
            time.sleep(gap_s)
        for n in names[rnd % len(names):] + names[:rnd % len(names)]:
            if warmup_ms > 0:
                times[n].append(sustained_median(torch, fns[n], warmup_ms, iters))
            else:
                times[n].append(time_cuda(torch, fns[n], iters, 10, budget_s=2.0))
    return times


def median_spread(times, per_call=1):
    """interleave()'s times as ({name: median ms / per_call}, {name: spread}), the spread of a
    contender being (max - min) / median over its rounds."""
    ms = {n: statistics.median(t) / per_call for n, t in times.items()}
    spread = {n: (max(t) - min(t)) / statistics.median(t) for n, t in times.items()}
    return ms, spread


def cudnn_sdpa_fn(torch, F, qt, kt, vt, causal, scale, pss):
    """cuDNN (torch SDPA) forward, or backward only (the graph of one forward is
    kept), on (b, h, s, d) views; for the interleaved and power modes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if pss == "fwd":
        def fwd():
            with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
        return fwd
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (qt, kt, vt))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)
    dog = torch.randn_like(og)

    def bwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(og, (qg, kg, vg), dog, retain_graph=True)
    return bwd
