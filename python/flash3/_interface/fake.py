# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Fake (meta) implementations of the flash3 operators: shapes, dtypes and strides of the real
outputs (all contiguous), after the argument checks the C++ operators make in eager mode, so
that torch.compile(fullgraph=True) traces them and a traced program fails at compile time with
the same exception as the eager one. flash3.flash_attn_interface registers them
(torch.library.register_fake): the C++ library names that module as theirs
(m.set_python_module), and torch checks that the registration comes from it."""
import torch

from .common import (FP8_SCALE_BLOCK, _check_forward_inputs, _check_scalar_options, _check_softcap,
                     _check_softmax_scale, _dtype_str)
from .combine import _check_combine_inputs
from .fp8 import _check_fp8_inputs
from .kvcache import _kvcache_fake_outputs
from .varlen import _check_varlen_backward_tensors, _check_varlen_inputs


def _fwd_fake(q, k, v, softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
              deterministic=False, pack_gqa=-1, num_splits=1):
    _check_forward_inputs(q, k, v)
    _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits)
    b, sq, hq, _ = q.shape
    dv = v.shape[3]
    out = q.new_empty((b, sq, hq, dv))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


def _fwd_fp8_fake(q, k, v, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                  window_left=-1, window_right=-1):
    _check_fp8_inputs(q, k, v, q_descale, k_descale, v_descale)
    _check_softmax_scale(softmax_scale)
    b, sq, hq, _ = q.shape
    out = q.new_empty((b, sq, hq, v.shape[3]), dtype=torch.bfloat16)
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


def _quantize_fp8_fake(x, heads_per_scale=1, block_scales=False, hadamard=False, hadamard_seed=0, rotary_cos=None,
                       rotary_sin=None, rotary_interleaved=True):
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"flash3: x.dtype is {_dtype_str(x.dtype)}; expected torch.float16 or torch.bfloat16")
    if x.dim() != 4:
        raise ValueError(f"flash3: x has {x.dim()} dimensions (shape {tuple(x.shape)}); expected a 4-d tensor "
                         "(batch, seqlen, num_heads, head_dim)")
    if heads_per_scale < 1 or x.shape[2] % heads_per_scale != 0:
        raise ValueError(f"flash3: heads_per_scale is {heads_per_scale}; expected a divisor of x.shape[2] "
                         f"(num_heads) {x.shape[2]}")
    if block_scales and heads_per_scale != 1:
        raise ValueError(f"flash3: heads_per_scale is {heads_per_scale} with block_scales=True; expected 1 "
                         "(block scales are per head)")
    if block_scales:
        shape = (x.shape[0], x.shape[2], (x.shape[1] + FP8_SCALE_BLOCK - 1) // FP8_SCALE_BLOCK)
    else:
        shape = (x.shape[0], x.shape[2] // heads_per_scale)
    return x.new_empty(x.shape, dtype=torch.float8_e4m3fn), x.new_empty(shape, dtype=torch.float32)


def _bwd_fake(dout, q, k, v, out, softmax_lse, dlse=None, softmax_scale=None, causal=False, window_left=-1,
              window_right=-1, softcap=0.0, deterministic=False):
    _check_forward_inputs(q, k, v)
    _check_softmax_scale(softmax_scale)
    _check_softcap(softcap)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                     deterministic=False, pack_gqa=-1, num_splits=1):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits)
    total_q, hq, _ = q.shape
    dv = v.shape[2]
    out = q.new_empty((total_q, hq, dv))
    lse = q.new_empty((hq, total_q), dtype=torch.float32)
    return out, lse


def _varlen_bwd_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                     deterministic=False, dlse=None):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    _check_softmax_scale(softmax_scale)
    _check_varlen_backward_tensors(dout, q, v, out, softmax_lse, dlse)
    _check_softcap(softcap)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _combine_fake(out_partial, lse_partial, out, softmax_lse):
    _check_combine_inputs(out_partial, lse_partial, out, softmax_lse)


def _fwd_kvcache_fake(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                      cache_batch_idx=None, cache_leftpad=None, page_table=None, rotary_seqlens=None,
                      softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                      rotary_interleaved=True, num_splits=0, pack_gqa=-1, cu_seqlens_q=None, cu_seqlens_k_new=None,
                      max_seqlen_q=None):
    _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits)
    return _kvcache_fake_outputs(q, v_cache, cu_seqlens_q)


def _fwd_kvcache_out_fake(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                          cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                          rotary_seqlens=None, softmax_scale=None, causal=False, window_left=-1, window_right=-1,
                          softcap=0.0, rotary_interleaved=True, num_splits=0, pack_gqa=-1, cu_seqlens_q=None,
                          cu_seqlens_k_new=None, max_seqlen_q=None, *, out):
    _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits)
    return _kvcache_fake_outputs(q, v_cache, cu_seqlens_q)[1]
