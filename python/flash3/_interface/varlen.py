# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash_attn_varlen_func (variable-length attention, differentiable; its paged serving form is
flash_attn_with_kvcache) and the checks of the varlen operators' fake implementations."""
from typing import Optional, Tuple, Union

import torch

from .common import (_INT32_MAX, _built_list, _check_entry, _check_heads_and_head_dims, _check_num_splits,
                     _check_qkv_device_dtype, _check_qkv_layout, _check_tensors_on_q_device, _dtype_str, _is_int,
                     _pack_gqa_arg, _require_device_of_q, _require_dtype_of_q, _require_tensor, _shape_str,
                     _softcap_arg, _varlen_fwd, _window_sides, _with_out)
from .kvcache import flash_attn_with_kvcache
from .. import _C

_VARLEN_LAYOUTS = {
    "q": "(total_q, num_heads_q, head_dim)",
    "k": "(total_k, num_heads_kv, head_dim)",
    "v": "(total_k, num_heads_kv, head_dim_v)",
}


def _check_int32_on_q_device(t, name, q, what):
    """A torch.int32 CUDA tensor on q's device (what: what its values are, for the dtype message)."""
    _require_tensor(name, t)
    if t.device.type != "cuda":
        raise ValueError(f"flash3: {name} must be a CUDA tensor on q's device ({q.device}), but {name} is on device "
                         f"'{t.device}' (move it with {name}.to(q.device))")
    _require_device_of_q(name, t, q)
    if t.dtype != torch.int32:
        raise TypeError(f"flash3: {name}.dtype is {_dtype_str(t.dtype)}; expected torch.int32 ({what}; use "
                        f"{name}.to(torch.int32))")


def _check_int32_vector(t, name, q, what):
    _check_int32_on_q_device(t, name, q, what)
    if t.dim() != 1:
        raise ValueError(f"flash3: {name} has {t.dim()} dimensions (shape {tuple(t.shape)}); expected a 1-d tensor "
                         f"({what})")
    if not t.is_contiguous():
        raise ValueError(f"flash3: {name}.stride(0) is {t.stride(0)}; expected a contiguous tensor "
                         f"(use {name}.contiguous())")


_CU_SEQLENS_Q = "num_sequences + 1 prefix sums of the query lengths"
_CU_SEQLENS_K = "num_sequences + 1 prefix sums of the key lengths"


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k):
    """The checks of varlen_fwd (csrc/varlen.cpp, check_varlen_inputs), in the same order."""
    _check_qkv_device_dtype(q, k, v)
    _check_qkv_layout(q, k, v, 3, _VARLEN_LAYOUTS, " (variable length: the sequences concatenated along dim 0)")
    checks = (
        ("v.shape[0] (total_k)", v.shape[0], k.shape[0], "k.shape[0]", ("k", k), ("v", v)),
        ("v.shape[1] (num_heads_kv)", v.shape[1], k.shape[1], "k.shape[1]", ("k", k), ("v", v)),
        ("k.shape[2] (head_dim)", k.shape[2], q.shape[2], "q.shape[2]", ("q", q), ("k", k)),
    )
    for what, got, want, ref, (n1, t1), (n2, t2) in checks:
        if got != want:
            raise ValueError(f"flash3: {what} is {got}; expected {want} to match {ref} ({n1} {tuple(t1.shape)}, "
                             f"{n2} {tuple(t2.shape)})")
    _check_heads_and_head_dims(q, k, v)
    _check_varlen_lengths(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)


def _check_varlen_lengths(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k):
    """_check_varlen_inputs' checks of the sequence lengths: cu_seqlens_*, seqused_*, max_seqlen_*."""
    _check_int32_vector(cu_seqlens_q, "cu_seqlens_q", q, _CU_SEQLENS_Q)
    _check_int32_vector(cu_seqlens_k, "cu_seqlens_k", q, _CU_SEQLENS_K)
    if cu_seqlens_q.numel() < 1:
        raise ValueError(f"flash3: cu_seqlens_q is empty (shape {tuple(cu_seqlens_q.shape)}); expected "
                         f"num_sequences + 1 >= 1 entries ({_CU_SEQLENS_Q}, starting with 0)")
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"flash3: cu_seqlens_k has {cu_seqlens_k.numel()} entries; expected {cu_seqlens_q.numel()} "
                         "to match cu_seqlens_q (both hold num_sequences + 1 prefix sums)")
    num_sequences = cu_seqlens_q.numel() - 1
    if num_sequences > _INT32_MAX:
        raise ValueError(f"flash3: cu_seqlens_q has {cu_seqlens_q.numel()} entries; expected at most 2147483648 "
                         "(num_sequences is an int32)")
    for name, t, what in (("seqused_q", seqused_q, "num_sequences counts of the real query tokens"),
                          ("seqused_k", seqused_k, "num_sequences counts of the real key tokens")):
        if t is None:
            continue
        _check_int32_vector(t, name, q, what)
        if t.numel() != num_sequences:
            raise ValueError(f"flash3: {name} has {t.numel()} entries; expected {num_sequences} "
                             "(num_sequences = cu_seqlens_q.numel() - 1)")
    for name, m, what in (("max_seqlen_q", max_seqlen_q, "query"), ("max_seqlen_k", max_seqlen_k, "key")):
        if not _is_int(m):
            raise TypeError(f"flash3: {name} is {m!r} ({type(m).__name__}); expected an int")
        if not 0 <= m <= _INT32_MAX:
            raise ValueError(f"flash3: {name} is {m}; expected a value in [0, 2147483647] (the length of the longest "
                             f"{what} sequence; 0: every sequence empty)")


def _check_varlen_backward_tensors(dout, q, v, out, softmax_lse, dlse):
    """The checks of varlen_bwd after varlen_fwd's (csrc/varlen.cpp,
    check_varlen_backward_tensors), in the same order."""
    _check_tensors_on_q_device((("dout", dout), ("out", out), ("softmax_lse", softmax_lse)), q)
    for name, t in (("dout", dout), ("out", out)):
        _require_dtype_of_q(name, t, q)
    if softmax_lse.dtype != torch.float32:
        raise TypeError(f"flash3: softmax_lse.dtype is {_dtype_str(softmax_lse.dtype)}; expected torch.float32")
    total_q, hq, dv = q.shape[0], q.shape[1], v.shape[2]
    if out.dim() != 3 or tuple(out.shape) != (total_q, hq, dv):
        raise ValueError(f"flash3: out has shape {_shape_str(out.shape)}; expected {_shape_str((total_q, hq, dv))} "
                         f"(total_q, num_heads_q, head_dim_v) from q {_shape_str(q.shape)} and v "
                         f"{_shape_str(v.shape)}")
    if tuple(dout.shape) != tuple(out.shape):
        raise ValueError(f"flash3: dout has shape {_shape_str(dout.shape)}; expected {_shape_str(out.shape)} "
                         "to match out")
    if softmax_lse.dim() != 2 or tuple(softmax_lse.shape) != (hq, total_q):
        raise ValueError(f"flash3: softmax_lse has shape {_shape_str(softmax_lse.shape)}; expected "
                         f"{_shape_str((hq, total_q))} (num_heads_q, total_q) from q {_shape_str(q.shape)}")
    d = q.shape[2]
    if isinstance(d, int) and isinstance(dv, int) and not _C.backward_is_built(q.dtype, d, dv):
        raise NotImplementedError(f"flash3: no backward kernel for {_dtype_str(q.dtype)} head_dim {d}, head_dim_v "
                                  f"{dv} in this build; backward kernels (head_dim, head_dim_v): "
                                  f"{_built_list(q.dtype, forward=False)}")
    if dlse is not None:
        _check_tensors_on_q_device((("dlse", dlse),), q)
        if tuple(dlse.shape) != tuple(softmax_lse.shape):
            raise ValueError(f"flash3: dlse has shape {_shape_str(dlse.shape)}; expected "
                             f"{_shape_str(softmax_lse.shape)} to match softmax_lse")


def _varlen_page_table(page_table, block_table, cu_seqlens_k, seqused_q):
    """flash_attn_varlen_func's paged cache (block_table: page_table's alias): the page table, or
    None; with one, cu_seqlens_k must be None and seqused_q is not supported."""
    if block_table is not None:
        if page_table is not None and page_table is not block_table:
            raise ValueError("flash3: page_table and block_table are both given; block_table is an alias of "
                             "page_table: pass one")
        page_table = block_table
    if page_table is not None:
        if cu_seqlens_k is not None:
            raise ValueError("flash3: cu_seqlens_k is given with page_table; a paged cache's lengths come from "
                             "seqused_k (pass cu_seqlens_k=None)")
        if seqused_q is not None:
            raise NotImplementedError("flash3: seqused_q with page_table is not supported; pass None")
    return page_table


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
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
    page_table: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention over a batch of sequences of different lengths, concatenated along dim 0
    (FlashAttention-3 interface, positional order included), differentiable in q, k, v.

    Serving form (the call vLLM makes): with page_table (block_table is accepted as its alias),
    k / v are paged KV caches (num_pages, page_size, num_heads_kv, head_dim[_v]), cu_seqlens_k is
    None and sequence b attends to its first seqused_k[b] cache rows (all of its pages' rows
    without seqused_k). That call is flash_attn_with_kvcache(q, k, v, cache_seqlens=seqused_k,
    page_table=..., cu_seqlens_q=..., max_seqlen_q=...) without new rows: forward only (the
    outputs never require grad), seqused_q unsupported.

    out= (keyword): the caller's output (total_q, num_heads_q, head_dim_v) in q's dtype, written
    in place and returned (the serving form writes it directly; the differentiable form copies
    into it, and then out does not carry the gradient: use the returned tensor for that).

    Arguments:
        q: (total_q, num_heads_q, head_dim), torch.float16 or torch.bfloat16, on a Hopper GPU.
        k: (total_k, num_heads_kv, head_dim), same dtype and device as q.
        v: (total_k, num_heads_kv, head_dim_v), same dtype and device as q.
            Head counts, head dims and strides as in flash_attn_func (last dimension stride 1).
        cu_seqlens_q: (num_sequences + 1,) torch.int32 on q's device, contiguous: the prefix sums
            of the query lengths; sequence b is q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]].
        cu_seqlens_k: (num_sequences + 1,) torch.int32, the same for k and v.
        max_seqlen_q, max_seqlen_k: the longest query / key sequence, in [0, 2**31 - 1] (0: every
            sequence empty, FlashAttention-3's empty batch). Used to
            normalise the window (a side >= max_seqlen - 1 cuts nothing); a value below a real
            length is not detected (see below).
        seqused_q, seqused_k: optional (num_sequences,) torch.int32 on q's device: only the first
            seqused[b] rows of sequence b are real (clamped on the device to the sequence's
            length); the others are neither read nor written.
        softmax_scale, causal, window_size, softcap, deterministic: as in flash_attn_func. Masks
            are aligned to the bottom-right corner of each sequence (offset = seqlen_k_b - seqlen_q_b,
            the used lengths when seqused is given); softcap (> 0: s -> softcap * tanh(s / softcap)
            before the mask, forward and backward) applies to every sequence.
        qv, q_descale, k_descale, v_descale: must be None (NotImplementedError otherwise).
        attention_chunk: must be 0 (NotImplementedError otherwise).
        pack_gqa: as in flash_attn_func (None: the heuristic, which packs every GQA/MQA varlen
            call; True / False; the results do not depend on it).
        num_splits: as in flash_attn_func (1: no split, 0: heuristic, n: at most n splits).
        sm_margin: FlashAttention-3 performance hint; accepted and ignored, as in flash_attn_func.
        return_attn_probs: also return softmax_lse (the probabilities are never returned).
        return_lse: keyword-only alias of return_attn_probs.

    Returns:
        out: (total_q, num_heads_q, head_dim_v), dtype of q; or (out, softmax_lse) when
        return_attn_probs or return_lse is set, with softmax_lse (num_heads_q, total_q)
        torch.float32 (natural-log logsumexp of each row of the scaled, capped when softcap > 0,
        scores). A query row that sees no key (e.g. of a sequence with no keys) gets out = 0 and
        softmax_lse = -inf. Rows that no sequence covers (beyond seqused, from cu_seqlens_q[-1]
        on) are not written: their contents are undefined (freshly allocated memory), as in
        FlashAttention-3.

    Backward (torch.ops.flash3.varlen_bwd): gradients flow to q, k, v from out and from
    softmax_lse, per sequence exactly as flash_attn_func's backward on that sequence. The rows of
    dq beyond seqused_q[b], of dk / dv beyond seqused_k[b], and rows no sequence covers are 0 (as
    in FlashAttention-3); the gradient arriving for the rows of out / softmax_lse that are not
    written is ignored. deterministic=True makes dq / dk / dv bitwise reproducible.

    Checked on the host, before anything is launched (the eager checks and the fake
    implementation's): everything flash_attn_func checks, for 3-d tensors; cu_seqlens_* and
    seqused_* are CUDA tensors on q's device, torch.int32, 1-d and contiguous; cu_seqlens_q and
    cu_seqlens_k have the same length (>= 1); seqused_* have cu_seqlens_q.numel() - 1 entries;
    max_seqlen_* in [0, 2**31 - 1]; softmax_scale (when given) and softcap finite and >= 0. Not
    checked (the contents of cu_seqlens_* / seqused_* stay on the device: no synchronisation):
    that cu_seqlens_* start at 0, increase and end at most at total_q / total_k, that
    max_seqlen_* are at least the real lengths, that seqused_* are at most the lengths. The
    kernels clamp what they read, so nothing outside the tensors is ever read or written, but
    such inputs give meaningless results.

    Raises: as flash_attn_func (ValueError / TypeError / NotImplementedError / RuntimeError);
    backward() raises NotImplementedError when this build has no backward kernel for the head dims
    (flash3.backward_is_built).
    """
    _check_entry(qv, q_descale, k_descale, v_descale, attention_chunk, sm_margin)
    page_table = _varlen_page_table(page_table, block_table, cu_seqlens_k, seqused_q)
    if page_table is not None:
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqused_k, page_table=page_table,
                                       cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                       softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                       softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                                       return_softmax_lse=return_attn_probs or return_lse, out=out)
    softcap = _softcap_arg(softcap)
    window_left, window_right = _window_sides(window_size)
    result, lse = _varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                              softmax_scale, causal, window_left, window_right, softcap, deterministic,
                              _pack_gqa_arg(pack_gqa), _check_num_splits(num_splits))
    return _with_out(result, lse, out, "(total_q, num_heads_q, head_dim_v)", return_attn_probs or return_lse)
