// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Variable-length batches: where each sequence lives, and the scratch the
// varlen prep kernel (fwd/varlen_prep.h) fills for the attention kernel.
//
// Sequence b owns rows [offset_q, offset_q + seqlen_q) of q / out and rows
// [offset_k, offset_k + seqlen_k) of k / v. The lengths are the real ones
// (seqused when given), clamped into the tensors, so no tile of a sequence
// ever addresses another sequence's rows or memory past the tensors.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cutlass/cutlass.h>

namespace flash3 {

struct SeqlenInfo {
  int offset_q = 0, seqlen_q = 0;
  int offset_k = 0, seqlen_k = 0;
};

// One query tile of a varlen launch: (m_block, sequence); m_block < 0 marks
// the unused entries past the last tile (the grid is sized by an upper bound,
// since the host does not read the sequence lengths).
struct VarlenTile {
  int m_block, batch;
};

// The tensor maps of one sequence, in this order (the backward's fourth map
// is dO's, the forward's out's).
enum VarlenDesc : int { kDescQ = 0, kDescK = 1, kDescV = 2, kDescO = 3, kDescdO = 3, kNumVarlenDesc = 4 };

struct VarlenScratch {
  cute::TmaDescriptor* desc = nullptr;  // kNumVarlenDesc per sequence, 128-byte aligned
  SeqlenInfo* seqs = nullptr;           // one per sequence
  VarlenTile* tiles = nullptr;          // query tiles: num_tiles_bound entries
  int num_tiles_bound = 0;
  // Backward only: each sequence's first query tile in `tiles` (its rows of
  // the per-query-block scratch), and the KV tiles (n_block, sequence).
  int* q_tile_start = nullptr;
  VarlenTile* kv_tiles = nullptr;
  int num_kv_tiles_bound = 0;
};

// Query tiles of a varlen batch, at most: sum ceil(len_b / tile_m) <=
// total_q / tile_m + num_sequences.
inline int64_t varlen_tiles_bound(int64_t total_q, int64_t num_sequences, int tile_m) {
  return total_q / tile_m + num_sequences;
}

// Bytes of scratch for a varlen launch (descriptors first: 128-byte aligned
// when the base is). kv_tiles_bound > 0: the backward's extra arrays too.
inline size_t varlen_scratch_bytes(int64_t num_sequences, int64_t tiles_bound, int64_t kv_tiles_bound = 0) {
  size_t bytes = size_t(num_sequences) * (kNumVarlenDesc * sizeof(cute::TmaDescriptor) + sizeof(SeqlenInfo)) +
                 size_t(tiles_bound) * sizeof(VarlenTile);
  if (kv_tiles_bound > 0) bytes += size_t(num_sequences) * sizeof(int) + size_t(kv_tiles_bound) * sizeof(VarlenTile);
  return bytes;
}

inline VarlenScratch varlen_scratch_at(void* base, int64_t num_sequences, int64_t tiles_bound,
                                       int64_t kv_tiles_bound = 0) {
  VarlenScratch s;
  char* p = static_cast<char*>(base);
  s.desc = reinterpret_cast<cute::TmaDescriptor*>(p);
  p += size_t(num_sequences) * kNumVarlenDesc * sizeof(cute::TmaDescriptor);
  s.seqs = reinterpret_cast<SeqlenInfo*>(p);
  p += size_t(num_sequences) * sizeof(SeqlenInfo);
  s.tiles = reinterpret_cast<VarlenTile*>(p);
  s.num_tiles_bound = int(tiles_bound);
  p += size_t(tiles_bound) * sizeof(VarlenTile);
  if (kv_tiles_bound > 0) {
    s.kv_tiles = reinterpret_cast<VarlenTile*>(p);
    s.num_kv_tiles_bound = int(kv_tiles_bound);
    p += size_t(kv_tiles_bound) * sizeof(VarlenTile);
    s.q_tile_start = reinterpret_cast<int*>(p);
  }
  return s;
}

}  // namespace flash3
