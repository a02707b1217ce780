"""Clock and power of the backward under sustained load: flash3 vs cuDNN.

The H200 runs at its power cap under back-to-back attention calls, so the
steady-state clock, and with it the speed, follows the energy a kernel spends
per FLOP. For each shape this runs each contender back to back for --seconds
while `nvidia-smi` samples power draw and SM clock every 50 ms, and reports,
over the second half of each segment, mean power, mean SM clock, time per call
(CUDA events) and energy per call (mean power x time per call).

  python3 bench/power.py --lib build/libflash3.so --shapes 128:4k:causal,64:8k:none
"""
import argparse
import ctypes
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--shapes", default="128:4k:causal,128:8k:none,64:8k:none")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    lib = bench.Flash3Lib(args.lib)
    P = ctypes.byref
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw,clocks.sm", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    t_origin = time.time()
    segments = []
    for d, s, causal in parse_shapes(args.shapes):
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn((b, s, h, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out, dout = torch.empty_like(q), torch.randn_like(q)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
        T = {n: bench.f3_tensor(t, bench.FLASH3_BF16)
             for n, t in dict(q=q, k=k, v=v, o=out, do=dout, dq=dq, dk=dk, dv=dv).items()}
        tl = bench.f3_tensor(lse, bench.FLASH3_FP32)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        opts = lib.lib.flash3_default_options()
        opts.softmax_scale, opts.causal = 1 / math.sqrt(d), int(causal)
        ws_bytes = lib.lib.flash3_backward_workspace_size(P(T["q"]), P(T["k"]), P(T["v"]), P(opts))
        ws = torch.empty(int(ws_bytes), device="cuda", dtype=torch.uint8)
        lib.lib.flash3_forward(P(T["q"]), P(T["k"]), P(T["v"]), P(T["o"]), P(tl), P(opts), stream)
        bwd_args = (P(T["q"]), P(T["k"]), P(T["v"]), P(T["o"]), P(T["do"]), P(tl), None, P(T["dq"]), P(T["dk"]),
                    P(T["dv"]), P(opts), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws_bytes), stream)
        cud = bench.cudnn_sdpa_fn(torch, F, *(t.transpose(1, 2) for t in (q, k, v)), causal, 1 / math.sqrt(d), "bwd")
        flops = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        if lib.lib.flash3_backward(*bwd_args) != bench.FLASH3_OK:
            sys.exit(f"flash3 backward d={d} s={s} causal={causal}: {lib.last_error()}")
        for name, fn in (("flash3", lambda: lib.lib.flash3_backward(*bwd_args)), ("cudnn", cud)):
            torch.cuda.synchronize()
            t0 = time.time()
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            calls, half = 0, None
            while time.time() - t0 < args.seconds:
                if half is None and time.time() - t0 >= args.seconds / 2:
                    torch.cuda.synchronize()
                    half = time.time()
                    ev0.record()
                    calls = 0
                for _ in range(4):
                    fn()
                calls += 4
                torch.cuda.synchronize()
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
