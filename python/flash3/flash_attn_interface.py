# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3's PyTorch API, argument-compatible with FlashAttention-3's ``flash_attn_interface``.

Swapping the import is enough::

    # from flash_attn_interface import flash_attn_func
    from flash3.flash_attn_interface import flash_attn_func   # or: from flash3 import flash_attn_func

The work is done by three operators registered by the C++ extension ``flash3._C``:

* ``torch.ops.flash3.fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
  deterministic, pack_gqa=-1, num_splits=1) -> (out, softmax_lse)``
* ``torch.ops.flash3.bwd(dout, q, k, v, out, softmax_lse, dlse, softmax_scale, causal, window_left,
  window_right, softcap, deterministic) -> (dq, dk, dv)``
* ``torch.ops.flash3.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
  max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
  deterministic, pack_gqa=-1, num_splits=1) -> (out, softmax_lse)`` (variable length)
* ``torch.ops.flash3.varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
  seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
  window_right, softcap, deterministic, dlse=None) -> (dq, dk, dv)`` (variable length; dq / dk / dv
  are 0 in the rows no sequence covers)
* ``torch.ops.flash3.fwd_fp8(q, k, v, q_descale=None, k_descale=None, v_descale=None,
  softmax_scale=None, causal=False, window_left=-1, window_right=-1) -> (out, softmax_lse)`` (FP8:
  torch.float8_e4m3fn q / k / v, descales (batch, num_heads_kv) torch.float32, out torch.bfloat16;
  forward only)
* ``torch.ops.flash3.combine(out_partial, lse_partial, out, softmax_lse) -> ()`` (split-KV
  combine, writes out and softmax_lse in place; ``flash_attn_combine`` allocates them)
* ``torch.ops.flash3.fwd_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
  cache_batch_idx, cache_leftpad, page_table, rotary_seqlens, softmax_scale, causal, window_left,
  window_right, softcap, rotary_interleaved, num_splits=0, pack_gqa=-1) -> (out, softmax_lse)``
  (KV-cache attention, forward only; appends k / v to k_cache / v_cache in place, or to the pages
  of page_table when given; softmax_lse is a (batch, heads, seqlen_q) view of a contiguous
  (heads, batch, seqlen_q) tensor)
* ``torch.ops.flash3.forward_plan(dtype, batch, max_seqlen_q, max_seqlen_k, heads_q, heads_kv,
  head_dim, head_dim_v, causal, window_left, window_right, softcap, num_splits=0, pack_gqa=-1)
  -> [num_splits, pack_gqa]`` (the forward's launch plan on the current device, decided on the
  host; ``get_scheduler_metadata`` returns it as a CPU int32 tensor)

Their CUDA kernels, argument checks and autograd (``fwd``'s backward calls ``bwd``,
``varlen_fwd``'s calls ``varlen_bwd``; ``fwd_kvcache`` is forward only, its outputs never require
grad) are C++; this module adds their fake (meta) implementations, so
``torch.compile(fullgraph=True)`` traces them (forward and backward) without graph breaks, and the
Python entry points ``flash_attn_func``, ``flash_attn_varlen_func``, ``flash_attn_combine``,
``flash_attn_with_kvcache`` and ``get_scheduler_metadata``.

The code lives in ``flash3._interface``, one module per entry point (``common``, ``func``,
``fp8``, ``varlen``, ``combine``, ``kvcache``; ``fake`` for the fake implementations); this
module re-exports all of it and registers the fake implementations, since the C++ library names
this module as theirs (``m.set_python_module("flash3.flash_attn_interface")``) and torch checks
that the registration comes from it.
"""
# math, operator, struct, Optional, Tuple and Union: names this module has always had.
import math  # noqa: F401
import operator  # noqa: F401
import struct  # noqa: F401
from typing import Optional, Tuple, Union  # noqa: F401

import torch

from . import _C  # noqa: F401
from ._interface.combine import (  # noqa: F401
    _COMBINE_OUT_DTYPES,
    _byte_ranges_overlap,
    _check_combine_inputs,
    flash_attn_combine,
)
from ._interface.common import (  # noqa: F401
    FP8_SCALE_BLOCK,
    _FLT_MIN,
    _FWD_LAYOUTS,
    _INT32_MAX,
    _KERNEL_FLOAT_MAX,
    _KERNEL_FLOAT_WHY,
    _MAX_COMBINE_HEAD_DIM,
    _as_float32,
    _built_dtypes,
    _built_list,
    _bwd,
    _check_forward_inputs,
    _check_not_implemented,
    _check_num_splits,
    _check_out,
    _check_pack_gqa,
    _check_qkv_device_dtype,
    _check_scalar_options,
    _check_sm_margin,
    _check_softcap,
    _check_softmax_scale,
    _combine,
    _dtype_str,
    _forward_plan,
    _fwd,
    _fwd_fp8,
    _fwd_kvcache,
    _fwd_kvcache_out,
    _is_int,
    _kernel_float_ok,
    _pack_gqa_arg,
    _quantize_fp8,
    _raise_not_built,
    _shape_str,
    _varlen_bwd,
    _varlen_fwd,
    _window_sides,
    backward_is_built,
    device_is_supported,
    forward_is_built,
)
from ._interface.fake import (
    _bwd_fake,
    _combine_fake,
    _fwd_fake,
    _fwd_fp8_fake,
    _fwd_kvcache_fake,
    _fwd_kvcache_out_fake,
    _quantize_fp8_fake,
    _varlen_bwd_fake,
    _varlen_fwd_fake,
)
from ._interface.fp8 import _check_fp8_inputs, _flash_attn_fp8, _Fp8NoBackward, quantize_fp8  # noqa: F401
from ._interface.func import flash_attn_func, flash_attn_qkvpacked_func  # noqa: F401
from ._interface.kvcache import (  # noqa: F401
    _KVCACHE_LAYOUTS,
    _cache_seqlens_tensor,
    _kvcache_fake_outputs,
    _scheduler_metadata_plan,
    flash_attn_with_kvcache,
    get_scheduler_metadata,
)
from ._interface.varlen import (  # noqa: F401
    _CU_SEQLENS_K,
    _CU_SEQLENS_Q,
    _VARLEN_LAYOUTS,
    _check_int32_on_q_device,
    _check_int32_vector,
    _check_varlen_backward_tensors,
    _check_varlen_inputs,
    flash_attn_varlen_func,
)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "quantize_fp8", "flash_attn_combine", "flash_attn_with_kvcache",
           "get_scheduler_metadata", "forward_is_built", "backward_is_built", "device_is_supported"]

# ---------------------------------------------------------------------------
# Fake (meta) implementations (flash3._interface.fake), registered from this module, in the
# order flash3 has always registered them.
# ---------------------------------------------------------------------------
torch.library.register_fake("flash3::fwd", _fwd_fake)
torch.library.register_fake("flash3::fwd_fp8", _fwd_fp8_fake)
torch.library.register_fake("flash3::quantize_fp8", _quantize_fp8_fake)
torch.library.register_fake("flash3::bwd", _bwd_fake)
torch.library.register_fake("flash3::varlen_fwd", _varlen_fwd_fake)
torch.library.register_fake("flash3::varlen_bwd", _varlen_bwd_fake)
torch.library.register_fake("flash3::combine", _combine_fake)
torch.library.register_fake("flash3::fwd_kvcache", _fwd_kvcache_fake)
torch.library.register_fake("flash3::fwd_kvcache_out", _fwd_kvcache_out_fake)
