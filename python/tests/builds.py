# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""What this build of the flash3 package has kernels for, beyond forward_is_built /
backward_is_built (which report the plain kernels): the test files' shared probes."""
import pytest
import torch

import flash3
from flash3 import flash_attn_func, flash_attn_with_kvcache

_SOFTCAP_BUILT = {}
_PAGED_BUILT = {}


def softcap_built(dtype, d, dv, backward=False):
    """Whether this build has the softcap kernels of (dtype, d, dv), forward (and backward): probed
    once with a tiny call (the same units serve fixed-length and varlen calls); a build without
    them (CMake FLASH3_FEATURES without "softcap") raises NotImplementedError naming softcap and
    FLASH3_FEATURES. Call only where the plain kernels of (dtype, d, dv) are built."""
    key = (dtype, d, dv, backward)
    if key not in _SOFTCAP_BUILT:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, 8, 1, x, device="cuda", dtype=dtype, generator=g).requires_grad_(backward)
                   for x in (d, d, dv))
        try:
            out = flash_attn_func(q, k, v, softcap=5.0)
            if backward:
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            _SOFTCAP_BUILT[key] = True
        except NotImplementedError as e:
            assert "softcap" in str(e) and "FLASH3_FEATURES" in str(e), str(e)
            _SOFTCAP_BUILT[key] = False
    return _SOFTCAP_BUILT[key]


def skip_unless_built(dtype, d, dv, backward=False):
    """Skips the calling test unless the plain forward (and backward) kernels of (dtype, d, dv) are built."""
    if not flash3.forward_is_built(dtype, d, dv):
        pytest.skip(f"forward kernel {dtype} {d}x{dv} not built")
    if backward and not flash3.backward_is_built(dtype, d, dv):
        pytest.skip(f"backward kernel {dtype} {d}x{dv} not built (flash3 backward not in this build)")


def skip_unless_softcap_built(dtype, d, dv, backward=False):
    """skip_unless_built, then also unless the softcap kernels of (dtype, d, dv) are built."""
    skip_unless_built(dtype, d, dv, backward)
    if not softcap_built(dtype, d, dv, backward):
        pytest.skip(f"{'backward' if backward else 'forward'} softcap kernel {dtype} {d}x{dv} not built "
                    "(FLASH3_FEATURES without softcap)")


def paged_built(dtype, d, dv):
    """Whether this build runs paged KV caches (flash_attn_with_kvcache's page_table) for (dtype, d,
    dv): they run in the forward's packgqa unit, which a build may lack (CMake FLASH3_FEATURES
    without "packgqa"; the call then raises NotImplementedError naming it). Probed once with a
    tiny call of one sequence over a one-page pool. Call only where the plain forward kernels of
    (dtype, d, dv) are built."""
    key = (dtype, d, dv)
    if key not in _PAGED_BUILT:
        q = torch.zeros(1, 1, 1, d, device="cuda", dtype=dtype)
        kc = torch.zeros(1, 1, 1, d, device="cuda", dtype=dtype)
        vc = torch.zeros(1, 1, 1, dv, device="cuda", dtype=dtype)
        page_table = torch.zeros(1, 1, device="cuda", dtype=torch.int32)
        try:
            flash_attn_with_kvcache(q, kc, vc, cache_seqlens=1, page_table=page_table)
            _PAGED_BUILT[key] = True
        except NotImplementedError as e:
            assert "packgqa" in str(e), str(e)
            _PAGED_BUILT[key] = False
    return _PAGED_BUILT[key]


def skip_unless_paged_built(dtype, d, dv):
    """skip_unless_built, then also unless paged KV caches run for (dtype, d, dv) (paged_built)."""
    skip_unless_built(dtype, d, dv)
    if not paged_built(dtype, d, dv):
        pytest.skip(f"paged KV cache {dtype} {d}x{dv} not built (the forward's packgqa unit; FLASH3_FEATURES "
                    "without packgqa)")
