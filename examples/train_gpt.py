#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Train a small GPT twice, with flash3 attention and with torch SDPA, and compare the loss curves.

Data: a token stream from a fixed random Markov chain (vocab 512, each token has 8 possible
successors with random probabilities), generated on the GPU from a seed. A model that learns the
transition table reaches the chain's entropy rate, printed as the best possible loss, so the loss
visibly falls. Both runs use the same seed, the same initial weights and the same batches; they
differ only in the attention call:
    flash3: flash3.flash_attn_func(q, k, v, causal=True)                      q: (b, s, h, d)
    sdpa:   F.scaled_dot_product_attention(q, k, v, is_causal=True)           q: (b, h, s, d)
Mixed precision: fp32 weights, bf16 autocast (attention runs in bf16).

Writes into --out: train_loss.csv (step, loss_flash3, loss_sdpa, abs_diff), train_loss.png (when
matplotlib is installed) and train_summary.json; prints max |diff| of the two curves (raw and
smoothed).

Usage: python3 examples/train_gpt.py --out OUTDIR [--steps 300] [--batch 8] [--seqlen 1024]
       [--layers 4] [--d-model 512] [--heads 8] [--attn both|flash3|sdpa]
Exit status: 0 both runs finished, 1 a run failed (its error is printed and recorded).
"""
import argparse
import csv
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------
# Data.
# ---------------------------------------------------------------------------
def make_chain(vocab, fanout, seed, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    succ = torch.stack([torch.randperm(vocab, generator=g)[:fanout] for _ in range(vocab)])  # (V, fanout)
    w = torch.rand(vocab, fanout, generator=g) ** 2 + 0.05
    p = w / w.sum(dim=1, keepdim=True)
    trans = torch.zeros(vocab, vocab)
    trans.scatter_(1, succ, p)
    # entropy rate = sum_i pi_i H(row i), pi the stationary distribution
    pi = torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)
    t64 = trans.double()
    for _ in range(500):
        pi = pi @ t64
    h_rows = -(t64 * torch.log(t64.clamp_min(1e-30))).sum(dim=1)
    entropy = float((pi * h_rows).sum())
    return trans.to(device), entropy


def make_stream(trans, n_chains, length, seed):
    """(n_chains, length) int64 tokens, each row one run of the chain."""
    device = trans.device
    g = torch.Generator(device=device).manual_seed(seed)
    vocab = trans.shape[0]
    toks = torch.empty(n_chains, length, dtype=torch.long, device=device)
    cur = torch.randint(0, vocab, (n_chains,), device=device, generator=g)
    for t in range(length):
        toks[:, t] = cur
        cur = torch.multinomial(trans[cur], 1, generator=g).squeeze(1)
    return toks


# ---------------------------------------------------------------------------
# Model.
# ---------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, d_model, heads, impl):
        super().__init__()
        self.h, self.d = heads, d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.impl = impl
        if impl == "flash3":
            from flash3 import flash_attn_func

            self.flash_attn_func = flash_attn_func

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, self.d).unbind(dim=2)  # (b, s, h, d) views
        if self.impl == "flash3":
            y = self.flash_attn_func(q, k, v, causal=True)
        else:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True).transpose(1, 2)
        return self.proj(y.reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, d_model, heads, impl):
        super().__init__()
        self.n1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, impl)
        self.n2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model, bias=False), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model, bias=False))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class GPT(nn.Module):
    def __init__(self, vocab, seqlen, d_model, heads, layers, impl):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seqlen, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads, impl) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


# ---------------------------------------------------------------------------
# Training.
# ---------------------------------------------------------------------------
def train(impl, args, stream, device):
    torch.manual_seed(args.seed)  # same initial weights for both runs
    model = GPT(args.vocab, args.seqlen, args.d_model, args.heads, args.layers, impl).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    g = torch.Generator(device=device).manual_seed(args.seed + 1)  # same batches for both runs
    n_chains, length = stream.shape
    losses = []
    t0 = time.time()
    for step in range(args.steps):
        rows = torch.randint(0, n_chains, (args.batch,), device=device, generator=g)
        starts = torch.randint(0, length - args.seqlen - 1, (args.batch,), device=device, generator=g)
        idx = starts.view(-1, 1) + torch.arange(args.seqlen + 1, device=device).view(1, -1)
        seq = stream[rows.view(-1, 1), idx]
        x, y = seq[:, :-1], seq[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print(f"  [{impl}] step {step:4d}  loss {losses[-1]:.4f}  ({time.time() - t0:.1f} s)", flush=True)
    return losses, time.time() - t0


def ema(xs, a=0.9):
    out, m = [], None
    for x in xs:
        m = x if m is None else a * m + (1 - a) * x
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/train_gpt")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8, help="head_dim = d_model / heads (64 by default)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--fanout", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="both", choices=["both", "flash3", "sdpa"])
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (flash3: Hopper)")
        return 1
    device = "cuda"
    os.makedirs(args.out, exist_ok=True)
    trans, entropy = make_chain(args.vocab, args.fanout, args.seed, device)
    stream = make_stream(trans, n_chains=512, length=4 * args.seqlen, seed=args.seed)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads (head_dim "
          f"{args.d_model // args.heads}), seqlen {args.seqlen}, batch {args.batch}, {args.steps} steps")
    print(f"data: Markov chain, vocab {args.vocab}, fanout {args.fanout}; entropy rate (best loss) {entropy:.4f} nats;"
          f" uniform guess {math.log(args.vocab):.4f}")

    impls = ["flash3", "sdpa"] if args.attn == "both" else [args.attn]
    curves, times, errors = {}, {}, {}
    for impl in impls:
        print(f"run: {impl}")
        try:
            curves[impl], times[impl] = train(impl, args, stream, device)
        except Exception as e:  # keep going: the other run is still informative
            errors[impl] = f"{type(e).__name__}: {e}"
            print(f"  [{impl}] FAILED: {errors[impl]}")
            traceback.print_exc()

    summary = {"steps": args.steps, "entropy_rate": entropy, "errors": errors,
               "seconds": times, "final_loss": {k: v[-1] for k, v in curves.items()}}
    path_csv = os.path.join(args.out, "train_loss.csv")
    with open(path_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"loss_{k}" for k in impls] + (["abs_diff"] if len(curves) == 2 else []))
        for s in range(args.steps):
            row = [s] + [f"{curves[k][s]:.6f}" if k in curves else "" for k in impls]
            if len(curves) == 2:
                row.append(f"{abs(curves['flash3'][s] - curves['sdpa'][s]):.6f}")
            w.writerow(row)
    print(f"wrote {path_csv}")
    if len(curves) == 2:
        a, b = curves["flash3"], curves["sdpa"]
        diff = [abs(x - y) for x, y in zip(a, b)]
        sdiff = [abs(x - y) for x, y in zip(ema(a), ema(b))]
        tail = max(1, args.steps // 5)
        summary.update({
            "max_abs_diff": max(diff),
            "max_abs_diff_smoothed": max(sdiff),
            "mean_abs_diff_last": sum(diff[-tail:]) / tail,
            "loss_drop": {k: v[0] - v[-1] for k, v in curves.items()},
        })
        print(f"max |loss_flash3 - loss_sdpa| = {max(diff):.4f} (raw), {max(sdiff):.4f} (EMA 0.9 smoothed); "
              f"mean over the last {tail} steps {summary['mean_abs_diff_last']:.4f}")
        print(f"final loss: flash3 {a[-1]:.4f}, sdpa {b[-1]:.4f} (entropy rate {entropy:.4f}); "
              f"time: flash3 {times['flash3']:.1f} s, sdpa {times['sdpa']:.1f} s")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5))
        for k, v in curves.items():
            ax.plot(v, label=f"{k} (final {v[-1]:.3f})", alpha=0.85, lw=1.2)
        ax.axhline(entropy, color="gray", ls="--", lw=1, label=f"entropy rate {entropy:.3f}")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy loss (nats)")
        title = f"GPT {args.layers}x{args.d_model}, seqlen {args.seqlen}: flash3 vs torch SDPA"
        if "max_abs_diff" in summary:
            title += f"\nmax |diff| {summary['max_abs_diff']:.3f} (smoothed {summary['max_abs_diff_smoothed']:.3f})"
        ax.set_title(title, fontsize=10)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path_png = os.path.join(args.out, "train_loss.png")
        fig.savefig(path_png, dpi=110)
        print(f"wrote {path_png}")
    except ImportError:
        print("matplotlib is not installed: no plot (the CSV has the curves)")
    with open(os.path.join(args.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
