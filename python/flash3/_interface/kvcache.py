# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""KV-cache attention: flash_attn_with_kvcache (the decoding step, forward only),
get_scheduler_metadata (its launch plan), their argument steps, and the outputs of the
fwd_kvcache operators' fake implementations."""
from typing import Optional, Tuple, Union

import torch

from .common import (_INT32_MAX, _check_attention_chunk, _check_entry, _check_num_splits, _check_sm_margin,
                     _dtype_str, _forward_plan, _fwd_kvcache, _fwd_kvcache_out, _is_int, _pack_gqa_arg, _shape_str,
                     _softcap_arg, _window_sides)
from .. import _C

# The layouts of torch.ops.flash3.fwd_kvcache's tensors (csrc/kvcache.cpp, check_kvcache_inputs,
# which checks them, in the same order and with the same messages, when the operator runs).
_KVCACHE_LAYOUTS = {
    "q": "(batch, seqlen_q, num_heads_q, head_dim)",
    "page_table": "(batch, max_num_pages_per_seq)",
    "k_cache": "(batch_cache, seqlen_cache, num_heads_kv, head_dim)",
    "v_cache": "(batch_cache, seqlen_cache, num_heads_kv, head_dim_v)",
    "k": "(batch, seqlen_new, num_heads_kv, head_dim)",
    "v": "(batch, seqlen_new, num_heads_kv, head_dim_v)",
}


def _kvcache_fake_outputs(q, v_cache, cu_seqlens_q):
    """fwd_kvcache's outputs (the C++ op checks every argument when it runs): out follows q's rows
    and heads with v_cache's head dim; softmax_lse is (num_heads_q, total_q) with cu_seqlens_q,
    else a (batch, num_heads_q, seqlen_q) view of a contiguous (num_heads_q, batch, seqlen_q)
    tensor."""
    dv, hq = v_cache.shape[3], q.shape[-2]
    if cu_seqlens_q is not None:
        return q.new_empty((q.shape[0], hq, dv)), q.new_empty((hq, q.shape[0]), dtype=torch.float32)
    b, sq = q.shape[0], q.shape[1]
    return q.new_empty((b, sq, hq, dv)), q.new_empty((hq, b, sq), dtype=torch.float32).permute(1, 0, 2)


def _cache_seqlens_tensor(cache_seqlens, q, batch, k_cache, page_table, k, cu_seqlens_k_new):
    """An int cache_seqlens (every sequence holds that many rows) as FlashAttention-3 makes it: a
    (batch,) torch.int32 tensor on q's device. The host knows its value, so the append's rows must
    fit: cache_seqlens + seqlen_new <= the capacity (seqlen_cache, or max_num_pages_per_seq *
    page_size), where the kernels would drop the rows past it (a tensor cache_seqlens is the
    caller's contract there: rows past the capacity are not written)."""
    if not _is_int(cache_seqlens):
        raise TypeError(f"flash3: cache_seqlens is {cache_seqlens!r} ({type(cache_seqlens).__name__}); expected "
                        "None, an int or a (batch,) torch.int32 tensor")
    cache_seqlens = int(cache_seqlens)
    if not 0 <= cache_seqlens <= _INT32_MAX:
        raise ValueError(f"flash3: cache_seqlens is {cache_seqlens}; expected an int in [0, 2147483647] (the number "
                         "of rows each cache entry holds) or a (batch,) torch.int32 tensor")
    if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4:
        paged = isinstance(page_table, torch.Tensor) and page_table.dim() == 2
        capacity = page_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        new = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 and cu_seqlens_k_new is None else 0
        if cache_seqlens + new > capacity:
            raise ValueError(f"flash3: cache_seqlens is {cache_seqlens} with {new} new rows; expected cache_seqlens + "
                             f"seqlen_new <= {capacity}, the rows a cache entry holds "
                             f"({'max_num_pages_per_seq * page_size' if paged else 'k_cache.shape[1]'}): the new rows "
                             "would not fit")
    return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)


def _scheduler_metadata_plan(scheduler_metadata):
    """(num_splits, pack_gqa) from get_scheduler_metadata's result: a CPU torch.int32 tensor of 2
    values (or a tuple / list of 2 ints, e.g. its .tolist(), which torch.compile(fullgraph=True)
    can trace without reading a tensor)."""
    md = scheduler_metadata
    if isinstance(md, torch.Tensor):
        if md.device.type != "cpu":
            raise ValueError(f"flash3: scheduler_metadata is on device '{md.device}'; expected the CPU torch.int32 "
                             "tensor [num_splits, pack_gqa] that flash3.get_scheduler_metadata returns (flash3's "
                             "plan is decided on the host)")
        if md.dtype != torch.int32:
            raise TypeError(f"flash3: scheduler_metadata.dtype is {_dtype_str(md.dtype)}; expected torch.int32 (the "
                            "[num_splits, pack_gqa] tensor of flash3.get_scheduler_metadata)")
        if tuple(md.shape) != (2,):
            raise ValueError(f"flash3: scheduler_metadata has shape {_shape_str(md.shape)}; expected (2,) "
                             "([num_splits, pack_gqa], as flash3.get_scheduler_metadata returns it)")
        values = md.tolist()
    elif isinstance(md, (tuple, list)) and len(md) == 2 and _is_int(md[0]) and _is_int(md[1]):
        values = [md[0], md[1]]
    else:
        raise TypeError(f"flash3: scheduler_metadata is {type(md).__name__}; expected None or the CPU torch.int32 "
                        "tensor [num_splits, pack_gqa] of flash3.get_scheduler_metadata (or a tuple of those two "
                        "ints)")
    num_splits, pack_gqa = values
    if not (1 <= num_splits <= 256 and pack_gqa in (0, 1)):
        raise ValueError(f"flash3: scheduler_metadata holds [num_splits, pack_gqa] = [{num_splits}, {pack_gqa}]; "
                         "expected num_splits in [1, 256] and pack_gqa 0 or 1 (use flash3.get_scheduler_metadata)")
    return num_splits, pack_gqa


def _kvcache_max_seqlen_q(cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q):
    """flash_attn_with_kvcache's variable-length arguments: refused by a build without
    FLASH3_SERVING_WIP; max_seqlen_q as the operator takes it (an int with cu_seqlens_q, else None)."""
    varlen_q = cu_seqlens_q is not None
    if (varlen_q or cu_seqlens_k_new is not None) and not _C.serving_wip():
        name = "cu_seqlens_q (variable-length queries" if varlen_q else "cu_seqlens_k_new (variable-length new rows"
        raise NotImplementedError(f"flash3: {name} with a KV cache) is not supported by this build: it needs "
                                  "libflash3 built with FLASH3_SERVING_WIP, whose kernels have not run on a GPU yet")
    if varlen_q and max_seqlen_q is not None and not _is_int(max_seqlen_q):
        raise TypeError(f"flash3: max_seqlen_q is {max_seqlen_q!r} ({type(max_seqlen_q).__name__}); expected an int")
    return int(max_seqlen_q) if varlen_q and max_seqlen_q is not None else None


def _kvcache_cache_seqlens(cache_seqlens, q, k_cache, page_table, k, cu_seqlens_q, cu_seqlens_k_new):
    """cache_seqlens as the operator takes it: None or a tensor as given, an int as the tensor
    _cache_seqlens_tensor makes (batch: the sequences of cu_seqlens_q, else q's batch)."""
    if cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens
    batch = cu_seqlens_q.numel() - 1 if isinstance(cu_seqlens_q, torch.Tensor) else q.shape[0]
    return _cache_seqlens_tensor(cache_seqlens, q, batch, k_cache, page_table, k, cu_seqlens_k_new)


def _kvcache_plan(scheduler_metadata, num_splits, pack_gqa):
    """(num_splits, pack_gqa) as the operator takes them: scheduler_metadata's plan when given."""
    if scheduler_metadata is not None:
        return _scheduler_metadata_plan(scheduler_metadata)
    return _check_num_splits(num_splits), _pack_gqa_arg(pack_gqa)


def _run_kvcache(args, out, return_softmax_lse):
    """torch.ops.flash3.fwd_kvcache on the operator's arguments, or fwd_kvcache_out into out."""
    if out is None:
        out, lse = _fwd_kvcache(*args)
    else:  # written in place (out is checked by the operator)
        lse = _fwd_kvcache_out(*args, out=out)
    if return_softmax_lse:
        return out, lse
    return out


def flash_attn_with_kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None, qv: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None, rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None, cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None, page_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k_new: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None, rotary_seqlens: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None, softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1), attention_chunk: int = 0, softcap: float = 0.0,
    rotary_interleaved: bool = True, scheduler_metadata: Optional[Union[torch.Tensor, Tuple[int, int]]] = None,
    num_splits: int = 0, pack_gqa: Optional[bool] = None, sm_margin: int = 0, return_softmax_lse: bool = False,
    *, out: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of q over a KV cache, after appending new keys / values to it (FlashAttention-3's
    flash_attn_with_kvcache, positional order included): the incremental-decoding step. Forward
    only.

    Per sequence b of the batch:
      1. when k / v are given, their seqlen_new rows are written into the cache *in place*, at rows
         [cache_seqlens[b], cache_seqlens[b] + seqlen_new) of cache entry cache_batch_idx[b], or of
         sequence b's pages with a page_table (rows at or past seqlen_cache, or the paged capacity,
         are dropped: the cache must have room for them); with rotary_cos / rotary_sin the keys are
         rotated first (the values never are);
      2. q[b] (rotated too when rotary tables are given) attends to rows
         [cache_leftpad[b], cache_seqlens[b] + seqlen_new) of that cache entry, i.e.
         seqlen_k = cache_seqlens[b] - cache_leftpad[b] + seqlen_new keys. Masks are aligned to
         the bottom-right corner of each sequence, as in flash_attn_func: query i sees key j
         (counted from the leftpad) iff j <= i + seqlen_k - seqlen_q under causal, and
         i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right with
         window_size = (left, right). A query that sees no key gets out = 0 and
         softmax_lse = -inf.

    Arguments:
        q: (batch, seqlen_q, num_heads_q, head_dim), torch.float16 or torch.bfloat16, on a Hopper
            GPU; last dimension contiguous (a q whose (batch, seqlen_q) rows are not one stride
            apart, e.g. a slice along seqlen, is copied first). Not modified.
        k_cache: (batch_cache, seqlen_cache, num_heads_kv, head_dim) without page_table, or
            (num_blocks, page_block_size, num_heads_kv, head_dim) with one (a paged KV cache: a
            pool of pages of any page_block_size >= 1, e.g. 1, 16, 64, 256), q's dtype and
            device, last dimension contiguous and the rows of all entries (pages) one stride
            apart (k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1): e.g. contiguous, or
            a slice along the heads). Written in place when k is given.
        v_cache: (batch_cache, seqlen_cache, num_heads_kv, head_dim_v), or
            (num_blocks, page_block_size, num_heads_kv, head_dim_v) with page_table, likewise.
            (head_dim, head_dim_v) must be one this build has forward kernels for
            (flash3.forward_is_built); num_heads_q a multiple of num_heads_kv (GQA / MQA).
        k, v: optional new rows (both or neither), (batch, seqlen_new, num_heads_kv, head_dim) /
            (batch, seqlen_new, num_heads_kv, head_dim_v), q's dtype, last dimension
            contiguous; need cache_seqlens. seqlen_new may be 0, at most seqlen_cache. They must
            not share memory with the caches.
        qv: FlashAttention-3's extra query for head_dim_v (MLA); not supported yet
            (NotImplementedError unless None).
        rotary_cos, rotary_sin: optional rotary embedding tables (both or neither; need k and v),
            (seqlen_ro, rotary_dim / 2) each, q's dtype, last dimension contiguous, rotary_dim
            even and <= head_dim (any even rotary_dim: FlashAttention-3 wants a multiple of 16),
            seqlen_ro >= seqlen_cache (with page_table: >= max_num_blocks_per_seq *
            page_block_size). New key i of sequence b is rotated to position pos_b + i,
            with pos_b = rotary_seqlens[b] if given, else cache_seqlens[b]; query i is rotated to
            position pos_b + i when causal or local (a window that cuts something), else to pos_b
            (all queries at the first new position), as in FlashAttention-3. Per pair (x0, x1)
            at a position with table entries (c, s), in fp32: x0' = fma(x0, c, -(x1 s)),
            x1' = fma(x0, s, x1 c), rounded to the dtype; dims >= rotary_dim are unchanged.
        cache_seqlens: the number of rows each cache entry holds before the append: an int (every
            sequence) or a (batch,) torch.int32 tensor on q's device (contiguous). None: every
            entry holds seqlen_cache rows (with page_table: max_num_blocks_per_seq *
            page_block_size; k / v then cannot be given).
        cache_batch_idx: optional (batch,) torch.int32 on q's device: the cache entry of each
            sequence (default: entry b, which needs batch_cache >= batch). With k / v, entries
            should be distinct (which of several sequences' rows a shared entry keeps is
            unspecified).
        cache_leftpad: optional (batch,) torch.int32 on q's device: the first row of each entry
            that attention reads (left padding; default 0). The append position ignores it.
        page_table: optional (batch, max_num_blocks_per_seq) torch.int32 on q's device, each row
            contiguous (stride(1) == 1; rows may be further apart, e.g. a slice of a wider
            table): a paged KV cache, as in FlashAttention-3. Row r of sequence b lives at row
            r % page_block_size of page page_table[b, r // page_block_size] of k_cache / v_cache
            (sequences may share pages, e.g. a common prefix, but not rows the call appends). A
            sequence then holds at most max_num_blocks_per_seq * page_block_size rows, the role
            seqlen_cache has without pages: cache_seqlens=None means every sequence is that
            full, and seqlen_new and seqlen_ro are checked against it. Not with cache_batch_idx
            or cache_leftpad, nor with softcap > 0 (NotImplementedError). The page indices a
            call uses (those of rows below cache_seqlens[b] + seqlen_new) must lie in
            [0, num_blocks): the caller's contract, not checked (an index out of range reads or
            writes outside the pool). Read on the device only.
        cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q (meaningful only with cu_seqlens_q):
            variable-length q / new rows are not supported yet (NotImplementedError unless None).
        rotary_seqlens: optional (batch,) torch.int32 on q's device: the rotary position of the
            first new row (default cache_seqlens); ignored without rotary tables (as in
            FlashAttention-3).
        q_descale, k_descale, v_descale: FP8 descaling; not supported yet (NotImplementedError
            unless None).
        softmax_scale, causal, window_size, softcap: as in flash_attn_func (None scale:
            1 / sqrt(head_dim); causal keeps window_size's left side: local attention).
        attention_chunk: must be 0 (NotImplementedError otherwise).
        rotary_interleaved: True: rotary pairs are dims (2j, 2j + 1) (GPT-J); False: (j,
            j + rotary_dim / 2) (GPT-NeoX).
        scheduler_metadata: None, or the plan of get_scheduler_metadata (a CPU torch.int32 tensor
            [num_splits, pack_gqa], or a tuple of those two ints): used instead of num_splits and
            pack_gqa, so that every call (a CUDA graph's replays included) runs the same plan.
            flash3 decides its plan on the host from the shapes, so this is never needed for
            CUDA-graph capture; it only pins the plan. Under torch.compile(fullgraph=True) pass
            the tuple (reading a tensor's values would break the graph).
        num_splits: split-KV: 0 (the default, as FlashAttention-3 here): a heuristic decides
            (it splits when there are few query tiles, e.g. decoding); 1: no split; n in
            [2, 256]: at most n splits. Only the speed depends on it (and fp32 rounding).
        pack_gqa: None (heuristic), True or False; only the speed depends on it.
        sm_margin: must be 0 (NotImplementedError otherwise).
        return_softmax_lse: also return softmax_lse.

    The int32 tensors are read on the device only (no synchronisation; the call can be captured
    in a CUDA graph and replayed with new values in them). Their values are the caller's
    contract: cache_batch_idx outside [0, batch_cache), cache_seqlens / cache_leftpad outside
    [0, seqlen_cache] are clamped on the device (nothing outside the tensors is read or written,
    but the results are meaningless), cache_leftpad should not exceed cache_seqlens; page_table
    entries are not checked at all (see page_table).

    Returns:
        out: (batch, seqlen_q, num_heads_q, head_dim_v), q's dtype, contiguous; or, with
        return_softmax_lse, (out, softmax_lse): softmax_lse (batch, num_heads_q, seqlen_q)
        torch.float32, the natural-log logsumexp of each row of the scaled (and capped) scores,
        a permuted view of a contiguous (num_heads_q, batch, seqlen_q) tensor. (FlashAttention-3
        returns two more internal tensors after softmax_lse; ``out, lse, *rest = ...`` works
        with both.)

    No backward: the outputs never require grad (gradients do not flow to q, the caches or
    k / v), as FlashAttention-3's flash_attn_with_kvcache has no backward either. The caches'
    version counters are bumped when k / v are written.

    Raises (before anything is launched or written): ValueError (CPU tensors, mismatched
    devices or shapes, strides, k without v, rotary tables without k, a page_table that is not
    2-d, has not batch rows or has a non-unit stride(1), a bad scheduler_metadata,
    softmax_scale / softcap out of range), TypeError (dtypes, int arrays and page_table that
    are not torch.int32, pack_gqa / num_splits types), NotImplementedError (the arguments above
    that flash3 does not support yet; page_table with cache_batch_idx, cache_leftpad or softcap
    > 0; softcap > 0 in a build without the softcap kernels; page_table in a build without the
    forward's packgqa unit for the dtype and head dims), RuntimeError (a CUDA error).
    """
    _check_entry(qv, q_descale, k_descale, v_descale, attention_chunk, sm_margin)
    softcap = _softcap_arg(softcap)
    max_seqlen_q = _kvcache_max_seqlen_q(cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q)
    cache_seqlens = _kvcache_cache_seqlens(cache_seqlens, q, k_cache, page_table, k, cu_seqlens_q, cu_seqlens_k_new)
    window_left, window_right = _window_sides(window_size)
    num_splits, pack = _kvcache_plan(scheduler_metadata, num_splits, pack_gqa)
    return _run_kvcache((q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                         cache_leftpad, page_table, rotary_seqlens, softmax_scale, causal, window_left, window_right,
                         softcap, rotary_interleaved, num_splits, pack, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q),
                        out, return_softmax_lse)


def get_scheduler_metadata(
    batch_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_heads_q: int,
    num_heads_kv: int,
    headdim: int,
    cache_seqlens: Optional[torch.Tensor] = None,
    qkv_dtype: torch.dtype = torch.bfloat16,
    headdim_v: Optional[int] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_size: Optional[int] = None,
    max_seqlen_k_new: int = 0,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    has_softcap: bool = False,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    sm_margin: int = 0,
) -> torch.Tensor:
    """The launch plan of flash_attn_with_kvcache for these shapes (FlashAttention-3's
    get_scheduler_metadata, same arguments), to pass back as its scheduler_metadata.

    flash3 decides its plan on the host from the shapes and options only (the number of KV
    splits and whether the query heads are packed, flash3::forward_plan on the current device,
    or cache_seqlens' device when that is a CUDA tensor), never from the values of cache_seqlens
    / cache_leftpad, which are accepted and ignored. The plan is made for keys of length
    max_seqlen_k, the cache's capacity, exactly as flash_attn_with_kvcache plans a call without
    scheduler_metadata (its k_cache.shape[1], or max_num_pages_per_seq * page_size): pass that
    value and the two decide the same; max_seqlen_k_new (the new rows, which fit in the capacity)
    does not change it.

    Arguments: batch_size, max_seqlen_q, max_seqlen_k (the cache size, seqlen_cache; for a paged
    cache its capacity per sequence, max_num_blocks_per_seq * page_size, as FlashAttention-3
    takes it), num_heads_q, num_heads_kv, headdim, headdim_v (default headdim): the shapes of
    the flash_attn_with_kvcache calls; qkv_dtype torch.bfloat16 or torch.float16;
    max_seqlen_k_new: seqlen_new of k / v; causal, window_size, has_softcap (softcap > 0),
    num_splits (0: heuristic, 1: none, n: at most n), pack_gqa (None: heuristic): as in those
    calls. page_size: None (contiguous caches) or the page_block_size of a paged cache (an int
    >= 1); accepted and checked, but the plan does not depend on it (a paged call of the same
    shapes and capacity takes the same plan as a contiguous one). cu_seqlens_q and
    cu_seqlens_k_new (varlen calls: max_seqlen_q is then the longest query sequence) and
    sm_margin are accepted and change nothing; attention_chunk != 0 is not supported yet
    (NotImplementedError).

    Returns:
        A CPU torch.int32 tensor [num_splits, pack_gqa] (num_splits >= 1: 1 means no split;
        pack_gqa 0 or 1). Unlike FlashAttention-3's (a device tensor), it carries no per-batch
        data: any call with the same shapes and options may use it.

    Raises: NotImplementedError (above), TypeError (non-int sizes or page_size, a dtype other
    than torch.float16 / torch.bfloat16, pack_gqa / num_splits types), ValueError (sizes < 1 or
    beyond int32, page_size < 1, bad num_splits, shapes or options flash3::forward_plan
    rejects), RuntimeError (no usable CUDA device).
    """
    _check_page_size(page_size)
    _check_attention_chunk(attention_chunk)
    _check_sm_margin(sm_margin)
    if headdim_v is None:
        headdim_v = headdim
    sizes = (("batch_size", batch_size, 1), ("max_seqlen_q", max_seqlen_q, 1), ("max_seqlen_k", max_seqlen_k, 0),
             ("num_heads_q", num_heads_q, 1), ("num_heads_kv", num_heads_kv, 1), ("headdim", headdim, 1),
             ("headdim_v", headdim_v, 1), ("max_seqlen_k_new", max_seqlen_k_new, 0))
    for name, x, lo in sizes:
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"flash3: {name} is {x!r} ({type(x).__name__}); expected an int")
        if not lo <= x <= _INT32_MAX:
            raise ValueError(f"flash3: {name} is {x}; expected an int in [{lo}, 2147483647]")
    # The call plans for its cache's capacity (flash3::forward_kvcache), which max_seqlen_k is:
    # the same decision, whatever max_seqlen_k_new (the new rows fit in the capacity).
    seqlen_k = max_seqlen_k
    window_left, window_right = _window_sides(window_size)
    num_splits = _check_num_splits(num_splits)
    pack = _pack_gqa_arg(pack_gqa)
    args = (qkv_dtype, batch_size, max_seqlen_q, seqlen_k, num_heads_q, num_heads_kv, headdim, headdim_v,
            bool(causal), window_left, window_right, 1.0 if has_softcap else 0.0, num_splits, pack)
    if isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.device.type == "cuda":
        with torch.cuda.device(cache_seqlens.device):
            plan = _forward_plan(*args)
    else:
        plan = _forward_plan(*args)
    return torch.tensor(plan, dtype=torch.int32)


def _check_page_size(page_size):
    """get_scheduler_metadata's page_size: None (contiguous caches) or an int in [1, INT32_MAX]; a
    paged cache's plan depends on the shapes only, not on the page size."""
    if page_size is not None:
        if isinstance(page_size, bool) or not isinstance(page_size, int):
            raise TypeError(f"flash3: page_size is {page_size!r} ({type(page_size).__name__}); expected None or an "
                            "int (the page_block_size of a paged cache)")
        if not 1 <= page_size <= _INT32_MAX:
            raise ValueError(f"flash3: page_size is {page_size}; expected None or an int in [1, 2147483647] (the "
                             "page_block_size of a paged cache)")
