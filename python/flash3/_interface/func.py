# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash_attn_func (fixed-length attention; FP8 inputs go to fp8._flash_attn_fp8) and
flash_attn_qkvpacked_func."""
from typing import Optional, Tuple, Union

import torch

from .common import (_check_entry, _check_num_splits, _fwd, _is_int, _pack_gqa_arg, _shape_str, _softcap_arg,
                     _window_sides, _with_out)
from .fp8 import _flash_attn_fp8


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    out: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Scaled dot-product attention, FlashAttention-3 interface (positional order included).

    Arguments:
        q: (batch, seqlen_q, num_heads_q, head_dim), torch.float16 or torch.bfloat16, on a Hopper GPU;
            or torch.float8_e4m3fn (FP8, forward only: see q_descale).
        k: (batch, seqlen_k, num_heads_kv, head_dim), same dtype and device as q.
        v: (batch, seqlen_k, num_heads_kv, head_dim_v), same dtype and device as q.
            Any batch / seqlen / head strides; the last dimension must have stride 1.
            num_heads_q must be a multiple of num_heads_kv (GQA/MQA: query head h uses kv head
            h // (num_heads_q // num_heads_kv)). (head_dim, head_dim_v) must be one this build has
            kernels for: (64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128) by default
            (see flash3.forward_is_built).
        softmax_scale: scaling of q @ k^T before the softmax. None means 1 / sqrt(head_dim); a
            number is used exactly as given, 0 included (every visible key then gets the same
            weight). Negative, infinite or NaN values (after rounding to float32) raise ValueError:
            the online softmax tracks the row maximum of the unscaled scores, which a negative
            scale would turn into the row minimum.
        causal: causal mask, aligned to the bottom-right corner when seqlen_q != seqlen_k
            (query i attends to keys j <= i + seqlen_k - seqlen_q); the same mask as
            window_size=(-1, 0) without causal.
        qv: a FlashAttention-3 argument flash3 does not implement yet; it must be None
            (NotImplementedError otherwise).
        q_descale, k_descale, v_descale: FP8 inputs only (q, k, v torch.float8_e4m3fn): the
            dequantization factors, torch.float32 on q's device, or None (1): (batch,
            num_heads_kv) as FlashAttention-3 takes them, or block scales (batch, num_heads,
            ceil(seqlen / 128)), one per 128 tokens of each head (q's heads and seqlen_q for
            q_descale, k's for k_descale / v_descale; flash3.quantize_fp8(block_scales=True)
            writes them). Descales must be positive. The scores are softmax_scale * (q_descale * q) @ (k_descale * k)^T and the output
            P @ (v_descale * v), in torch.bfloat16. FP8 calls are forward only (an input that
            requires grad raises RuntimeError) and take no softcap; the kernels keep the FP8
            precision of the inputs and of P (docs/design.md, "FP8").
        window_size: (left, right) sliding window, FlashAttention-3's rules. Query i attends to
            key j iff
                j >= i + seqlen_k - seqlen_q - left   (when left >= 0) and
                j <= i + seqlen_k - seqlen_q + right  (when right >= 0).
            Any negative side is unbounded. Any Python int is accepted: a side that can cut
            nothing (left >= seqlen_k - 1, right >= seqlen_q - 1, e.g. 2**31 - 1 or 2**40) is
            unbounded. With causal=True the right side is 0 whatever value is given and the left
            side is kept: causal with a finite left side is local (sliding-window causal)
            attention. A query that sees no key gives out = 0 and softmax_lse = -inf.
        attention_chunk: must be 0 (not implemented).
        softcap: tanh soft-capping of the attention scores, as in FlashAttention-3 (the logit
            soft-capping of e.g. Gemma 2); 0 (the default) disables it. With softcap > 0 each
            scaled score s = softmax_scale * q . k becomes softcap * tanh(s / softcap), i.e. it
            is squashed into (-softcap, softcap), before the mask and the softmax; softmax_lse is
            the logsumexp of the capped scores. Forward and backward (the gradients go through
            the tanh), with every mask, GQA/MQA and deterministic, for every built dtype and
            head dim.
            softmax_scale=0 makes every capped score 0 (uniform weights). Negative, infinite or
            NaN values (after rounding to float32) raise ValueError. A build configured without
            the softcap kernels (CMake FLASH3_FEATURES without "softcap") raises
            NotImplementedError for softcap > 0.
        num_splits: split-KV, as in FlashAttention-3 (forward only): the key/value range of each
            query tile is split over num_splits thread blocks, whose fp32 partial outputs a
            combine kernel then merges; this fills the GPU when there are few query tiles
            (decode-like calls: short seqlen_q, long seqlen_k). 1 (the default): no split; 0: a
            heuristic decides (splits where that fills the SMs); n in [2, 256]: at most n splits
            (fewer when there are fewer key blocks). Only the speed depends on it (and fp32
            rounding): where no split-capable kernel is built (softcap > 0, a build without the
            packgqa kernels) the unsplit kernel runs. Other ints raise ValueError, other types
            TypeError. The backward ignores it.
        sm_margin: FlashAttention-3 performance hint; accepted and ignored (flash3 uses every
            SM).
        pack_gqa: PackGQA, FlashAttention-3's forward option for GQA/MQA (num_heads_q >
            num_heads_kv): the query heads that share a KV head are packed into one tile, so each
            K/V tile is loaded once per group. None (the default) lets a heuristic decide (it packs
            when that fills the query tiles clearly better, e.g. short seqlen_q); True packs, False
            does not. Only the speed depends on it, never the results: where no packed
            kernel exists (num_heads_q == num_heads_kv, softcap > 0, a build without the packgqa
            kernels) the unpacked kernel runs. The backward never packs. A value other than None,
            True or False (or the ints 1 and 0) raises TypeError.
        deterministic: make the backward pass bitwise reproducible.
        return_attn_probs: as in FlashAttention-3: also return softmax_lse (the probabilities
            themselves are never returned).
        return_lse: keyword-only alias of return_attn_probs.

    Returns:
        out: (batch, seqlen_q, num_heads_q, head_dim_v), dtype of q; or, when return_attn_probs or
        return_lse is set, (out, softmax_lse) with softmax_lse (batch, num_heads_q, seqlen_q)
        torch.float32, the natural-log logsumexp of each row of the scaled (and, with softcap,
        capped) scores. Both are differentiable: gradients flow to q, k, v from out and from
        softmax_lse.

    Raises (before anything is launched):
        ValueError: a CPU tensor, mismatched devices or shapes, a last dimension that is not
            contiguous, an unsupported head dim, a negative / infinite / NaN softmax_scale or
            softcap.
        TypeError: a dtype other than float16/bfloat16, or q/k/v dtypes that differ; a pack_gqa
            other than None, True or False; a num_splits that is not an int.
        NotImplementedError: a feature flash3 does not have yet (qv, FP8 descales,
            attention_chunk; a non-Hopper GPU), softcap > 0 in a build without the softcap
            kernels.
        RuntimeError: a CUDA error.
    """
    if isinstance(q, torch.Tensor) and q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return _flash_attn_fp8(q, k, v, softmax_scale, causal, qv, q_descale, k_descale, v_descale, window_size,
                               attention_chunk, softcap, num_splits, pack_gqa, deterministic, sm_margin,
                               return_attn_probs or return_lse)
    _check_entry(qv, q_descale, k_descale, v_descale, attention_chunk, sm_margin)
    softcap = _softcap_arg(softcap)
    window_left, window_right = _window_sides(window_size)
    result, lse = _fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                       _pack_gqa_arg(pack_gqa), _check_num_splits(num_splits))
    return _with_out(result, lse, out, "(batch, seqlen_q, num_heads_q, head_dim_v)", return_attn_probs or return_lse)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    deterministic: bool = False,
    num_heads_q: Optional[int] = None,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """flash_attn_func on q, k, v packed in one tensor, FlashAttention-3 interface (positional
    order included).

    Arguments:
        qkv: (batch, seqlen, 3, num_heads, head_dim) (MHA), or (batch, seqlen, num_heads_q + 2 *
            num_heads_kv, head_dim) with num_heads_q given (q's heads, then k's, then v's: GQA /
            MQA). q, k and v are views of it (no copy: flash3 takes strided inputs).
        num_heads_q: the number of q heads of a 4-d qkv; ignored for a 5-d one.
        The other arguments are flash_attn_func's (FP8 qkv with its descales included).

    Returns:
        flash_attn_func's: out (batch, seqlen, num_heads_q, head_dim), and softmax_lse when
        return_attn_probs or return_lse is set. The gradient reaches qkv through the views (one
        tensor assembled from dq, dk and dv, where FlashAttention-3 writes them into it directly).

    Raises (before anything is launched):
        ValueError: a qkv that is not 4- or 5-d, a 5-d qkv whose third dimension is not 3, a 4-d
            qkv without num_heads_q or whose heads are not num_heads_q + 2 * num_heads_kv with
            num_heads_kv >= 1; and whatever flash_attn_func raises for q, k, v.
        TypeError: qkv not a tensor, num_heads_q not an int.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"flash3: qkv is a {type(qkv).__name__}; expected a torch.Tensor")
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"flash3: qkv has shape {_shape_str(qkv.shape)}; expected (batch, seqlen, 3, "
                             "num_heads, head_dim)")
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError(f"flash3: qkv has shape {_shape_str(qkv.shape)} and num_heads_q is None; a 4-d qkv "
                             "(batch, seqlen, num_heads_q + 2 * num_heads_kv, head_dim) needs num_heads_q")
        if not _is_int(num_heads_q):
            raise TypeError(f"flash3: num_heads_q is a {type(num_heads_q).__name__}; expected an int")
        kv_heads2 = qkv.shape[2] - num_heads_q
        if num_heads_q < 1 or kv_heads2 < 2 or kv_heads2 % 2 != 0:
            raise ValueError(f"flash3: qkv has {qkv.shape[2]} heads with num_heads_q = {num_heads_q}; expected "
                             "num_heads_q + 2 * num_heads_kv heads with num_heads_q >= 1 and num_heads_kv >= 1")
        q, k, v = qkv.split([num_heads_q, kv_heads2 // 2, kv_heads2 // 2], dim=2)
    else:
        raise ValueError(f"flash3: qkv has shape {_shape_str(qkv.shape)}; expected (batch, seqlen, 3, num_heads, "
                         "head_dim) or (batch, seqlen, num_heads_q + 2 * num_heads_kv, head_dim)")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale, window_size,
                           attention_chunk, softcap, 1, None, deterministic, sm_margin, return_attn_probs,
                           return_lse=return_lse)
