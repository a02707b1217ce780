# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""FP8 (torch.float8_e4m3fn): flash_attn_func's FP8 path (torch.ops.flash3.fwd_fp8, forward
only), the checks of its fake implementation, and quantize_fp8."""
from typing import Optional, Tuple

import torch

from .common import (FP8_SCALE_BLOCK, _check_forward_inputs, _check_not_implemented, _check_num_splits,
                     _check_sm_margin, _check_softcap, _dtype_str, _fwd_fp8, _pack_gqa_arg, _quantize_fp8,
                     _require_cuda, _require_device_of_q, _window_sides)


def _check_fp8_inputs(q, k, v, q_descale, k_descale, v_descale):
    """The checks of torch.ops.flash3.fwd_fp8 (csrc/attention.cpp, same messages)."""
    _check_forward_inputs(q, k, v, fp8=True)
    b, hkv = q.shape[0], k.shape[2]
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        _require_cuda(name, t)
        _require_device_of_q(name, t, q)
        if t.dtype != torch.float32:
            raise TypeError(f"flash3: {name}.dtype is {_dtype_str(t.dtype)}; expected torch.float32")
        heads, seqlen = (q.shape[2], q.shape[1]) if name == "q_descale" else (hkv, k.shape[1])
        blocks = (seqlen + FP8_SCALE_BLOCK - 1) // FP8_SCALE_BLOCK
        per_head = t.dim() == 2 and tuple(t.shape) == (b, hkv)
        per_block = t.dim() == 3 and tuple(t.shape) == (b, heads, blocks)
        if not (per_head or per_block):
            raise ValueError(f"flash3: {name} has shape {tuple(t.shape)}; expected (batch, num_heads_kv) = "
                             f"({b}, {hkv}) or block scales (batch, num_heads, ceil(seqlen / "
                             f"{FP8_SCALE_BLOCK})) = ({b}, {heads}, {blocks})")


class _Fp8NoBackward(torch.autograd.Function):
    """FP8 outputs for inputs that require grad (FlashAttention-3's behaviour): the forward
    runs, and only a backward that actually reaches the inputs raises."""

    @staticmethod
    def forward(ctx, out, lse, q, k, v):
        ctx.mark_non_differentiable(lse)
        return out.detach(), lse.detach()

    @staticmethod
    def backward(ctx, dout, dlse):
        raise RuntimeError("flash3: FP8 attention is forward-only: there is no backward for torch.float8_e4m3fn "
                           "q / k / v (FlashAttention-3 has none either); run the bf16 / fp16 path for training")


def _flash_attn_fp8(q, k, v, softmax_scale, causal, qv, q_descale, k_descale, v_descale, window_size,
                    attention_chunk, softcap, num_splits, pack_gqa, deterministic, sm_margin, return_lse):
    """flash_attn_func's FP8 path (torch.ops.flash3.fwd_fp8): forward only, out torch.bfloat16.
    Every argument is checked as on the 16-bit path; num_splits, pack_gqa and deterministic only
    change the speed there and are accepted here (the FP8 kernels run unsplit and unpacked)."""
    _check_not_implemented(qv, None, None, None, attention_chunk)
    softcap = _check_softcap(softcap)
    if softcap != 0.0:
        raise NotImplementedError(f"flash3: softcap={softcap} with FP8 inputs is not supported yet; pass 0.0")
    _check_num_splits(num_splits)
    _pack_gqa_arg(pack_gqa)
    if not isinstance(deterministic, bool):
        raise TypeError(f"flash3: deterministic is {deterministic!r} ({type(deterministic).__name__}); "
                        "expected a bool")
    _check_sm_margin(sm_margin)
    window_left, window_right = _window_sides(window_size)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if needs_grad:
        with torch.no_grad():
            out, lse = _fwd_fp8(q.detach(), k.detach(), v.detach(), q_descale, k_descale, v_descale, softmax_scale,
                                causal, window_left, window_right)
        out, lse = _Fp8NoBackward.apply(out, lse, q, k, v)
    else:
        out, lse = _fwd_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_left,
                            window_right)
    if return_lse:
        return out, lse
    return out


def quantize_fp8(x: torch.Tensor, heads_per_scale: int = 1, hadamard: bool = False,
                 hadamard_seed: int = 0, block_scales: bool = False, rotary_cos: Optional[torch.Tensor] = None,
                 rotary_sin: Optional[torch.Tensor] = None,
                 rotary_interleaved: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """FP8 (e4m3) quantization for flash_attn_func's FP8 path (torch.ops.flash3.quantize_fp8).

    x: (batch, seqlen, num_heads, head_dim), torch.float16 or torch.bfloat16, CUDA, rows 16-byte
    aligned. Returns (x8, descale): x8 torch.float8_e4m3fn of x's shape and torch.float32
    descales = amax / 448 of each group (1 for an all-zero group), so x8 * descale ~ x:
      * block_scales=False: descale (batch, num_heads / heads_per_scale), one per group of heads
        (two passes over x). For q with GQA pass heads_per_scale = num_heads_q // num_heads_kv:
        the descale is then flash_attn_func's (batch, num_heads_kv) q_descale.
      * block_scales=True: descale (batch, num_heads, ceil(seqlen / 128)), one per 128 tokens of
        each head (FlashAttention-3's block quantization; one pass over x). flash_attn_func takes
        these directly as q_descale / k_descale / v_descale.
    hadamard: rotate first, x -> x (1/sqrt(head_dim)) H D (randomized Hadamard, signs from
    hadamard_seed; head_dim a power of two in [32, 256]). Rotate q and k with the same seed
    (q k^T is unchanged, outliers are spread over the row); never v.
    rotary_cos, rotary_sin: optional (seqlen_ro >= seqlen, rotary_dim / 2) tables in x's dtype (both
    or neither; q and k only): rotary is applied first, in fp32, token s by table row s (for a chunk
    at position p pass the tables from row p), pairs (2i, 2i + 1) when rotary_interleaved (GPT-J),
    else (i, i + rotary_dim / 2) (GPT-NeoX); rotary_dim a multiple of 16 up to head_dim (a power
    of two when not interleaved), rows 16-byte aligned.
    """
    return _quantize_fp8(x, heads_per_scale, block_scales, hadamard, hadamard_seed, rotary_cos, rotary_sin,
                         rotary_interleaved)
