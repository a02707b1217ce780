"""Clock and power of the backward under sustained load: flash3 vs cuDNN.

The H200 runs at its power cap under back-to-back attention calls, so the
steady-state clock, and with it the speed, follows the energy a kernel spends
per FLOP. For each shape this runs each contender back to back for --seconds
while `nvidia-smi` samples power draw and SM clock every 50 ms, and reports,
over the second half of each segment, mean power, mean SM clock, time per call
(CUDA events) and energy per call (mean power x time per call). nvidia-smi's
power.draw averages over about a second, so keep --seconds at 4 or more.

  python3 bench/power.py --lib build/libflash3.so --shapes 128:4k:causal,64:8k:none
"""
import argparse
import math
import subprocess
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench  # noqa: E402


def parse_shapes(text):
    out = []
    for item in text.split(","):
        d, s, m = item.split(":")
        out.append((int(d), bench.parse_len(s), m == "causal"))
    return out


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--shapes", default="128:4k:causal,128:8k:none,64:8k:none")
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    lib = bench.Flash3Lib(args.lib)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw,clocks.sm", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    t_origin = time.time()
    segments = []
    for d, s, causal in parse_shapes(args.shapes):
        b, h = 16384 // s, 2048 // d
        q, k, v, dout = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
        opts = lib.lib.flash3_default_options()
        opts.softmax_scale, opts.causal = 1 / math.sqrt(d), int(causal)
        f3 = bench.Flash3Call(torch, lib, q, k, v, dout, opts, torch.cuda.current_stream().cuda_stream)
        cud = bench.cudnn_sdpa_fn(torch, F, *(t.transpose(1, 2) for t in (q, k, v)), causal, 1 / math.sqrt(d), "bwd")
        flops = 2.5 * bench.fwd_flops(b, h, s, s, d, causal)
        if f3.status != bench.FLASH3_OK or f3.bwd() != bench.FLASH3_OK:
            sys.exit(f"flash3 d={d} s={s} causal={causal}: {lib.last_error()}")
        for name, fn in (("flash3", f3.bwd), ("cudnn", cud)):
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
            ms = ev0.elapsed_time(ev1) / calls
            segments.append((f"d={d} {s // 1024}k {'causal' if causal else 'none'}", name, half - t_origin,
                             time.time() - t_origin, ms, flops))
    time.sleep(0.2)
    smi.terminate()
    samples = [x for x in map(lambda ln: parse_smi_line(ln, t_origin), smi.stdout.read().splitlines()) if x]
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


if __name__ == "__main__":
    main()
