# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash_attn_combine (merges split-KV partial results) and the checks of the combine
operator's fake implementation."""
from typing import Optional, Tuple

import torch

from .common import _MAX_COMBINE_HEAD_DIM, _combine, _require_cuda, _shape_str

_COMBINE_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_combine_inputs(out_partial, lse_partial, out, softmax_lse):
    """The binding's checks of torch.ops.flash3.combine (same messages): devices, dtypes, ranks,
    shapes, num_splits and head_dim ranges."""
    names = (("out_partial", out_partial), ("lse_partial", lse_partial), ("out", out),
             ("softmax_lse", softmax_lse))
    for name, t in names:
        _require_cuda(name, t)
    for name, t in names[1:]:
        if t.device != out_partial.device:
            raise ValueError(f"flash3: {name} is on device '{t.device}' but out_partial is on device "
                             f"'{out_partial.device}'; expected all tensors on the same CUDA device")
    if out_partial.dtype != torch.float32:
        raise TypeError(f"flash3: out_partial.dtype is {out_partial.dtype}; expected torch.float32 (the split-KV "
                        "partials are fp32)")
    if lse_partial.dtype != torch.float32:
        raise TypeError(f"flash3: lse_partial.dtype is {lse_partial.dtype}; expected torch.float32")
    if out.dtype not in _COMBINE_OUT_DTYPES:
        raise TypeError(f"flash3: out.dtype is {out.dtype}; expected torch.float32, torch.float16 or torch.bfloat16")
    if softmax_lse.dtype != torch.float32:
        raise TypeError(f"flash3: softmax_lse.dtype is {softmax_lse.dtype}; expected torch.float32")
    if out_partial.dim() != 5:
        raise ValueError(f"flash3: out_partial has {out_partial.dim()} dimensions (shape "
                         f"{_shape_str(out_partial.shape)}); expected a 5-d tensor (num_splits, batch, seqlen, "
                         "num_heads, head_dim)")
    ns, b, s, h, d = out_partial.shape
    if not 1 <= ns <= 256:
        raise ValueError(f"flash3: out_partial.shape[0] (num_splits) is {ns}; expected 1 to 256")
    if not 1 <= d <= _MAX_COMBINE_HEAD_DIM:
        raise ValueError(f"flash3: out_partial.shape[4] (head_dim) is {d}; expected 1 to {_MAX_COMBINE_HEAD_DIM}")
    for name, t, want, layout in (("lse_partial", lse_partial, (ns, b, s, h), "(num_splits, batch, seqlen, num_heads)"),
                                  ("out", out, (b, s, h, d), "(batch, seqlen, num_heads, head_dim)"),
                                  ("softmax_lse", softmax_lse, (b, s, h), "(batch, seqlen, num_heads)")):
        if tuple(t.shape) != want:
            raise ValueError(f"flash3: {name} has shape {_shape_str(t.shape)}; expected {list(want)} {layout} to "
                             f"match out_partial {_shape_str(out_partial.shape)}")


def flash_attn_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: Optional[torch.Tensor] = None,
                       out_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merges the partial results of a split-KV attention (FlashAttention-3's flash_attn_combine).

    Each of num_splits splits attended to a part of the keys and produced an fp32 partial
    output and logsumexp; per row (batch, seqlen, head):
        softmax_lse = log(sum_s exp(lse_partial[s])),
        out = sum_s exp(lse_partial[s] - softmax_lse) * out_partial[s].
    A split whose lse is -inf (no visible key) weighs 0 and its out_partial is not read (it may
    hold anything, NaN included); a row with every split at -inf gets out = 0 and
    softmax_lse = -inf (never NaN).

    Arguments:
        out_partial: (num_splits, batch, seqlen, num_heads, head_dim) torch.float32 CUDA tensor,
            num_splits in [1, 256], head_dim in [1, 256]. Any strides (copied or zero-padded to a
            multiple of 4 in head_dim where the kernel cannot read it as is, as FlashAttention-3
            pads).
        lse_partial: (num_splits, batch, seqlen, num_heads) torch.float32 (natural log), any
            strides.
        out: optional (batch, seqlen, num_heads, head_dim) output, written in place and
            returned; its dtype must be out_dtype's. It must not overlap the inputs.
        out_dtype: torch.float32 (the default: out_partial's dtype, as in FlashAttention-3),
            torch.float16 or torch.bfloat16.

    Returns:
        (out, softmax_lse): out (batch, seqlen, num_heads, head_dim) in out_dtype; softmax_lse
        (batch, seqlen, num_heads) torch.float32, a transposed view of a (batch, num_heads,
        seqlen) tensor (FlashAttention-3's layout).

    Raises (before anything is launched): ValueError (a CPU tensor, mismatched devices or shapes,
    num_splits or head_dim out of range, out overlapping the inputs), TypeError (dtypes).
    """
    if not isinstance(out_partial, torch.Tensor) or out_partial.dim() != 5:
        shape = _shape_str(out_partial.shape) if isinstance(out_partial, torch.Tensor) else repr(out_partial)
        raise ValueError(f"flash3: out_partial has shape {shape}; expected a 5-d tensor (num_splits, batch, "
                         "seqlen, num_heads, head_dim)")
    if out_dtype is None:
        out_dtype = out_partial.dtype
    if out_dtype not in _COMBINE_OUT_DTYPES:
        raise TypeError(f"flash3: out_dtype is {out_dtype}; expected torch.float32, torch.float16 or "
                        "torch.bfloat16")
    _, b, s, h, d = out_partial.shape
    if out is None:
        out = torch.empty((b, s, h, d), dtype=out_dtype, device=out_partial.device)
    elif out.dtype != out_dtype:
        raise TypeError(f"flash3: out.dtype is {out.dtype}; expected {out_dtype} (out_dtype, which defaults to "
                        "out_partial.dtype, torch.float32)")
    # An out that shares memory with an input is refused here: the op declares out as its only
    # mutated argument, and torch's dispatcher must not see it alias another argument.
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if isinstance(t, torch.Tensor) and _byte_ranges_overlap(out, t):
            raise ValueError(f"flash3: out (data {out.data_ptr():#x}, shape {_shape_str(out.shape)}) overlaps {name} "
                             f"(data {t.data_ptr():#x}, shape {_shape_str(t.shape)}); expected out to have memory "
                             "of its own")
    softmax_lse = torch.empty((b, h, s), dtype=torch.float32, device=out_partial.device).transpose(1, 2)
    _combine(out_partial, lse_partial, out, softmax_lse)
    return out, softmax_lse


def _byte_ranges_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges spanned by two strided tensors intersect (conservative)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False

    def span(t):
        last = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 1)
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
