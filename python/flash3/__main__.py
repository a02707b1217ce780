# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""``python -m flash3``: what this installation is and can run.

Prints the package and library versions (and which libflash3 was loaded), the torch and CUDA
versions, each visible GPU and whether flash3 runs on it (or why not), the (dtype, head_dim,
head_dim_v) kernels this build has, forward and backward, the compile-time features (softcap,
packgqa: probed with one tiny call each where a Hopper GPU is present), and the state of the
torch SDPA integration. Exit code 0; 2 with --check when no GPU flash3 can run on is visible.
"""
import argparse
import os
import platform
import sys


def _loaded_libflash3():
    """Path of the libflash3 this process mapped (Linux), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libflash3.so"):
                    return path
    except OSError:
        pass
    return None


def _built_pairs(flash3, dtype, backward):
    fn = flash3.backward_is_built if backward else flash3.forward_is_built
    return [(d, dv) for d in range(8, 257, 8) for dv in range(8, 257, 8) if fn(dtype, d, dv)]


def _probe_feature(torch, flash3, feature, dtype, d, dv):
    """Whether the units of a compile-time feature are built for (dtype, d, dv): one tiny call
    (the binding has no query for it). True / False, or None when the call failed otherwise."""
    q = torch.zeros(1, 8, 2, d, device="cuda", dtype=dtype)
    k = torch.zeros(1, 8, 1, d, device="cuda", dtype=dtype)
    v = torch.zeros(1, 8, 1, dv, device="cuda", dtype=dtype)
    try:
        if feature == "softcap":
            flash3.flash_attn_func(q, k, v, softcap=5.0)
        else:  # packgqa: GQA with pack_gqa=True runs the packed unit where it is built
            kc = torch.zeros(1, 8, 1, d, device="cuda", dtype=dtype)
            vc = torch.zeros(1, 8, 1, dv, device="cuda", dtype=dtype)
            table = torch.zeros(1, 1, device="cuda", dtype=torch.int32)
            flash3.flash_attn_with_kvcache(q[:, :1], kc, vc, cache_seqlens=1, page_table=table)
        return True
    except NotImplementedError as e:
        return False if feature in str(e) or "FLASH3_FEATURES" in str(e) else None
    except Exception:  # noqa: BLE001 (a diagnostic: report, never fail)
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flash3", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 2 when no GPU flash3 can run on is visible")
    args = parser.parse_args(argv)

    import torch

    import flash3

    lib = _loaded_libflash3()
    lib_version = flash3._C.version()
    line = f"flash3 {flash3._package_version}"
    line += f" (libflash3 {lib_version}" + (f": {lib})" if lib else ")")
    if lib_version != flash3._package_version:
        line += "  WARNING: the package and the library versions differ"
    print(line)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), Python {platform.python_version()}, "
          f"{platform.machine()}")

    usable = False
    if not torch.cuda.is_available():
        print("GPU: none visible to torch (flash3 needs an NVIDIA Hopper GPU, sm_90: H100 / H200 / H800 / H20)")
    else:
        for i in range(torch.cuda.device_count()):
            name = torch.cuda.get_device_name(i)
            cap = torch.cuda.get_device_capability(i)
            with torch.cuda.device(i):
                ok, why = flash3.device_is_supported()
            usable |= ok
            print(f"GPU {i}: {name} (sm_{cap[0]}{cap[1]}): " + ("supported" if ok else f"not supported: {why}"))

    print("kernels built (head_dim x head_dim_v):")
    dtypes = [("bf16", torch.bfloat16, True), ("fp16", torch.float16, True), ("e4m3", torch.float8_e4m3fn, False)]
    probe_pairs = {}
    for label, dtype, has_bwd in dtypes:
        fwd = _built_pairs(flash3, dtype, False)
        bwd = _built_pairs(flash3, dtype, True) if has_bwd else []
        if not fwd and not bwd:
            print(f"  {label}: none")
            continue
        cells = [f"{d}x{dv}" + (" fwd+bwd" if (d, dv) in bwd else " fwd") for d, dv in fwd]
        print(f"  {label}: " + ", ".join(cells) + ("" if has_bwd else " (FP8: forward only)"))
        if has_bwd and fwd:
            probe_pairs[label] = (dtype, fwd[0])

    features = []
    for feature in ("softcap", "packgqa"):
        if not usable:
            features.append(f"{feature} (not probed: no supported GPU)")
            continue
        found = []
        for label, (dtype, (d, dv)) in probe_pairs.items():
            r = _probe_feature(torch, flash3, feature, dtype, d, dv)
            found.append(f"{label} {d}x{dv} " + {True: "built", False: "not built", None: "probe failed"}[r])
        features.append(f"{feature}: " + (", ".join(found) or "no kernels to probe"))
    print("features (FLASH3_FEATURES): " + "; ".join(features))

    sdpa = flash3.sdpa
    if sdpa.is_supported_by_torch():
        impls = torch.nn.attention.list_flash_attention_impls()
        state = "active" if sdpa.is_active() else "not active"
        print(f"torch SDPA: '{sdpa.NAME}' registered ({state}; registered implementations: {', '.join(impls)}); "
              f"torch.nn.attention.activate_flash_attention_impl('{sdpa.NAME}') routes "
              "scaled_dot_product_attention to flash3")
    else:
        print(f"torch SDPA: this torch ({torch.__version__}) has no register_flash_attention_impl / "
              "torch.library.get_kernel (2.11+); call flash3.flash_attn_func directly")
    return 2 if args.check and not usable else 0


if __name__ == "__main__":
    sys.exit(main())
