#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""A serving loop's attention with flash3.flash_attn_with_kvcache: prefill, then decode steps
replayed from a CUDA graph, checked against torch at the end.

Per layer of a model (one layer here, random activations instead of a model): a KV cache of
--batch entries x --cache rows is allocated once; the prefill call appends each sequence's
--prompt tokens (keys rotated in the call, GPT-NeoX rotary) and attends causally; each decode step
appends one token per sequence at cache_seqlens and advances cache_seqlens on the device, so the
captured graph replays every step with no host work. get_scheduler_metadata pins the split plan
once (flash3 decides it from shapes only). With --page-size P the cache is a paged pool
(FlashAttention-3's page_table layout): each sequence owns --cache / P pages of P rows, handed out
in a shuffled order from a shared pool, as a serving engine's allocator would. At the end the
last step's output is compared with
fp32 attention over every token's rotated key (the tolerance rule of the tests: error <= 2x that
of the same math in bf16 + 1e-3).

Usage: python3 examples/serve_kvcache.py [--batch 8] [--prompt 512] [--steps 64] [--cache 4096]
       [--heads 32] [--kv-heads 8] [--head-dim 128] [--page-size 0]
Exit status: 0 the check passed, 1 it failed.
"""
import argparse
import sys

import torch

import flash3


def rotary_tables(seqlen, dim, device, dtype):
    inv = 10000.0 ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    ang = torch.arange(seqlen, device=device, dtype=torch.float32)[:, None] * inv
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rotate_half(x, cos, sin, pos):
    """GPT-NeoX rotary of x (b, s, h, d) at positions pos (b, s), in fp32."""
    x = x.float()
    c, s = cos[pos].float()[:, :, None], sin[pos].float()[:, :, None]
    x0, x1 = x.chunk(2, dim=-1)
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


def attention_ref(q, k, v, dtype):
    """q (b, 1, hq, d) over k / v (b, s, hkv, d), in `dtype` math (fp32 / bf16)."""
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    qt, kt, vt = (x.transpose(1, 2).to(dtype) for x in (q, k, v))
    p = torch.softmax((qt @ kt.transpose(-1, -2)).float() * q.shape[-1] ** -0.5, dim=-1).to(dtype)
    return (p @ vt).transpose(1, 2).float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--cache", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=0, help="> 0: a paged cache with pages of this many rows")
    a = ap.parse_args()
    if a.page_size > 0 and a.cache % a.page_size:
        ap.error("--cache must be a multiple of --page-size")
    dev, dt = "cuda", torch.bfloat16
    b, hq, hkv, d = a.batch, a.heads, a.kv_heads, a.head_dim
    gen = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape: torch.randn(shape, device=dev, dtype=dt, generator=gen)  # noqa: E731
    kw = dict(rotary_interleaved=False, causal=True)
    if a.page_size > 0:
        # A pool of pages; sequence b's row r lives in page page_table[b, r // P] at row r % P.
        pages = a.cache // a.page_size
        k_cache = torch.zeros(b * pages, a.page_size, hkv, d, device=dev, dtype=dt)
        kw["page_table"] = torch.randperm(b * pages, device=dev).to(torch.int32).view(b, pages)
    else:
        k_cache = torch.zeros(b, a.cache, hkv, d, device=dev, dtype=dt)
    v_cache = torch.zeros_like(k_cache)
    cos, sin = rotary_tables(a.cache, d, dev, dt)
    cache_seqlens = torch.zeros(b, device=dev, dtype=torch.int32)
    kw.update(rotary_cos=cos, rotary_sin=sin)

    # Prefill: every prompt token's key / value appended, the prompt attends causally.
    q0, k0, v0 = rnd(b, a.prompt, hq, d), rnd(b, a.prompt, hkv, d), rnd(b, a.prompt, hkv, d)
    flash3.flash_attn_with_kvcache(q0, k_cache, v_cache, k0, v0, cache_seqlens=cache_seqlens, **kw)
    cache_seqlens += a.prompt

    # Decode: one token per sequence per step; the inputs live in static buffers the graph reads.
    md = flash3.get_scheduler_metadata(b, 1, a.cache, hq, hkv, d, cache_seqlens, qkv_dtype=dt, causal=True,
                                       page_size=a.page_size or None)
    q1, k1, v1 = rnd(b, 1, hq, d), rnd(b, 1, hkv, d), rnd(b, 1, hkv, d)

    def step():
        out = flash3.flash_attn_with_kvcache(q1, k_cache, v_cache, k1, v1, cache_seqlens=cache_seqlens,
                                             scheduler_metadata=md, **kw)
        cache_seqlens.add_(1)
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the graph (allocator, first launches), then rewind
        step()
        cache_seqlens.sub_(1)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    new_k, new_v = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(a.steps):
        # A real loop writes the next token's q / k / v here (from the model's projections).
        q1.copy_(rnd(b, 1, hq, d))
        k1.copy_(rnd(b, 1, hkv, d))
        v1.copy_(rnd(b, 1, hkv, d))
        new_k.append(k1.clone())
        new_v.append(v1.clone())
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / a.steps
    layout = f"pages of {a.page_size}" if a.page_size > 0 else "contiguous"
    print(f"{a.steps} decode steps, batch {b}, {hq}/{hkv} heads, d {d}, {layout} cache: {1e3 * ms:.1f} us per step "
          f"(graph replay incl. the input copies), split plan {md.tolist()}")

    # Check the last step: its query over every token so far, keys rotated at their positions.
    n = a.prompt + a.steps
    keys = torch.cat([k0] + new_k, dim=1)
    vals = torch.cat([v0] + new_v, dim=1)
    pos = torch.arange(n, device=dev)[None].expand(b, n)
    k_rot = rotate_half(keys, cos, sin, pos)
    q_rot = rotate_half(q1, cos, sin, pos[:, n - 1:])
    ref = attention_ref(q_rot, k_rot, vals, torch.float32)
    low = attention_ref(q_rot.to(dt), k_rot.to(dt), vals, dt)
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (low - ref).abs().max().item() + 1e-3
    ok = err <= bound and int(cache_seqlens[0]) == n
    print(f"check: max |out - ref| {err:.2e} (bound {bound:.2e}), cache_seqlens {int(cache_seqlens[0])}: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
