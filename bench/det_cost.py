"""Backward throughput with and without deterministic mode (needs the flash3
Python package): paper shapes (16k tokens, hidden 2048), bf16, CUDA events,
median of 20 runs."""
import statistics
import sys

import torch

import flash3  # noqa: F401  (registers torch.ops.flash3)


def time_ms(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    print("hdim seqlen causal heads_q heads_kv | default TFLOP/s | deterministic TFLOP/s | cost")
    for d, s, causal, hkv_div in [(128, 4096, True, 4), (128, 8192, False, 1), (128, 8192, True, 1), (64, 8192, True, 1)]:
        b, hq = 16384 // s, 2048 // d
        hkv = hq // hkv_div
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        out, lse = torch.ops.flash3.fwd(q, k, v, None, causal, -1, -1, 0.0, False)
        dout = torch.randn_like(out)
        flops = 2.5 * 4 * b * hq * s * s * d / (2 if causal else 1)
        res = {}
        for det in (False, True):
            ms = time_ms(lambda: torch.ops.flash3.bwd(dout, q, k, v, out, lse, None, None, causal, -1, -1, 0.0, det))
            res[det] = flops / ms / 1e9
        print(f"{d:4d} {s:6d} {str(causal):6s} {hq:7d} {hkv:8d} | {res[False]:15.1f} | {res[True]:21.1f} | "
              f"{100 * (1 - res[True] / res[False]):.1f}%")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
