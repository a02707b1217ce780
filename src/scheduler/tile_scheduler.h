// Tile schedulers: map a CTA to (m_block, head, batch).
//  * SingleTileScheduler: m_block fastest, so the CTAs of one wave share a
//    head's K/V in L2 (uniform-cost tiles: no masking).
//  * LptTileScheduler: causal/local tiles have unequal cost; the longest tiles
//    (largest m_block under a bottom-right causal mask) get the lowest linear
//    block ids, and the hardware launches CTAs in that order, so the greedy
//    "longest processing time first" schedule falls out of the launch order.
//  * PersistentTileScheduler: unmasked problems, one CTA per SM looping over
//    tiles, so the next tile's loads overlap this tile's epilogue.
#pragma once
#include <cutlass/cutlass.h>

namespace flash3 {

struct TileCoord {
  int m_block, head, batch;
};

struct SingleTileScheduler {
  static dim3 grid(int num_m_blocks, int heads, int batch, int /*order*/) {
    return dim3(num_m_blocks, heads, batch);
  }
  CUTLASS_DEVICE static TileCoord tile(int /*num_m_blocks*/, int /*heads*/, int /*order*/) {
    return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  }
};

// order (runtime, from the host heuristic in fwd_launch.cuh):
//   < 0 : plain m_block-fastest order (shortest causal tiles first)
//   = 0 : global longest-first: every head's last m_block, then the next ...
//   = G : grouped longest-first: heads (x batches) in groups of G whose K/V fit
//         in L2 together; within a group tiles go longest first. The first
//         wave then reads few heads' K/V (L2 reuse, which the global order
//         loses at short seqlens) while the tail is still short tiles.
struct LptTileScheduler {
  static dim3 grid(int num_m_blocks, int heads, int batch, int order) {
    if (order < 0) return dim3(num_m_blocks, heads, batch);
    return dim3(heads * batch, num_m_blocks, 1);
  }
  CUTLASS_DEVICE static TileCoord tile(int num_m_blocks, int heads, int order) {
    if (order < 0) return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
    const int hb_total = int(gridDim.x);
    int hb, rank;  // rank 0 = longest tile
    if (order == 0) {
      hb = int(blockIdx.x);
      rank = int(blockIdx.y);
    } else {
      const int lin = int(blockIdx.y) * hb_total + int(blockIdx.x);
      const int group = lin / (order * num_m_blocks);
      const int r = lin - group * order * num_m_blocks;
      const int gsize = min(order, hb_total - group * order);
      hb = group * order + r % gsize;
      rank = r / gsize;
    }
    return {num_m_blocks - 1 - rank, hb % heads, hb / heads};
  }
};

// Persistent (unmasked problems): one CTA per SM, CTA c runs tiles c, c + G,
// c + 2G, ... (G = grid size) in m_block-fastest order, so a wave of CTAs
// still shares a head's K/V in L2. Tiles cost the same, so the static
// round-robin needs no work counter.
struct PersistentTileScheduler {
  static dim3 grid(int num_m_blocks, int heads, int batch, int num_sms) {
    const long tiles = long(num_m_blocks) * heads * batch;
    return dim3(unsigned(tiles < num_sms ? tiles : num_sms), 1, 1);
  }
  CUTLASS_HOST_DEVICE static int num_tiles(int num_m_blocks, int heads, int batch) { return num_m_blocks * heads * batch; }
  CUTLASS_HOST_DEVICE static TileCoord tile_at(int linear, int num_m_blocks, int heads) {
    const int hb = linear / num_m_blocks;
    return {linear - hb * num_m_blocks, hb % heads, hb / heads};
  }
};

}  // namespace flash3
