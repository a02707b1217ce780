#!/usr/bin/env python3
"""Plot a bench.py CSV: forward and backward TFLOP/s of flash3, cuDNN and FA2, one panel per pass.

  python3 bench/plot_csv.py docs/bench_h200_2026-11-30b.csv docs/perf_h200_2026-11-30b.png
"""
import csv
import sys


def fmt_len(n):
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f))
    passes = [p for p in ("fwd", "bwd") if any(r["pass"] == p for r in rows)]
    fig, axes = plt.subplots(len(passes), 1, figsize=(14, 4.2 * len(passes)), squeeze=False)
    for ax, pss in zip(axes[:, 0], passes):
        sel = [r for r in rows if r["pass"] == pss]
        labels = [f"d{r['hdim']} {fmt_len(int(r['seqlen']))}{' c' if r['causal'] == '1' else ''}" for r in sel]
        width = 0.27
        for i, (key, name) in enumerate((("flash3", "flash3"), ("cudnn", "cuDNN"), ("fa2", "FA2"))):
            ys = [float(r[f"{key}_tflops"] or 0.0) for r in sel]
            ax.bar([x + (i - 1) * width for x in range(len(sel))], ys, width, label=name)
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels(labels, rotation=70, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{'forward' if pss == 'fwd' else 'backward'} (bf16, 16k tokens, hidden 2048; c = causal)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
