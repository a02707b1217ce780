// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The forward's varlen prep kernel: fills the scratch of a variable-length
// forward (common/seqlen.h) before the attention kernel runs: each sequence's
// offsets and lengths, its four tensor maps (q, k, v, out) and the query-tile
// map, so the attention grid launches no empty tiles for short sequences
// beyond the bound's slack (one entry per sequence). Device helpers in
// common/varlen.h.
#pragma once
#include "common/varlen.h"

namespace flash3 {

struct VarlenPrepArgs {
  VarlenSeqs seqs;
  VarlenTensor q, k, v, o;
  bool longest_first;  // causal / local: a sequence's last query tile (the longest) first
  VarlenScratch scratch;
};

// Grid: enough CTAs for one thread per tensor map; CTA 0 also writes the
// sequences' info and the tile map.
template <class Traits>
__global__ void __launch_bounds__(kVarlenPrepThreads)
    flash_fwd_varlen_prep_kernel(CUTE_GRID_CONSTANT typename Traits::Params const params, VarlenPrepArgs const a) {
  const VarlenScratch& s = a.scratch;
  write_varlen_map<typename Traits::Element, typename Traits::ElementOut>(
      int64_t(blockIdx.x) * blockDim.x + threadIdx.x, a.seqs, s.desc, params.tma_load_q, params.shape_q, a.q,
      params.tma_load_k, params.shape_k, a.k, params.tma_load_v, params.shape_v, a.v, params.tma_store_o,
      params.shape_o, a.o);
  if (blockIdx.x != 0) return;
  for (int b = threadIdx.x; b < a.seqs.num_seqs; b += blockDim.x) s.seqs[b] = varlen_seq_info(a.seqs, b);
  // Query tiles over each sequence's rows (PackGQA: seqlen_q x P packed rows).
  int rows_per_query = 1;
  if constexpr (Traits::kPackGQA) rows_per_query = params.pack_divmod.divisor;
  build_tile_map(a.seqs.num_seqs, Traits::kBlockM,
                 [&](int b) { return varlen_seq_info(a.seqs, b).seqlen_q * rows_per_query; },
                 a.longest_first, s.tiles, s.num_tiles_bound, nullptr);
}

}  // namespace flash3
