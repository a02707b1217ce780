# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py --power: power, SM clock and energy per call of flash3 and cuDNN under sustained
load (nvidia-smi sampled beside the calls)."""
import subprocess
import time

from _abi import FLASH3_OK, Flash3Lib
from _calls import Flash3Call
from _common import cudnn_sdpa_fn, each_row, fmt_len


def parse_smi_line(line, t_origin):
    """(seconds since t_origin, watts, MHz) from one `nvidia-smi --query-gpu=
    timestamp,power.draw,clocks.sm --format=csv,noheader,nounits` line; None
    for anything else (headers, [N/A] fields)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        stamp, frac = (parts[0].split(".") + ["0"])[:2]
        ts = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
        return ts - t_origin, float(parts[1]), float(parts[2])
    except ValueError:
        return None


def segment_stats(samples, start, end, ms_per_call):
    """Mean power (W) and SM clock (MHz) of the samples in [start, end], and
    the energy of one call (J) at that power; None without samples."""
    sel = [(p, c) for (t, p, c) in samples if start <= t <= end]
    if not sel:
        return None
    watts = sum(p for p, _ in sel) / len(sel)
    mhz = sum(c for _, c in sel) / len(sel)
    return watts, mhz, watts * ms_per_call / 1e3


def run_batch(torch, fn, n=4):
    """n calls, then wait for them; returns n."""
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return n


def run_power(args, torch, F, passes, causals, dtype):
    lib = Flash3Lib(args.lib)
    stream = torch.cuda.current_stream().cuda_stream
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw,clocks.sm", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    t_origin = time.time()
    segments = []
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v, dout) in each_row(torch, args, causals, passes, dtype):
        f3 = Flash3Call(torch, lib, q, k, v, dout, lib.options(scale, causal), stream)
        f3fn = f3.fwd if pss == "fwd" else f3.bwd
        if f3.status != FLASH3_OK or f3fn() != FLASH3_OK:
            smi.terminate()
            print(f"flash3 d={hdim} s={seqlen} causal={causal} {pss}: {lib.last_error()}")
            return 1
        cud = cudnn_sdpa_fn(torch, F, *(t.transpose(1, 2) for t in (q, k, v)), causal, scale, pss)
        for name, fn in (("flash3", f3fn), ("cuDNN", cud)):
            fn()  # the first call (plan building) stays outside the segment
            torch.cuda.synchronize()
            t0 = time.time()
            while time.time() - t0 < args.seconds / 2:  # reach the sustained clock
                run_batch(torch, fn)
            half = time.time()
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
            calls = run_batch(torch, fn)
            while time.time() - t0 < args.seconds:
                calls += run_batch(torch, fn)
            ev1.record()
            torch.cuda.synchronize()
            shape = f"{pss} d={hdim} {fmt_len(seqlen)} {'causal' if causal else 'none'}"
            segments.append((shape, name, half - t_origin, time.time() - t_origin, ev0.elapsed_time(ev1) / calls,
                             flops))
        del f3, f3fn, cud
    time.sleep(0.2)
    smi.terminate()
    samples = [x for x in (parse_smi_line(ln, t_origin) for ln in smi.stdout.read().splitlines()) if x]
    print("| shape | who | ms / call | TFLOP/s | power W | SM MHz | J / call | TFLOP / J |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for shape, who, a, z, ms, flops in segments:
        st = segment_stats(samples, a, z, ms)
        if st is None:
            print(f"| {shape} | {who} | {ms:.3f} | {flops / ms / 1e9:.0f} | - | - | - | - |")
            continue
        pw, mhz, joules = st
        print(f"| {shape} | {who} | {ms:.3f} | {flops / ms / 1e9:.0f} | {pw:.0f} | {mhz:.0f} | {joules:.3f} | "
              f"{flops / joules / 1e12:.2f} |")
    return 0
