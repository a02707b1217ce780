// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Device helpers of the varlen prep kernels (fwd/varlen_prep.h,
// bwd/varlen_prep.h): each sequence's rows, its tensor maps and the tile maps,
// all computed on the device from cu_seqlens / seqused, so a varlen call needs
// no host synchronisation and stays capturable in a CUDA graph.
//
// Tensor maps: the host-built map of the whole tensor with its base address
// moved to the sequence's first row and its row extent cut to the sequence's
// length, so TMA zero-fills loads and drops stores past the sequence exactly
// as it does past a fixed-length tensor: no tile reads a neighbour's rows or
// writes into them.
#pragma once
#include <cub/block/block_scan.cuh>
#include <cute/tensor.hpp>

#include "common/build_options.h"
#include "common/seqlen.h"

namespace flash3 {

constexpr int kVarlenPrepThreads = 256;

// One tensor of the batch: its base and its row / head strides (elements).
struct VarlenTensor {
  const void* base;
  int64_t row_stride, head_stride;
};

// The batch's sequence boundaries (device arrays; seqused may be null).
// A null cu_seqlens_k is the KV-cache layout (forward_kvcache): K / V in
// k_entries cache entries of k_rows_per_batch rows (paged: the page table's
// rows, each holding k_rows_per_batch = max_pages * page_size rows), sequence
// b reading entry k_batch_idx[b] (b when null) from row k_leftpad[b] (0) to
// seqused_k[b] (the cache fill; the whole entry when null) + k_new (the rows
// appended by this call). Its q rows: [b * fixed_seqlen_q, + fixed_seqlen_q)
// with a null cu_seqlens_q, else cu_seqlens_q's (varlen queries).
struct VarlenSeqs {
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  const int* seqused_q;
  const int* seqused_k;
  int num_seqs, total_q, total_k;
  int fixed_seqlen_q = 0;
  int k_rows_per_batch = 0;
#if FLASH3_SERVING_WIP
  int k_entries = 0;
#endif
  const int* k_batch_idx = nullptr;
  const int* k_leftpad = nullptr;
  int k_new = 0;                   // new rows of every sequence, or
#if FLASH3_SERVING_WIP
  const int* cu_k_new = nullptr;   // per sequence: prefix sums over total_k_new rows
  int total_k_new = 0;
#endif
};

#if FLASH3_SERVING_WIP
// A KV-cache sequence's keys: entry `entry`, rows [lo, lo + seqlen_k) of it.
// Clamped: the entry into [0, k_entries), the leftpad and the fill into [0,
// k_rows_per_batch], so no value on the device leads outside the cache.
struct KVCacheSeq {
  int entry, lo, seqlen_k;
};
CUTLASS_DEVICE KVCacheSeq kv_cache_seq(VarlenSeqs const& a, int b) {
  const int rows = a.k_rows_per_batch;
  KVCacheSeq s;
  s.entry = a.k_batch_idx != nullptr ? min(max(a.k_batch_idx[b], 0), max(a.k_entries - 1, 0)) : b;
  s.lo = a.k_leftpad != nullptr ? min(max(a.k_leftpad[b], 0), rows) : 0;
  int k_new = a.k_new;
  if (a.cu_k_new != nullptr) {  // clamped into [0, total_k_new] as cu_seqlens are
    const int lo = min(max(a.cu_k_new[b], 0), a.total_k_new);
    k_new = min(max(a.cu_k_new[b + 1], lo), a.total_k_new) - lo;
  }
  // (int64: a fill near INT32_MAX plus the appended rows must not wrap.)
  const int64_t fill = a.seqused_k != nullptr ? int64_t(max(a.seqused_k[b], 0)) + k_new : int64_t(rows);
  s.seqlen_k = int(min(max(fill, int64_t(s.lo)), int64_t(rows))) - s.lo;
  return s;
}
#endif

// Sequence b's rows, clamped: offsets into [0, total], a decreasing pair gives
// length 0, seqused into [0, allocated length]; KV cache: the entry index
// into the cache, the leftpad and the fill into [0, k_rows_per_batch].
CUTLASS_DEVICE SeqlenInfo varlen_seq_info(VarlenSeqs const& a, int b) {
  auto span = [](const int* cu, const int* used, int b, int total, int* offset, int* len) {
    const int lo = min(max(cu[b], 0), total);
    const int hi = min(max(cu[b + 1], lo), total);
    *offset = lo;
    *len = used != nullptr ? min(max(used[b], 0), hi - lo) : hi - lo;
  };
  SeqlenInfo s;
  if (a.cu_seqlens_q != nullptr) {
    span(a.cu_seqlens_q, a.seqused_q, b, a.total_q, &s.offset_q, &s.seqlen_q);
  } else {
    s.offset_q = b * a.fixed_seqlen_q;
    s.seqlen_q = a.fixed_seqlen_q;
  }
  if (a.cu_seqlens_k != nullptr) {
    span(a.cu_seqlens_k, a.seqused_k, b, a.total_k, &s.offset_k, &s.seqlen_k);
  } else {
#if FLASH3_SERVING_WIP
    // KV cache: offset_k is unused (a cache's rows may pass 2^31; kv_row0).
    s.seqlen_k = kv_cache_seq(a, b).seqlen_k;
#else
    const int rows = a.k_rows_per_batch;
    const int entries = rows > 0 ? a.total_k / rows : 0;
    const int entry = a.k_batch_idx != nullptr ? min(max(a.k_batch_idx[b], 0), max(entries - 1, 0)) : b;
    const int lo = a.k_leftpad != nullptr ? min(max(a.k_leftpad[b], 0), rows) : 0;
    // (int64: a fill near INT32_MAX plus the appended rows must not wrap.)
    const int64_t fill = a.seqused_k != nullptr ? int64_t(max(a.seqused_k[b], 0)) + a.k_new : int64_t(rows);
    const int hi = int(min(max(fill, int64_t(lo)), int64_t(rows)));
    s.offset_k = entry * rows + lo;
    s.seqlen_k = hi - lo;
#endif
  }
  return s;
}

#if FLASH3_SERVING_WIP
// The first key row of sequence b in the k / v tensors, in int64.
CUTLASS_DEVICE int64_t kv_row0(VarlenSeqs const& a, SeqlenInfo const& si, int b) {
  if (a.cu_seqlens_k != nullptr) return si.offset_k;
  const KVCacheSeq e = kv_cache_seq(a, b);
  return int64_t(e.entry) * a.k_rows_per_batch + e.lo;
}
#else
CUTLASS_DEVICE int64_t kv_row0(VarlenSeqs const&, SeqlenInfo const& si, int) { return si.offset_k; }
#endif

// Row `row` of tensor t.
template <class Element>
#if FLASH3_SERVING_WIP
CUTLASS_DEVICE const Element* row_ptr(VarlenTensor const& t, int64_t row) {
#else
CUTLASS_DEVICE const Element* row_ptr(VarlenTensor const& t, int row) {
#endif
  return static_cast<const Element*>(t.base) + int64_t(row) * t.row_stride;
}

// Writes the host-built map `tma` of t, a (rows, cols, heads, 1) tensor, into
// `dst`, moved to `base` with `rows` rows (>= 1: tensor maps need non-empty
// extents; an empty sequence's map is never used). The copy and the
// tensormap.replace edits are generic-proxy writes; the caller then issues a
// tensor-map proxy release fence and the attention kernel acquires before use.
template <class Element, class Tma, class ShapeT>
CUTLASS_DEVICE void write_seq_desc(cute::TmaDescriptor* dst, Tma const& tma, const Element* base, int rows,
                                   ShapeT whole_shape, VarlenTensor const& t) {
  const int64_t row_stride = t.row_stride, head_stride = t.head_stride;
  using namespace cute;
  const uint4* src = reinterpret_cast<const uint4*>(tma.get_tma_descriptor());
  uint4* out = reinterpret_cast<uint4*>(dst);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < int(sizeof(TmaDescriptor) / sizeof(uint4)); ++i) out[i] = src[i];
  auto shape = make_shape(int32_t(rows > 0 ? rows : 1), get<1>(whole_shape), get<2>(whole_shape), int32_t(1));
  Tensor g = make_tensor(make_gmem_ptr(base), shape, make_stride(row_stride, _1{}, head_stride, row_stride));
  cute::array<uint32_t, 5> dims = {1, 1, 1, 1, 1};
  cute::array<uint64_t, 5> strides = {0, 0, 0, 0, 0};
  cute::detail::fill_tma_gmem_shape_stride(tma, g, dims, strides);
  tma_descriptor_replace_addr_in_global_mem(dst, base);
  const uint64_t d = reinterpret_cast<uint64_t>(dst);
  // The ordinal is an immediate operand: one instruction per dimension.
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 0, %1;" ::"l"(d), "r"(dims[0]) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 1, %1;" ::"l"(d), "r"(dims[1]) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 2, %1;" ::"l"(d), "r"(dims[2]) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 3, %1;" ::"l"(d), "r"(dims[3]) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 4, %1;" ::"l"(d), "r"(dims[4]) : "memory");
}

// One thread per tensor map (idx = sequence * kNumVarlenDesc + slot): slot
// kDescQ gets q's map, kDescK k's, kDescV v's and the fourth slot x's (out
// in the forward, dO in the backward: rows of q's sequence). Each map is
// released to the tensor-map proxy; the attention kernels acquire. Element is
// q / k / v's type, ElementX x's (the forward's output type).
template <class Element, class ElementX, class TmaQ, class TmaK, class TmaV, class TmaX, class Shape>
CUTLASS_DEVICE void write_varlen_map(int64_t idx, VarlenSeqs const& seqs, cute::TmaDescriptor* desc, TmaQ const& tma_q,
                                     Shape const& shape_q, VarlenTensor const& q, TmaK const& tma_k,
                                     Shape const& shape_k, VarlenTensor const& k, TmaV const& tma_v,
                                     Shape const& shape_v, VarlenTensor const& v, TmaX const& tma_x,
                                     Shape const& shape_x, VarlenTensor const& x) {
  if (idx >= int64_t(seqs.num_seqs) * kNumVarlenDesc) return;
  const int b = int(idx / kNumVarlenDesc), which = int(idx % kNumVarlenDesc);
  const SeqlenInfo si = varlen_seq_info(seqs, b);
  cute::TmaDescriptor* dst = desc + idx;
  switch (which) {
    case kDescQ:
      write_seq_desc(dst, tma_q, row_ptr<Element>(q, si.offset_q), si.seqlen_q, shape_q, q);
      break;
    case kDescK:
      write_seq_desc(dst, tma_k, row_ptr<Element>(k, kv_row0(seqs, si, b)), si.seqlen_k, shape_k, k);
      break;
    case kDescV:
      write_seq_desc(dst, tma_v, row_ptr<Element>(v, kv_row0(seqs, si, b)), si.seqlen_k, shape_v, v);
      break;
    default:
      write_seq_desc(dst, tma_x, row_ptr<ElementX>(x, si.offset_q), si.seqlen_q, shape_x, x);
      break;
  }
  cute::tma_descriptor_fence_release();
}

// CTA-wide (kVarlenPrepThreads threads): the tile map of one pass. Sequence
// b gets ceil(len_b / tile) consecutive entries at the prefix sum of the
// counts before it (written to start[b] when start is not null); entries past
// the last tile get index -1. longest_first reverses each sequence's order.
// Chunks of kVarlenPrepThreads sequences: each chunk's counts are scanned,
// then each warp writes whole sequences' entries (32 lanes per sequence, so
// one long sequence does not serialise).
template <class LenOf>
CUTLASS_DEVICE void build_tile_map(int num_seqs, int tile, LenOf len_of, bool longest_first, VarlenTile* tiles,
                                   int tiles_bound, int* start) {
  using Scan = cub::BlockScan<int, kVarlenPrepThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int chunk_start[kVarlenPrepThreads], chunk_tiles[kVarlenPrepThreads];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  constexpr int kWarps = kVarlenPrepThreads / 32;
  int done = 0;  // tiles of the chunks before this one
  for (int base = 0; base < num_seqs; base += kVarlenPrepThreads) {
    const int b = base + tid;
    const int n = b < num_seqs ? (len_of(b) + tile - 1) / tile : 0;
    int first = 0, chunk_total = 0;
    Scan(scan_storage).ExclusiveSum(n, first, chunk_total);
    chunk_start[tid] = done + first;
    chunk_tiles[tid] = n;
    if (start != nullptr && b < num_seqs) start[b] = done + first;
    __syncthreads();
    for (int j = warp; j < kVarlenPrepThreads && base + j < num_seqs; j += kWarps) {
      const int cnt = chunk_tiles[j], at = chunk_start[j];
      for (int i = lane; i < cnt; i += 32) tiles[at + i] = VarlenTile{longest_first ? cnt - 1 - i : i, base + j};
    }
    done += chunk_total;
    __syncthreads();  // chunk arrays and the scan storage are reused
  }
  for (int i = done + tid; i < tiles_bound; i += kVarlenPrepThreads) tiles[i] = VarlenTile{-1, -1};
}

}  // namespace flash3
