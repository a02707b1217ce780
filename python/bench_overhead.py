#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Per-call overhead of flash3's Python API vs a direct C++ call (forward, bf16).

For each shape (batch 1, 16 heads, head_dim 128; by default seqlen_q x seqlen_k = 1 x 1024,
the decode-like call, and 1024 x 1024) it reports host microseconds per call of:

  api      flash3.flash_attn_func(q, k, v)                       (what users call)
  api+grad flash3.flash_attn_func with q/k/v requiring grad       (forward only; builds the autograd node)
  op       torch.ops.flash3.fwd.default(...)                     (the dispatcher, no Python wrapper)
  c++      flash3::forward called in a C++ loop (flash3._C.bench_direct_forward): ForwardArgs
           built per call, preallocated out/lse, no Python and no torch in the loop
  ctypes   flash3_forward through the C ABI with ctypes, structs built once (an approximation
           of "direct": adds the ctypes call cost)
  sdpa     torch.nn.functional.scaled_dot_product_attention (default backend), for scale
and the GPU time of one flash3 forward (a CUDA graph of 50 calls replayed, CUDA-event timed):
a call is launch-bound when its host time exceeds its GPU time.

Method: rounds of 100 back-to-back calls (few enough that launches never block on a full
queue), host wall time with time.perf_counter, torch.cuda.synchronize only between rounds;
the median round is reported.

Usage: python3 python/bench_overhead.py [--shapes 1x1024,1024x1024] [--rounds 50] [--csv out.csv]
"""
import argparse
import csv
import ctypes
import glob
import json
import os
import statistics
import sys
import time

# This file lives next to the source package python/flash3 (no compiled _C there):
# import the installed package instead.
sys.path = [x for x in sys.path if os.path.abspath(x or os.getcwd()) != os.path.dirname(os.path.abspath(__file__))]

import torch
import torch.nn.functional as F


def parse_shapes(s):
    out = []
    for x in s.split(","):
        a, b = x.lower().split("x")
        out.append((int(a), int(b)))
    return out


class F3Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class F3Options(ctypes.Structure):
    """flash3_options of include/flash3/flash3_c.h; filled by flash3_default_options()."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int32),
                ("window_left", ctypes.c_int32), ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float),
                ("deterministic", ctypes.c_int32),
                ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)), ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
                ("max_seqlen_q", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32),
                ("num_sequences", ctypes.c_int32), ("seqused_q", ctypes.POINTER(ctypes.c_int32)),
                ("seqused_k", ctypes.POINTER(ctypes.c_int32)), ("pack_gqa", ctypes.c_int32)]


def f3t(t, code):
    x = F3Tensor()
    x.data = t.data_ptr()
    x.dtype = code
    x.ndim = t.dim()
    for i in range(t.dim()):
        x.shape[i] = t.shape[i]
        x.stride[i] = t.stride(i)
    return x


def load_c_abi():
    import flash3

    d = os.path.dirname(flash3.__file__)
    libs = sorted(glob.glob(os.path.join(d, "libflash3.so*")))
    if not libs:
        return None
    lib = ctypes.CDLL(libs[0])  # already loaded by flash3._C: same handle
    T, O = ctypes.POINTER(F3Tensor), ctypes.POINTER(F3Options)
    lib.flash3_forward.restype = ctypes.c_int
    lib.flash3_forward.argtypes = [T, T, T, T, T, O, ctypes.c_void_p]
    lib.flash3_default_options.restype = F3Options
    lib.flash3_last_error.restype = ctypes.c_char_p
    return lib


def time_rounds(fn, rounds, per_round=100):
    """Median host microseconds per call over `rounds` rounds of `per_round` calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn()
        t1 = time.perf_counter()
        res.append((t1 - t0) / per_round * 1e6)
    torch.cuda.synchronize()
    return statistics.median(res)


def time_cpp_rounds(_C, q, k, v, out, lse, rounds, per_round=100):
    _C.bench_direct_forward(q, k, v, out, lse, False, 20)
    torch.cuda.synchronize()
    res = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        res.append(_C.bench_direct_forward(q, k, v, out, lse, False, per_round))
    torch.cuda.synchronize()
    return statistics.median(res)


def gpu_time_us(fn, calls=50, reps=20):
    """GPU microseconds per call: a CUDA graph of `calls` calls, replayed, timed with events."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x1024,1024x1024", help="seqlen_q x seqlen_k list")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("no Hopper GPU: nothing to measure")
        return 2
    import flash3
    from flash3 import _C, flash_attn_func

    fwd = torch.ops.flash3.fwd.default
    lib = load_c_abi()
    dt = torch.bfloat16
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  flash3 {flash3.__version__}")
    print(f"batch {a.batch}, heads {a.heads}, head_dim {a.hdim}, bf16, forward, non-causal; "
          f"host us/call = median of {a.rounds} rounds x 100 calls")
    rows = []
    for sq, sk in parse_shapes(a.shapes):
        q = torch.randn(a.batch, sq, a.heads, a.hdim, device="cuda", dtype=dt)
        k = torch.randn(a.batch, sk, a.heads, a.hdim, device="cuda", dtype=dt)
        v = torch.randn(a.batch, sk, a.heads, a.hdim, device="cuda", dtype=dt)
        out = torch.empty_like(q)
        lse = torch.empty(a.batch, a.heads, sq, device="cuda", dtype=torch.float32)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        r = {"seqlen_q": sq, "seqlen_k": sk}
        r["api_us"] = time_rounds(lambda: flash_attn_func(q, k, v), a.rounds)
        r["api_grad_us"] = time_rounds(lambda: flash_attn_func(qg, kg, vg), a.rounds)
        r["op_us"] = time_rounds(lambda: fwd(q, k, v, None, False, -1, -1, 0.0, False), a.rounds)
        r["cpp_us"] = time_cpp_rounds(_C, q, k, v, out, lse, a.rounds)
        if lib is not None:
            tq, tk, tv, to, tl = (f3t(q, 1), f3t(k, 1), f3t(v, 1), f3t(out, 1), f3t(lse, 2))
            opts = lib.flash3_default_options()
            refs = [ctypes.byref(x) for x in (tq, tk, tv, to, tl, opts)]
            stream = torch.cuda.current_stream().cuda_stream

            def c_call():
                rc = lib.flash3_forward(*refs, stream)
                if rc:
                    raise RuntimeError(lib.flash3_last_error().decode())

            r["ctypes_us"] = time_rounds(c_call, a.rounds)
        else:
            r["ctypes_us"] = float("nan")
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        r["sdpa_us"] = time_rounds(lambda: F.scaled_dot_product_attention(qt, kt, vt), a.rounds)
        r["gpu_us"] = gpu_time_us(lambda: flash_attn_func(q, k, v))
        r["api_minus_cpp_us"] = r["api_us"] - r["cpp_us"]
        r["launch_bound"] = r["api_us"] > r["gpu_us"]
        # correctness of the timed paths
        torch.testing.assert_close(flash_attn_func(q, k, v), out, atol=0, rtol=0)
        rows.append(r)

    hdr = ["sq x sk", "api", "api+grad", "op", "c++", "ctypes", "sdpa", "gpu", "api-c++", "bound"]
    print()
    print(" | ".join(f"{h:>9s}" for h in hdr))
    for r in rows:
        vals = [f"{r['seqlen_q']}x{r['seqlen_k']}"] + [f"{r[k]:.2f}" for k in (
            "api_us", "api_grad_us", "op_us", "cpp_us", "ctypes_us", "sdpa_us", "gpu_us", "api_minus_cpp_us")]
        vals.append("launch" if r["launch_bound"] else "gpu")
        print(" | ".join(f"{x:>9s}" for x in vals))
    print("(microseconds per call; 'bound': launch = host time per API call exceeds the GPU time)")
    for r in rows:
        ok = r["api_minus_cpp_us"] <= 10.0
        print(f"overhead {r['seqlen_q']}x{r['seqlen_k']}: flash_attn_func - direct C++ = {r['api_minus_cpp_us']:.2f} us "
              f"({'within' if ok else 'NOT within'} the 10 us target)")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
