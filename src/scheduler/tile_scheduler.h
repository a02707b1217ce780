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
  static dim3 grid(int num_m_blocks, int heads, int batch, bool /*lpt*/ = true) {
    return dim3(num_m_blocks, heads, batch);
  }
  CUTLASS_DEVICE static TileCoord tile(int /*num_m_blocks*/, int /*heads*/, bool /*lpt*/ = true) {
    return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  }
};

struct LptTileScheduler {
  // lpt = false (FLASH3_FWD_SCHEDULE=12, for measuring the effect): the plain
  // m_block-fastest order, which under a causal mask launches the shortest
  // tiles first.
  static dim3 grid(int num_m_blocks, int heads, int batch, bool lpt = true) {
    return lpt ? dim3(heads * batch, num_m_blocks, 1) : dim3(num_m_blocks, heads, batch);
  }
  CUTLASS_DEVICE static TileCoord tile(int num_m_blocks, int heads, bool lpt = true) {
    if (!lpt) return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
    const int hb = int(blockIdx.x);
    return {num_m_blocks - 1 - int(blockIdx.y), hb % heads, hb / heads};
  }
};

}  // namespace flash3
