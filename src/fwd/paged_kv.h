// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// K/V of KV-cache launches without the prep kernel (Params::kv_direct):
// the producer warpgroup gathers each K / V tile row by row with 16-byte
// cp.async, so neither per-sequence tensor maps nor a prep kernel are needed,
// and a row may live anywhere: in a page of a page pool (page_table), or in
// a cache entry picked by cache_batch_idx, after cache_leftpad rows.
//
// Row r of sequence b is cache position p = lo + r of entry e, lo =
// cache_leftpad[b] (0), e = cache_batch_idx[b] (b):
//   paged      : row p % page_size of page page_table[e][p / page_size]
//   contiguous : row p of entry e.
//
// The limit this design works around: the producer's instruction stream.
// One producer warp per SM sub-partition issues every copy of the gather;
// with a lookup, a shuffle, an address and a cp.async per 16-byte piece in a
// rolled loop (~1.1k instructions per warp per K + V tile pair), ncu showed
// 3.4x the contiguous kernel's instructions and DRAM at 31% (1.5 TB/s, 0.37x
// TMA), while looking the pages up two rows ahead changed nothing. Here a
// thread's pieces are unrolled at ~9 instructions each (40 registers for the
// producer, 232 for the consumers: Traits::kGatherRegs), and each KV block's
// rows are looked up once (K and V share them), kLookahead blocks before its
// K tile is gathered.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "common/named_barriers.h"
#include "common/varlen.h"
#include "scheduler/tile_scheduler.h"

namespace flash3 {

template <class Traits>
struct PagedKVGather {
  using Element = typename Traits::Element;
  using Params = typename Traits::Params;
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kThreads = 128;  // the producer warpgroup
  static constexpr int kVec = int(sizeof(cute::uint128_t) / sizeof(Element));  // elements per 16-byte piece
  // Each warp gathers kBlockN / 4 rows of a tile; lane l holds the cache row
  // of one of them (RowMap below), so a tile costs each lane one lookup.
  static constexpr int kRowsPerWarp = kBlockN / 4;
  static_assert(kBlockN % 4 == 0 && kRowsPerWarp <= 32, "a warp's rows are looked up one per lane");
  // KV blocks looked up ahead of the block being gathered: the lookup of
  // block j - kLookahead is issued with the gather of K(j).
  static constexpr int kLookahead = 2;
  static_assert(Traits::kIntraWGOverlap, "the gather issues K(j) before V(j + 1), the overlapped consumers' order");

  // The copy layout of a kD-wide tile: kTpr threads share a row (kTpr a power
  // of two dividing the row's kChunks 16-byte pieces, at most a warp), each
  // copying kChunks / kTpr pieces of it; the warpgroup covers kRowsPerPass
  // rows per pass and the tile in kPasses passes. A thread's pieces are
  // unrolled, each one shuffle (its row's cache row), one address and one
  // cp.async: the gather issued ~1k instructions per warp and tile with a
  // piece per loop trip, which held the producer (sharing its SM sub-partition
  // with two consumer warps) to 1.5 TB/s.
  // K and V tiles share their rows and lookups, so both take the kTpr of the
  // pieces their rows have in common (192 x 128: 8).
  static constexpr int kCommonChunks = cute::gcd(Traits::kHeadDim / kVec, Traits::kHeadDimV / kVec);
  static constexpr int kTpr = kCommonChunks % 32 == 0 ? 32 : kCommonChunks % 16 == 0 ? 16 :
                              kCommonChunks % 8 == 0 ? 8 : kCommonChunks % 4 == 0 ? 4 :
                              kCommonChunks % 2 == 0 ? 2 : 1;
  template <int kD>
  struct RowMap {
    static constexpr int kChunks = kD / kVec;
    static constexpr int kTpr = PagedKVGather::kTpr;
    static constexpr int kPiecesPerRow = kChunks / kTpr;  // per thread
    static constexpr int kGroups = 32 / kTpr;             // rows a warp covers per pass
    static constexpr int kRowsPerPass = kThreads / kTpr;
    static constexpr int kPasses = kBlockN / kRowsPerPass;
    static_assert(kD % kVec == 0, "K/V rows are copied in 16-byte pieces");
    static_assert(kBlockN % kRowsPerPass == 0, "whole passes");
    static_assert(kGroups * kPasses == kRowsPerWarp, "a warp's rows: one lane each");
    // Tile row of pass i, row group g of warp w.
    CUTLASS_DEVICE static int row(int w, int g, int i) { return w * kGroups + g + i * kRowsPerPass; }
  };
  using MapK = RowMap<Traits::kHeadDim>;

  // One sequence's rows for this tile: where its cache entry (or the page
  // pool) starts for the tile's KV head, and its page-table row.
  struct SeqRows {
    const Element* k;     // paged: the pool's first row; contiguous: the entry's
    const Element* v;
    const int* pages;     // the entry's page-table row; null: contiguous entry
    int lo;               // cache_leftpad: sequence row 0 is cache position lo
  };

  CUTLASS_DEVICE static SeqRows seq_rows(Params const& params, int batch, int head_kv) {
    const KVCacheSeq e = kv_cache_seq(params.kv_seqs, batch);
    SeqRows s;
    s.k = params.k_ptr + int64_t(head_kv) * params.k_head_stride;
    s.v = params.v_ptr + int64_t(head_kv) * params.v_head_stride;
    s.lo = e.lo;
    if (params.page_table != nullptr) {
      s.pages = params.page_table + int64_t(e.entry) * params.page_table_batch_stride;
    } else {
      // Contiguous: entries are k_rows_per_batch rows apart (one stride
      // apart, checked by validation), in int64 (a cache may pass 2^31 rows).
      const int64_t entry_row = int64_t(e.entry) * params.kv_seqs.k_rows_per_batch;
      s.k += entry_row * params.k_row_stride;
      s.v += entry_row * params.v_row_stride;
      s.pages = nullptr;
    }
    return s;
  }

  // This lane's cache row in KV block n_block (lane j: pass j / kGroups, row
  // group j % kGroups of its warp): the pool row (paged; < 2^31, checked by
  // validation) or the row of the entry; -1 at or past seqlen_k. Paged, this
  // issues one load, used only by a later gather().
  CUTLASS_DEVICE static int lookup(Params const& params, SeqRows const& s, int n_block, int seqlen_k, int tid) {
    const int warp = tid / 32, lane = tid % 32;
    const int row = n_block * kBlockN + MapK::row(warp, lane % MapK::kGroups, lane / MapK::kGroups);
    if (lane >= kRowsPerWarp || row >= seqlen_k) return -1;
    const int pos = s.lo + row;
    if (s.pages == nullptr) return pos;
    int page_idx, in_page;
    params.page_divmod(page_idx, in_page, pos);
    return __ldg(s.pages + page_idx) * params.page_divmod.divisor + in_page;
  }

  // One 16-byte cp.async (zero-filled when !valid: src is then not read).
  CUTLASS_DEVICE static void cp_async_16(uint32_t smem, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(src),
                 "r"(valid ? 16 : 0));
  }

  // One K or V tile into stage sX (kBlockN x kD), rows as RowMap<kD> lays
  // them out; cache_row is this lane's lookup() of the block. Rows past the
  // sequence are zero-filled: the mask sets their scores to -inf, and a zero
  // V row keeps P = 0 times stale data (NaN, Inf) out of O.
  // Per piece: a shuffle, one IMAD.WIDE (row x row stride, in bytes < 2^31:
  // validation) and the cp.async. The shared addresses of the first passes
  // of a swizzle period (8 rows) are computed once: the WGMMA swizzles
  // permute 16-byte units within 8 rows of an atom, and the atoms of a tile
  // are stacked along the rows first, so 8 rows further is a constant offset.
  template <int kD, class SmemTile>
  CUTLASS_DEVICE static void gather(SmemTile sX, const Element* base, int row_stride_bytes, int cache_row, int tid) {
    using Map = RowMap<kD>;
    constexpr int kPeriodRows = Map::kRowsPerPass > 8 ? Map::kRowsPerPass : 8;
    constexpr int kPhases = kPeriodRows / Map::kRowsPerPass;  // passes per period
    static_assert(kPeriodRows % Map::kRowsPerPass == 0 && kPeriodRows % 8 == 0, "whole swizzle periods");
    static_assert(Map::kPasses % kPhases == 0, "whole periods per tile");
    const int warp = tid / 32, lane = tid % 32;
    const int g = lane / Map::kTpr, c0 = lane % Map::kTpr;
    const char* gbase = reinterpret_cast<const char*>(base) + c0 * 16;
    uint32_t sbase[kPhases][Map::kPiecesPerRow];
    CUTLASS_PRAGMA_UNROLL
    for (int p = 0; p < kPhases; ++p) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < Map::kPiecesPerRow; ++k)
        sbase[p][k] = cute::cast_smem_ptr_to_uint(&sX(Map::row(warp, g, p), (c0 + k * Map::kTpr) * kVec));
    }
    const uint32_t period_bytes =
        cute::cast_smem_ptr_to_uint(&sX(Map::row(warp, g, 0) + kPeriodRows, c0 * kVec)) - sbase[0][0];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Map::kPasses; ++i) {
      const int src_row = __shfl_sync(0xffffffff, cache_row, i * Map::kGroups + g);
      const bool valid = src_row >= 0;
      // Unsigned 32 x 32 -> 64 bits: one IMAD.WIDE.U32 (a signed 64-bit
      // product took four instructions per piece).
      const char* src = gbase + uint64_t(uint32_t(valid ? src_row : 0)) * uint32_t(row_stride_bytes);
      const uint32_t period = uint32_t(i / kPhases) * period_bytes;
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < Map::kPiecesPerRow; ++k)
        cp_async_16(sbase[i % kPhases][k] + period, src + k * Map::kTpr * 16, valid);
    }
  }

  // The tile's K/V blocks in the TMA loop's order (K(j) before V(j + 1)).
  // A stage's full barrier expects one arrival and no transaction bytes: each
  // thread's cp.async.mbarrier.arrive adds a pending arrival that completes
  // with its copies, and the named barrier orders all 128 of those before
  // thread 0's plain arrival, so the phase flips only once every piece has
  // landed. (The pipelines' producer_acquire would also expect TMA bytes: the
  // barriers are used directly.)
  CUTLASS_DEVICE static void load(Params const& params, SharedStorage& ss, int batch, int head_kv,
                                  MaskSpec const& mask, NBlockRange range, PipelineState& write) {
    const int tid = threadIdx.x;
    const SeqRows s = seq_rows(params, batch, head_kv);
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    auto load_stage = [&](auto& storage, PipelineState const& st, auto fill) {
      storage.empty_barrier_[st.index()].wait(st.phase());
      fill(st.index());
      auto& full = storage.full_barrier_[st.index()];
      cutlass::arch::cpasync_barrier_arrive(reinterpret_cast<uint64_t const*>(&full));
      named_barrier_sync(kThreads, FwdBarrier::kPagedKVProducer);
      if (tid == 0) full.arrive();
    };
    const int k_row_bytes = int(params.k_row_stride * int64_t(sizeof(Element)));
    const int v_row_bytes = int(params.v_row_stride * int64_t(sizeof(Element)));
    auto load_k = [&](int row, PipelineState const& st) {
      load_stage(ss.pipeline_k, st, [&](int stage) {
        gather<Traits::kHeadDim>(sK(_, _, stage), s.k, k_row_bytes, row, tid);
      });
    };
    auto load_v = [&](int row, PipelineState const& st) {
      load_stage(ss.pipeline_v, st, [&](int stage) {
        gather<Traits::kHeadDimV>(sV(_, _, stage), s.v, v_row_bytes, row, tid);
      });
    };
    auto lookup_block = [&](int n_block) {
      return n_block >= range.n_min ? lookup(params, s, n_block, mask.seqlen_k, tid) : -1;
    };
    // rows[i]: this lane's row of block n - i (rows[0]: the next K's).
    int n_block = range.n_max - 1;
    int rows[kLookahead + 1];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i <= kLookahead; ++i) rows[i] = lookup_block(n_block - i);
    load_k(rows[0], write);
    for (; n_block > range.n_min; --n_block) {
      const int v_row = rows[0];  // V(n) reads K(n)'s rows
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kLookahead; ++i) rows[i] = rows[i + 1];
      rows[kLookahead] = lookup_block(n_block - 1 - kLookahead);
      PipelineState prev = write;
      ++write;
      load_k(rows[0], write);
      load_v(v_row, prev);
    }
    load_v(rows[0], write);
    ++write;
  }
};

}  // namespace flash3
