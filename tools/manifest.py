#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""The one list of kernel variants.

Generates, into --out:
  * one .cu file per (pass, dtype, head_dim, head_dim_v, feature) instantiation,
  * kernel_table.inc: X-macro rows FLASH3_FWD(dtype_enum, cutlass_type, d, dv,
    score_mod_policy) / FLASH3_BWD(...) / FLASH3_FWD_PACKGQA(dtype_enum,
    cutlass_type, d, dv) used by src/launch/dispatch.cu (dispatch + is_built),
  * variants.txt: the built variants ("fwd bf16 128 128 none"), read by the GPU
    tests and the benchmark,
  * head_dims.inc: X-macro rows FLASH3_HEAD_DIM(d, dv), every pair the manifest
    knows (built or not), the one head-dim list of the tests and tools.

Features are the named axis of compile-time options that get units of their
own ("none" always; --features adds others for every (pass, dtype, head dim));
everything else (masks, varlen, tile variants) is chosen at run time inside a
unit.
Prints the generated .cu paths (';'-separated) for CMake.
"""
import argparse
import os

DTYPES = {  # name -> (flash3::DType enumerator, CUTLASS element type)
    "bf16": ("kBFloat16", "cutlass::bfloat16_t"),
    "fp16": ("kFloat16", "cutlass::half_t"),
    "e4m3": ("kFloat8E4M3", "cutlass::float_e4m3_t"),
}
# FP8 (e4m3, bf16 output) is forward-only, without score modifiers or
# PackGQA, for these head dims (the V transpose takes d_v in 32-byte blocks).
FP8_PASSES = ("fwd",)
FP8_FEATURES = ("none",)
FP8_HDIMS = ("64", "96", "128", "192", "256")
# (head_dim, head_dim_v) pairs that have kernels; "192x128" is DeepSeek-style.
HDIMS = {"64": (64, 64), "96": (96, 96), "128": (128, 128), "192": (192, 192),
         "256": (256, 256), "192x128": (192, 128)}
# Feature -> (score-modifier policy of src/fusion/score_mod.h, unit-name suffix,
# passes it has units for). "packgqa": the forward with the query heads of a
# KV head packed into one tile (run_fwd_packed; identity score modifier only).
FEATURES = {"none": ("ScoreModIdentity", "", ("fwd", "bwd")),
            "softcap": ("ScoreModSoftcap", "_softcap", ("fwd", "bwd")),
            "packgqa": ("ScoreModIdentity", "_packgqa", ("fwd",))}
PASSES = {"fwd": "src/launch/fwd_launch.cuh", "bwd": "src/launch/bwd_launch.cuh"}
NOT_IMPLEMENTED = {}
# Head dims each pass has kernels for; other rows are left out of the pass
# (the library then says "not built" for them, naming what is built).
PASS_HDIMS = {"fwd": set(HDIMS), "bwd": set(HDIMS)}


def split(s):
    return [x for x in s.replace(",", ";").split(";") if x]


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="bf16;fp16")
    ap.add_argument("--hdims", default=";".join(HDIMS))
    ap.add_argument("--passes", default="fwd")
    ap.add_argument("--features", default="softcap;packgqa", help="features besides 'none' (';'-separated)")
    ap.add_argument("--kernels", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for d in split(a.dtypes):
        if d not in DTYPES:
            raise SystemExit(f"manifest: unknown dtype '{d}' (have {list(DTYPES)})")
    for h in split(a.hdims):
        if h not in HDIMS:
            raise SystemExit(f"manifest: unknown head dim '{h}' (have {list(HDIMS)})")
    features = ["none"] + [f for f in split(a.features) if f != "none"]
    for f in features:
        if f not in FEATURES:
            raise SystemExit(f"manifest: unknown feature '{f}' (have {list(FEATURES)})")
    for p in split(a.passes):
        if p not in PASSES:
            raise SystemExit(f"manifest: unknown pass '{p}' (have {list(PASSES)})")
        if p in NOT_IMPLEMENTED:
            raise SystemExit(f"manifest: pass '{p}' has no kernels yet (not supported yet: {NOT_IMPLEMENTED[p]})")

    sources, rows, listing = [], [], []
    if a.kernels:
        for p in split(a.passes):
            for dt in split(a.dtypes):
                enum, ctype = DTYPES[dt]
                if dt == "e4m3" and p not in FP8_PASSES:
                    continue
                for h in split(a.hdims):
                    if h not in PASS_HDIMS[p] or (dt == "e4m3" and h not in FP8_HDIMS):
                        continue
                    d, dv = HDIMS[h]
                    for f in features:
                        policy, suffix, passes = FEATURES[f]
                        if p not in passes or (dt == "e4m3" and f not in FP8_FEATURES):
                            continue
                        name = f"{p}_{dt}_hd{d}x{dv}{suffix}.cu"
                        params = "FwdPlan" if p == "fwd" else "BwdPlan"
                        if f == "packgqa":
                            inst = f"run_fwd_packed<{ctype}, {d}, {dv}>"
                            rows.append(f"FLASH3_FWD_PACKGQA({enum}, {ctype}, {d}, {dv})")
                        else:
                            inst = f"{'run_fwd' if p == 'fwd' else 'run_bwd'}<{ctype}, {d}, {dv}, {policy}>"
                            rows.append(f"FLASH3_{p.upper()}({enum}, {ctype}, {d}, {dv}, {policy})")
                        text = (f"// Generated by tools/manifest.py: do not edit.\n"
                                f"#include \"{PASSES[p][len('src/'):]}\"\n"
                                f"namespace flash3 {{\n"
                                f"template Status {inst}(const {params}&, cudaStream_t);\n"
                                f"}}  // namespace flash3\n")
                        path = os.path.join(a.out, name)
                        write_if_changed(path, text)
                        sources.append(path)
                        listing.append(f"{p} {dt} {d} {dv} {f}")
    write_if_changed(os.path.join(a.out, "kernel_table.inc"),
                     "// Generated by tools/manifest.py: do not edit.\n" + "\n".join(rows) + "\n")
    write_if_changed(os.path.join(a.out, "variants.txt"), "\n".join(listing) + ("\n" if listing else ""))
    write_if_changed(os.path.join(a.out, "head_dims.inc"),
                     "// Generated by tools/manifest.py: do not edit.\n" +
                     "".join(f"FLASH3_HEAD_DIM({d}, {dv})\n" for d, dv in HDIMS.values()))
    print(";".join(sources))


if __name__ == "__main__":
    main()
