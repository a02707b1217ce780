// Tile schedulers: map a CTA to (m_block, head, batch). One tile per CTA.
//  * SingleTileScheduler: m_block fastest, so the CTAs of one wave share a
//    head's K/V in L2 (uniform-cost tiles: no masking).
//  * LptTileScheduler: causal/local tiles have unequal cost; the longest tiles
//    (largest m_block under a bottom-right causal mask) get the lowest linear
//    block ids, and the hardware launches CTAs in that order, so the greedy
//    "longest processing time first" schedule falls out of the launch order.
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

}  // namespace flash3
