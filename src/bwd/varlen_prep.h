// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The backward's varlen prep kernel: before a variable-length backward, fills
// its scratch (common/seqlen.h) from the device-resident cu_seqlens /
// seqused: each sequence's offsets and lengths, its four tensor maps (q, k,
// v, dO), the query-tile map (whose index is also the block's place in the
// per-query-block scratch: statistics, dQ accumulator, counters) with each
// sequence's first entry, and the KV-tile map the main kernel's grid walks.
// Device helpers in common/varlen.h.
#pragma once
#include "common/varlen.h"

namespace flash3 {

struct BwdVarlenPrepArgs {
  VarlenSeqs seqs;
  VarlenTensor q, k, v, dout;
  VarlenScratch scratch;
};

// Grid: enough CTAs for one thread per tensor map; CTA 0 also writes the
// sequences' info and the query-tile map, CTA 1 (or 0 with a one-CTA grid)
// the KV-tile map.
template <class Traits>
__global__ void __launch_bounds__(kVarlenPrepThreads)
    flash_bwd_varlen_prep_kernel(CUTE_GRID_CONSTANT typename Traits::Params const params, BwdVarlenPrepArgs const a) {
  using Element = typename Traits::Element;
  const VarlenScratch& s = a.scratch;
  write_varlen_map<Element, Element>(int64_t(blockIdx.x) * blockDim.x + threadIdx.x, a.seqs, s.desc,
                                     params.tma_load_q, params.shape_q, a.q, params.tma_load_k, params.shape_k, a.k,
                                     params.tma_load_v, params.shape_v, a.v, params.tma_load_do, params.shape_do,
                                     a.dout);
  const bool one_cta = gridDim.x == 1;
  if (blockIdx.x == 0) {
    for (int b = threadIdx.x; b < a.seqs.num_seqs; b += blockDim.x) s.seqs[b] = varlen_seq_info(a.seqs, b);
    build_tile_map(a.seqs.num_seqs, Traits::kBlockM, [&](int b) { return varlen_seq_info(a.seqs, b).seqlen_q; },
                   false, s.tiles, s.num_tiles_bound, s.q_tile_start);
  }
  if (blockIdx.x == (one_cta ? 0 : 1)) {
    if (one_cta) __syncthreads();  // build_tile_map's shared arrays are reused
    // Ascending n_block per sequence: the deterministic mode's ordered dQ
    // adds need a KV head's lower blocks launched first (the grid's x is
    // fastest, y the KV head).
    build_tile_map(a.seqs.num_seqs, Traits::kBlockN, [&](int b) { return varlen_seq_info(a.seqs, b).seqlen_k; },
                   false, s.kv_tiles, s.num_kv_tiles_bound, nullptr);
  }
}

}  // namespace flash3
