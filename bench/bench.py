#!/usr/bin/env python3
"""flash3 benchmark: TFLOP/s of flash3 beside torch SDPA (cuDNN and FlashAttention-2).

Shapes follow the FlashAttention-3 paper: 16k tokens per batch (batch = 16384 // seqlen),
hidden 2048 (heads = 2048 // hdim), hdim in {64, 128, 256}, seqlen 512 .. 16k, causal
off/on, forward and backward (backward FLOPs = 2.5 x forward; forward FLOPs =
4 * b * h * sq * sk * d, halved for causal).

flash3 is loaded through its C ABI (include/flash3/flash3_c.h) with ctypes. Before a
row is timed, flash3's output is checked against torch math SDPA in fp32 with the
tolerance rule  err <= 2 * err(plain bf16 math SDPA) + 1e-5  (no NaN).

Usage:
  python3 bench/bench.py                       # full table (about 10 minutes on an H200)
  python3 bench/bench.py --quick               # a small subset
  python3 bench/bench.py --hdims 128 --seqlens 4k,8k --passes fwd --causal on --csv out.csv
Exit status: 0 ok, 1 a check failed (or the library could not be loaded), 2 no Hopper GPU.
"""
import argparse
import contextlib
import csv
import ctypes
import math
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------
# C ABI mirror (include/flash3/flash3_c.h). Keep in sync with the header.
# ---------------------------------------------------------------------------
FLASH3_OK, FLASH3_INVALID_ARGUMENT, FLASH3_NOT_SUPPORTED, FLASH3_CUDA_ERROR, FLASH3_INTERNAL = 0, 1, 2, 3, 4
FLASH3_FP16, FLASH3_BF16, FLASH3_FP32, FLASH3_FP8_E4M3 = 0, 1, 2, 3
STATUS_NAMES = {0: "ok", 1: "invalid argument", 2: "not supported yet", 3: "cuda error", 4: "internal error"}


class F3Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


class F3Options(ctypes.Structure):
    _fields_ = [
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("deterministic", ctypes.c_int32),
        ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
        ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
    ]


class Flash3Lib:
    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)
        T = ctypes.POINTER(F3Tensor)
        O = ctypes.POINTER(F3Options)
        lib.flash3_default_options.restype = F3Options
        lib.flash3_default_options.argtypes = []
        lib.flash3_forward.restype = ctypes.c_int
        lib.flash3_forward.argtypes = [T, T, T, T, T, O, ctypes.c_void_p]
        lib.flash3_backward.restype = ctypes.c_int
        lib.flash3_backward.argtypes = [T, T, T, T, T, T, T, T, T, T, O, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_void_p]
        lib.flash3_backward_workspace_size.restype = ctypes.c_size_t
        lib.flash3_backward_workspace_size.argtypes = [T, T, T, O]
        lib.flash3_validate_forward.restype = ctypes.c_int
        lib.flash3_validate_forward.argtypes = [T, T, T, T, T, O]
        for fn in (lib.flash3_forward_is_built, lib.flash3_backward_is_built):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
        lib.flash3_device_is_supported.restype = ctypes.c_int
        lib.flash3_device_is_supported.argtypes = []
        lib.flash3_last_error.restype = ctypes.c_char_p
        lib.flash3_last_error.argtypes = []
        lib.flash3_version.restype = ctypes.c_char_p
        lib.flash3_version.argtypes = []

    def last_error(self):
        m = self.lib.flash3_last_error()
        return m.decode(errors="replace") if m else ""

    def version(self):
        v = self.lib.flash3_version()
        return v.decode() if v else "?"


def f3_tensor(t, f3_dtype):
    """A flash3_tensor view of a torch CUDA tensor (strides in elements)."""
    ft = F3Tensor()
    ft.data = t.data_ptr()
    ft.dtype = f3_dtype
    ft.ndim = t.dim()
    for i in range(t.dim()):
        ft.shape[i] = t.shape[i]
        ft.stride[i] = t.stride(i)
    return ft


class Flash3Call:
    """flash3 forward and backward on (b, s, h, d) bf16 / fp16 CUDA tensors q, k,
    v, dout, the setup the timing tools share: owns O, LSE, dQ / dK / dV and the
    backward workspace (sized for `opts`). The constructor runs the forward once
    (its status in .status), so that bwd() differentiates a real O and LSE;
    fwd() / bwd() make one call each and return its status."""

    def __init__(self, torch, lib, q, k, v, dout, opts, stream):
        P = ctypes.byref
        dt = FLASH3_BF16 if q.dtype == torch.bfloat16 else FLASH3_FP16
        b, sq, h, _ = q.shape
        self.lib = lib
        self.out = torch.empty_like(q)
        self.lse = torch.empty((b, h, sq), device=q.device, dtype=torch.float32)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        t = {n: f3_tensor(x, dt) for n, x in
             dict(q=q, k=k, v=v, o=self.out, do=dout, dq=self.dq, dk=self.dk, dv=self.dv).items()}
        tl = f3_tensor(self.lse, FLASH3_FP32)
        self._structs = (t, tl, opts)  # what the byref pointers below point into
        st = stream if isinstance(stream, ctypes.c_void_p) else ctypes.c_void_p(stream)
        self._fwd = (P(t["q"]), P(t["k"]), P(t["v"]), P(t["o"]), P(tl), P(opts), st)
        ws_bytes = lib.lib.flash3_backward_workspace_size(P(t["q"]), P(t["k"]), P(t["v"]), P(opts))
        self.ws = torch.empty(max(int(ws_bytes), 1), device=q.device, dtype=torch.uint8)
        self._bwd = (P(t["q"]), P(t["k"]), P(t["v"]), P(t["o"]), P(t["do"]), P(tl), None, P(t["dq"]), P(t["dk"]),
                     P(t["dv"]), P(opts), ctypes.c_void_p(self.ws.data_ptr()), ctypes.c_size_t(ws_bytes), st)
        self.status = self.fwd()

    def fwd(self):
        return self.lib.lib.flash3_forward(*self._fwd)

    def bwd(self):
        return self.lib.lib.flash3_backward(*self._bwd)


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------
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


# The rows the FA3-vs-cuDNN comparison is most often about.
ISSUE_ROWS = {(128, 4096), (128, 8192), (128, 16384), (64, 8192), (64, 16384), (256, 8192), (256, 16384)}


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
    to what sustained use of this kernel gets; see docs/performance.md)."""
    run_for(torch, fn, warmup_ms)
    return events_median(torch, fn, iters)


def cudnn_sdpa_fn(torch, F, qt, kt, vt, causal, scale, pss):
    """cuDNN (torch SDPA) forward, or backward only (the graph of one forward is
    kept), on (b, h, s, d) views; for the interleaved / steady-state tools."""
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


class RowResult:
    def __init__(self, hdim, seqlen, causal, pss, batch, heads):
        self.hdim, self.seqlen, self.causal, self.pss = hdim, seqlen, causal, pss
        self.batch, self.heads = batch, heads
        self.flops = 0.0
        self.ms = {"flash3": None, "cudnn": None, "fa2": None}
        self.note = {"flash3": "", "cudnn": "", "fa2": ""}
        self.check = "-"
        self.err = self.bound = None

    def tflops(self, who):
        ms = self.ms[who]
        return self.flops / (ms * 1e-3) / 1e12 if ms else None

    def ratio(self, a, b):
        ta, tb = self.tflops(a), self.tflops(b)
        return ta / tb if ta and tb else None


# ---------------------------------------------------------------------------
# The benchmark.
# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libflash3.so"), help="flash3 shared library")
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1k,2k,4k,8k,16k")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--causal", default="both", help="on, off or both")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--iters", type=int, default=30, help="timed runs per measurement (fewer for big shapes)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time flash3 / cuDNN / FA2 round-robin this many times per row (order rotating) and "
                         "report the median over rounds. Each timing is still a short burst, which under the "
                         "power cap favours the kernel that keeps its boost clock longer (docs/performance.md, "
                         "2026-11-30 fourth session), unless --warmup-ms is given")
    ap.add_argument("--warmup-ms", type=float, default=0.0,
                    help="> 0: before each timing, run the contender back to back for this long, so it is timed "
                         "at the clocks sustained load gets under the power cap (bench/steady.py's method; "
                         "300 is what the README tables use)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch (batch = tokens // seqlen)")
    ap.add_argument("--hidden", type=int, default=2048, help="hidden size (heads = hidden // hdim)")
    ap.add_argument("--csv", default=None, help="write every row to this CSV file")
    ap.add_argument("--plot", default=None, help="bar chart PNG of TFLOP/s per row (needs matplotlib)")
    ap.add_argument("--quick", action="store_true", help="small subset: hdim 128, seqlens 1k and 8k, 10 iterations")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    args = ap.parse_args()

    # First thing: a Hopper GPU.
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"flash3: no Hopper GPU found (torch is not importable: {e})")
        sys.exit(2)
    if not torch.cuda.is_available():
        print("flash3: no Hopper GPU found (torch.cuda.is_available() is False)")
        sys.exit(2)
    cap = torch.cuda.get_device_capability()
    if tuple(cap) != (9, 0):
        print(f"flash3: no Hopper GPU found (device 0 is {torch.cuda.get_device_name()}, sm_{cap[0]}{cap[1]})")
        sys.exit(2)

    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        SDPBackend = sdpa_kernel = None

    hdims = parse_list(args.hdims, int)
    seqlens = parse_list(args.seqlens, parse_len)
    passes = parse_list(args.passes, lambda x: x.strip().lower())
    causals = parse_causal(args.causal)
    iters, warmup = args.iters, args.warmup
    if args.quick:
        hdims, seqlens, iters, warmup = [128], [1024, 8192], min(iters, 10), min(warmup, 3)
    for p in passes:
        if p not in ("fwd", "bwd"):
            ap.error(f"--passes: unknown pass '{p}' (fwd, bwd)")

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    f3_dtype = FLASH3_BF16 if args.dtype == "bf16" else FLASH3_FP16
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

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

    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()}"
          f" | flash3 {lib.version() if lib else '(not loaded)'} | dtype {args.dtype}")
    sys.stdout.flush()

    def sdpa_ctx(backend):
        if sdpa_kernel is not None:
            return sdpa_kernel(getattr(SDPBackend, backend))
        # Old torch: the boolean context manager.
        flags = dict(enable_flash=backend == "FLASH_ATTENTION", enable_math=backend == "MATH",
                     enable_mem_efficient=False)
        if backend == "CUDNN_ATTENTION":
            raise RuntimeError("this torch has no cuDNN SDPA backend")
        return torch.backends.cuda.sdp_kernel(**flags)

    stream = torch.cuda.current_stream().cuda_stream
    results = []
    any_fail = False

    for hdim in hdims:
        for seqlen in seqlens:
            batch = max(1, args.tokens // seqlen)
            heads = max(1, args.hidden // hdim)
            torch.manual_seed(1234 + hdim + seqlen)
            shape = (batch, seqlen, heads, hdim)
            q = torch.randn(shape, device="cuda", dtype=dtype)
            k = torch.randn(shape, device="cuda", dtype=dtype)
            v = torch.randn(shape, device="cuda", dtype=dtype)
            scale = 1.0 / math.sqrt(hdim)
            for causal in causals:
                for pss in passes:
                    r = RowResult(hdim, seqlen, causal, pss, batch, heads)
                    f = fwd_flops(batch, heads, seqlen, seqlen, hdim, causal)
                    r.flops = f if pss == "fwd" else 2.5 * f
                    try:
                        run_row(torch, F, lib, lib_error, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, iters, warmup,
                                not args.no_check, args.rounds, args.warmup_ms)
                    except torch.cuda.OutOfMemoryError as e:  # keep going with the next row
                        r.check = "OOM"
                        print(f"  out of memory: {e}")
                        torch.cuda.empty_cache()
                    any_fail |= r.check.startswith("FAIL")
                    results.append(r)
                    print_row_line(r)
                    sys.stdout.flush()
            del q, k, v
            torch.cuda.empty_cache()

    print()
    print_table(results)
    print_summary(results, passes)
    if args.csv:
        write_csv(args.csv, results)
        print(f"\nwrote {args.csv}")
    if args.plot:
        plot(args.plot, results)
    if lib is None:
        sys.exit(1)
    sys.exit(1 if any_fail else 0)


def run_row(torch, F, lib, lib_error, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, iters, warmup, do_check,
            rounds=1, warmup_ms=0.0):
    causal, pss = r.causal, r.pss
    # rounds == 1: each contender is timed right after its probe / check (the
    # method of every run before 2026-11-30's fourth session). rounds > 1: the
    # contenders that ran are collected (who -> (fn, context factory)) and timed
    # round-robin at the end (time_rounds), so their buffers stay alive: `keep`.
    timers, keep = {}, []

    def measure(who, fn, ctx=None):
        if rounds <= 1:
            r.ms[who] = time_cuda(torch, fn, iters, warmup, warmup_ms=warmup_ms)
        else:
            timers[who] = (fn, ctx)
    b, s, h, d = q.shape
    # SDPA layout (b, h, s, d): transposed views of the same (b, s, h, d) tensors.
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    # ---------------- flash3 ----------------
    if lib is None:
        r.note["flash3"] = "no library" if lib_error else "n/a"
    else:
        out = torch.empty_like(q)
        lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
        tq, tk, tv = f3_tensor(q, f3_dtype), f3_tensor(k, f3_dtype), f3_tensor(v, f3_dtype)
        to, tl = f3_tensor(out, f3_dtype), f3_tensor(lse, FLASH3_FP32)
        opts = lib.lib.flash3_default_options()
        opts.softmax_scale = scale
        opts.causal = 1 if causal else 0
        P = ctypes.byref
        fwd_args = (P(tq), P(tk), P(tv), P(to), P(tl), P(opts), ctypes.c_void_p(stream))

        if not lib.lib.flash3_forward_is_built(f3_dtype, d, d):
            r.note["flash3"] = "not built"
        else:
            st = lib.lib.flash3_forward(*fwd_args)
            torch.cuda.synchronize()
            if st != FLASH3_OK:
                msg = lib.last_error()
                r.note["flash3"] = "not supported yet" if st == FLASH3_NOT_SUPPORTED else f"error ({STATUS_NAMES.get(st, st)})"
                print(f"  flash3 forward d={d} s={s} causal={causal}: {msg}")
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
                        msg = lib.last_error()
                        r.note["flash3"] = ("not supported yet" if st == FLASH3_NOT_SUPPORTED
                                            else f"error ({STATUS_NAMES.get(st, st)})")
                        print(f"  flash3 backward d={d} s={s} causal={causal}: {msg}")
                    else:
                        if do_check:
                            check_bwd(torch, F, sdpa_ctx, r, q, k, v, dout, (dq, dk, dv), scale, causal)
                        measure("flash3", lambda: lib.lib.flash3_backward(*bwd_args))
                    keep += [dout, dq, dk, dv, ws, tdo, tdq, tdk, tdv]
        keep += [out, lse, tq, tk, tv, to, tl]

    # ---------------- torch SDPA baselines ----------------
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
            r.note[who] = "n/a"
            msg = str(e).strip().splitlines()
            print(f"  {who} d={d} s={s} causal={causal} {pss}: not available ({msg[0][:160] if msg else type(e).__name__})")

    if timers:
        time_rounds(torch, r, timers, iters, warmup, rounds, warmup_ms)


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
# Correctness (tolerance rule), on a subset of batches and heads for big shapes.
# ---------------------------------------------------------------------------
CHECK_BUDGET = 1 << 28  # score elements (b_sub * h_sub * sq * sk) per check


def check_subset(b, h, s):
    per = s * s
    bh = max(1, CHECK_BUDGET // per)
    h_sub = min(h, bh)
    b_sub = min(b, max(1, bh // h_sub))
    return b_sub, h_sub


class _PlainMath:
    """torch's math SDPA backend computing in the input dtype (no upcast to fp32)."""

    def __init__(self, torch):
        self.cuda = torch.backends.cuda
        self.prev = None

    def __enter__(self):
        if hasattr(self.cuda, "allow_fp16_bf16_reduction_math_sdp"):
            self.prev = self.cuda.fp16_bf16_reduction_math_sdp_allowed()
            self.cuda.allow_fp16_bf16_reduction_math_sdp(True)
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            self.cuda.allow_fp16_bf16_reduction_math_sdp(self.prev)
        return False


def _math_sdpa(torch, F, sdpa_ctx, q, k, v, scale, causal):
    # (b, s, h, d) in, (b, s, h, d) out
    with sdpa_ctx("MATH"):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                           scale=scale)
    return o.transpose(1, 2)


def _judge(torch, ours, ref, base):
    ours, ref, base = ours.float(), ref.float(), base.float()
    nan = int(torch.isnan(ours).sum().item())
    err = (ours - ref).abs().nan_to_num(nan=0.0).max().item() if ours.numel() else 0.0
    berr = (base - ref).abs().nan_to_num(nan=0.0).max().item() if ours.numel() else 0.0
    bound = 2.0 * berr + 1e-5
    return nan == 0 and err <= bound, err, berr, bound, nan


def check_fwd(torch, F, sdpa_ctx, r, q, k, v, out, scale, causal):
    b, s, h, _ = q.shape
    bs, hs = check_subset(b, h, s)
    qs, ks, vs = (x[:bs, :, :hs] for x in (q, k, v))
    with torch.no_grad():
        ref = _math_sdpa(torch, F, sdpa_ctx, qs.float(), ks.float(), vs.float(), scale, causal)
        with _PlainMath(torch):
            base = _math_sdpa(torch, F, sdpa_ctx, qs, ks, vs, scale, causal)
        ok, err, berr, bound, nan = _judge(torch, out[:bs, :, :hs], ref, base)
    r.err, r.bound = err, bound
    r.check = "PASS" if ok else "FAIL"
    sub = "" if (bs, hs) == (b, h) else f" (b<{bs},h<{hs})"
    if not ok:
        print(f"  CHECK FAIL fwd d={q.shape[3]} s={s} causal={causal}{sub}: err={err:.3g} baseline={berr:.3g} "
              f"bound={bound:.3g} nan={nan}")
    del ref, base
    torch.cuda.empty_cache()


def check_bwd(torch, F, sdpa_ctx, r, q, k, v, dout, grads, scale, causal):
    b, s, h, _ = q.shape
    bs, hs = check_subset(b, h, s)
    bs, hs = max(1, bs // 2), max(1, hs // 2) if hs > 1 else 1  # the backward keeps more alive
    sl = (slice(0, bs), slice(None), slice(0, hs))
    do = dout[sl]

    def grads_of(dt_q, dt_k, dt_v, plain):
        qg = q[sl].detach().to(dt_q).requires_grad_(True)
        kg = k[sl].detach().to(dt_k).requires_grad_(True)
        vg = v[sl].detach().to(dt_v).requires_grad_(True)
        if plain:
            with _PlainMath(torch):
                o = _math_sdpa(torch, F, sdpa_ctx, qg, kg, vg, scale, causal)
                g = torch.autograd.grad(o, (qg, kg, vg), do.to(o.dtype))
        else:
            o = _math_sdpa(torch, F, sdpa_ctx, qg, kg, vg, scale, causal)
            g = torch.autograd.grad(o, (qg, kg, vg), do.to(o.dtype))
        return [x.detach() for x in g]

    ref = grads_of(torch.float32, torch.float32, torch.float32, False)
    base = grads_of(q.dtype, k.dtype, v.dtype, True)
    worst_ok, worst = True, None
    for name, ours, rf, bs_ in zip(("dq", "dk", "dv"), grads, ref, base):
        ok, err, berr, bound, nan = _judge(torch, ours[sl], rf, bs_)
        if worst is None or err / bound > worst[1] / worst[3]:
            worst = (name, err, berr, bound, nan)
        if not ok:
            worst_ok = False
            print(f"  CHECK FAIL bwd {name} d={q.shape[3]} s={s} causal={causal}: err={err:.3g} baseline={berr:.3g} "
                  f"bound={bound:.3g} nan={nan}")
    r.err, r.bound = worst[1], worst[3]
    r.check = "PASS" if worst_ok else "FAIL"
    del ref, base
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------
def cell_tflops(r, who):
    t = r.tflops(who)
    return f"{t:.1f}" if t else (r.note[who] or "-")


def cell_ratio(x):
    return f"{x:.3f}" if x else "-"


def print_row_line(r):
    print(f"hdim {r.hdim:3d} seqlen {fmt_len(r.seqlen):>4} causal {str(r.causal):5} {r.pss}: "
          f"flash3 {cell_tflops(r, 'flash3'):>17} | cuDNN {cell_tflops(r, 'cudnn'):>6} | FA2 {cell_tflops(r, 'fa2'):>6}"
          f" TFLOP/s | check {r.check}")


def print_table(results):
    hdr = ["hdim", "seqlen", "causal", "pass", "flash3 TFLOP/s", "cuDNN TFLOP/s", "FA2 TFLOP/s", "flash3/cuDNN",
           "flash3/FA2", "check"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---:" if i not in (2, 3, 9) else "---" for i in range(len(hdr))) + "|")
    for r in results:
        row = [str(r.hdim), fmt_len(r.seqlen), "yes" if r.causal else "no", r.pss, cell_tflops(r, "flash3"),
               cell_tflops(r, "cudnn"), cell_tflops(r, "fa2"), cell_ratio(r.ratio("flash3", "cudnn")),
               cell_ratio(r.ratio("flash3", "fa2")), r.check]
        print("| " + " | ".join(row) + " |")


def print_summary(results, passes):
    print()
    for pss in passes:
        rows = [r for r in results if r.pss == pss]
        ran = [r for r in rows if r.ms["flash3"]]
        vs_cudnn = [r.ratio("flash3", "cudnn") for r in ran if r.ratio("flash3", "cudnn")]
        vs_fa2 = [r.ratio("flash3", "fa2") for r in ran if r.ratio("flash3", "fa2")]
        g1, g2 = geomean(vs_cudnn), geomean(vs_fa2)
        print(f"{pss}: flash3 ran on {len(ran)}/{len(rows)} rows; geomean flash3/cuDNN = "
              f"{f'{g1:.3f}' if g1 else '-'} over {len(vs_cudnn)} rows; geomean flash3/FA2 = "
              f"{f'{g2:.3f}' if g2 else '-'} over {len(vs_fa2)} rows")
        issue = [r for r in rows if (r.hdim, r.seqlen) in ISSUE_ROWS]
        iv = [r.ratio("flash3", "cudnn") for r in issue if r.ms["flash3"] and r.ratio("flash3", "cudnn")]
        gi = geomean(iv)
        print(f"{pss}: issue rows (hdim128 4k/8k/16k, hdim64+256 8k/16k, causal+noncausal: 14): "
              f"geomean flash3/cuDNN = {f'{gi:.3f}' if gi else '-'} over {len(iv)}/14 rows"
              f"{'' if len(issue) == 14 else f' ({len(issue)} of them benchmarked)'}")


def write_csv(path, results):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["hdim", "seqlen", "causal", "pass", "batch", "heads", "flops", "flash3_ms", "cudnn_ms", "fa2_ms",
                    "flash3_tflops", "cudnn_tflops", "fa2_tflops", "flash3_over_cudnn", "flash3_over_fa2",
                    "flash3_note", "cudnn_note", "fa2_note", "check", "err", "bound"])

        def num(x, fmt="{:.6g}"):
            return fmt.format(x) if x is not None else ""

        for r in results:
            w.writerow([r.hdim, r.seqlen, int(r.causal), r.pss, r.batch, r.heads, f"{r.flops:.6g}",
                        num(r.ms["flash3"]), num(r.ms["cudnn"]), num(r.ms["fa2"]),
                        num(r.tflops("flash3")), num(r.tflops("cudnn")), num(r.tflops("fa2")),
                        num(r.ratio("flash3", "cudnn")), num(r.ratio("flash3", "fa2")),
                        r.note["flash3"], r.note["cudnn"], r.note["fa2"], r.check, num(r.err), num(r.bound)])


def plot(path, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        print(f"--plot: matplotlib is not available ({e}); no plot written")
        return
    labels = [f"d{r.hdim} {fmt_len(r.seqlen)}{' c' if r.causal else ''} {r.pss}" for r in results]
    series = [("flash3", "flash3"), ("cudnn", "cuDNN"), ("fa2", "FA2")]
    width = 0.27
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(results)), 5))
    for i, (who, name) in enumerate(series):
        ys = [r.tflops(who) or 0.0 for r in results]
        ax.bar([x + (i - 1) * width for x in range(len(results))], ys, width, label=name)
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels(labels, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("attention TFLOP/s (16k tokens, hidden 2048)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
