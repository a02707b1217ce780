// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The tile tables of the forward and backward kernels and the tuned constants
// of their schedules. Used by the launcher (as constexpr template arguments)
// and by host-side heuristics/tests, so the two can never disagree. Forward
// values follow the seed's Table 4.1 reasoning (SMEM: Q + 2 stages of K and V
// must fit in 227 KB; registers: the O accumulator is tile_m x dv x 4 bytes
// spread over the consumer threads).
#pragma once

// Tile widths that are not multiples of 32 (keys 80 / 176, the d = 96 backward's
// 48-column dQ halves) need CuTe's extended WGMMA shapes; without them its GMMA
// selectors silently fall back to m64n16 atoms (about 30% slower; docs/performance.md).
#if defined(__CUDACC__) && !defined(CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
#error "flash3 kernels need -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED on the CUDA flags (CMakeLists.txt sets it)"
#endif

namespace flash3 {

// ------------------------------------------------------------ tuned constants
// Each value is what measured fastest (bf16, sustained-load A/B on an H200;
// the alternatives and their numbers are in docs/performance.md).

// Causal d <= 128 forwards with seqlen_k up to this many keys run persistent
// CTAs that claim tiles from a global counter in longest-first order
// (DynamicLptTileScheduler); longer ones keep one tile per CTA. Forced on at
// every length, d = 128 measured +17 / +9 / +3 / -2 / 0% at 1k / 2k / 4k /
// 8k / 16k. (Causal d = 64 takes the persistent kernel at every length:
// fwd_short_causal.)
constexpr int kFwdPersistentCausalMaxSeqlen = 4096;

// Lazy O rescaling in the forward softmax (OnlineSoftmax::step): a row's
// stored max moves only when a block's max exceeds it by more than this many
// powers of two, so in the steady state whole warps skip the O rescale (d_v / 2
// FMULs per thread per block) and P stays <= 2^slack (exact in bf16 / fp16;
// the fp32 row sum and O are unaffected). d = 256 +3 to +11%, d = 128 +1 to
// +5% at 4k-16k; d = 64 keeps eager rescaling (fwd_tile_config).
constexpr int kFwdRescaleSlack = 8;

// Below this many queries the d = 128 backward keeps 64-row query tiles (a
// second set of kernels): 80 rows pad 512 queries to 560 and measured -4%
// (causal -10%) at 512 and -2% at 1k, against +-1% at 2k.
constexpr int kBwdD128ShortSeqlen = 2048;

// Keys-split backward variants with at least this many query rows per
// iteration read the LSE inside the exp2 loop and build dS^T from the packed
// 16-bit P^T (BwdTraits::kLeanSdP). At tile_m = 64 (d = 128) that adds 41
// instructions per iteration and measured no gain.
constexpr int kBwdLeanSdPMinTileM = 80;

// Causal / local backward CTAs go longest-first within groups of heads whose
// Q, dO and fp32 dQ accumulator fit in this many MB of L2 (8 and 32 measured
// the same within noise).
constexpr int kBwdL2ShareMB = 16;

// The last head groups of a causal / local backward launch merge into one
// longest-first group of at least this many waves of CTAs
// (BwdScheduler::tail_heads): causal d = 128 +3% at 2k-8k, d = 64 +1 to +2%,
// 16k unchanged.
constexpr int kBwdTailWaves = 3;

// The unmasked backward's cost model for splitting the last, partial wave's KV
// blocks over their query range (bwd_split_plan), in query-block iterations:
// a CTA's fixed cost (K / V load, pipeline fill, epilogue, the partial's
// write), the cost of summing one more partial, and what fp32 dK / dV staging
// adds to every block of a split launch (d = 128 512 unmasked, 8 query blocks
// per KV block, ran 5.5% slower with it).
constexpr double kBwdSplitFixedIters = 3;
constexpr double kBwdSplitSlotIters = 0.3;
constexpr double kBwdSplitStagingIters = 0.5;

// ---------------------------------------------------------------- forward

struct FwdTileConfig {
  int tile_m;            // query rows per CTA = 64 x consumer warpgroups
  int tile_n;            // keys per KV block
  int num_stages;        // K/V shared-memory ring depth
  int num_mma_wg;        // consumer warpgroups
  bool intra_wg_overlap; // GEMM0(j+1) in flight while softmax(j) runs
  bool pingpong;         // named-barrier turn-taking between consumer warpgroups
  bool mma_pv_is_rs;     // P read from registers by the PV WGMMA
  int producer_regs;     // setmaxnreg for the producer warpgroup
  int consumer_regs;     // setmaxnreg for each consumer warpgroup
  // One CTA per SM looping over tiles: the next tile's K/V and Q loads overlap
  // this tile's epilogue; O gets its own smem buffer.
  bool persistent = false;
  // Lazy O rescaling threshold in log2 units (0: eager); kFwdRescaleSlack.
  int rescale_slack = 0;
};

// FP8 (elem_bytes 1) adds the transposed V ring (FwdTraits::kTransposeV) and
// writes a 16-bit O.
constexpr int fwd_smem_bytes(const FwdTileConfig& c, int d, int dv, int elem_bytes) {
  const int vt = elem_bytes == 1 ? c.num_stages * c.tile_n * dv : 0;
  const int o_bytes = elem_bytes == 1 ? 2 : elem_bytes;
  return (c.tile_m * d + c.num_stages * c.tile_n * (d + dv) + vt) * elem_bytes +
         (c.persistent ? c.tile_m * dv * o_bytes : 0) + 1024;
}

// The tile table: shapes, warpgroups, stages and register budgets.
// causal_or_local: masked problems prefer square-ish tiles (less wasted work on
// the diagonal); local: a sliding window (left bound), a subset of those.
// Register budgets from the seed (Listing 5.1): {1 WG: 256/56, 2 WG: 240/24, 3 WG: 160/32}.
constexpr FwdTileConfig fwd_tile_shape(int d, int dv, bool causal_or_local, bool local) {
  if (d <= 64) {
    // Three consumer warpgroups (seed Table 4.1): at d = 64 a warpgroup's
    // softmax (64 exp2 per thread per block, plus the max/sum chains) is as long
    // as its two GEMMs, so two other warpgroups' GEMMs hide it better than one.
    // 160 registers: S 64 + P 32 + O 32 per thread; a 192-key block does not
    // fit. +5 to +10% over the 2-warpgroup tiles at 4k-16k, unmasked and
    // causal. The sliding-window kernel spills 324 bytes at 160 registers, so
    // it keeps two warpgroups at 240.
    if (!local) return {192, 128, 2, 3, true, true, true, 32, 160};
    return {128, 128, 2, 2, true, true, true, 24, 240};
  }
  if (d <= 128) {
    // 176 keys (unmasked) measured -2 to 0%: the 128-key kernel already keeps
    // the tensor pipe ~85% busy, and a wider S tile only adds registers.
    return {128, 128, 2, 2, true, true, true, 24, 240};
  }
  if (d <= 192) {
    // Q 48 KB + 2 stages of K (d) and V (dv): 128 keys fit for dv = 128, 112 for
    // dv = 192 (48 + 2 x 112 x 384 x 2 B = 216 KB).
    // 112 keys measured +5 to +14% over 64 (any multiple of 16 works with the
    // extended WGMMA shapes: tests/unit/test_mma_atoms.cu).
    // Pingpong off for d = 192: the O accumulator leaves too few registers for the
    // overlapped S/P fragments plus the turn-taking slack (seed 5.3). (d = 256,
    // with 64-key blocks, has the room.)
    // Sliding windows keep 64 keys: at 112 that kernel spills 80 bytes (ptxas).
    return {128, dv <= 128 ? 128 : (local ? 64 : 112), 2, 2, true, false, true, 24, 240};
  }
  // d = 256: Q 64 KB + 2 x (64 x 256 x 2) x 2 = 192 KB. 80 keys measured -1 to
  // -4%. Pingpong between the two consumer warpgroups for unmasked problems:
  // +2% at 8k, +3% at 16k; causal measured -4 to -7% with it.
  return {128, 64, 2, 2, true, !causal_or_local, true, 24, 240};
}

// The table plus the per-head-dim policies, each decided here once.
// short_causal: the causal variant for seqlen_k <= kFwdPersistentCausalMaxSeqlen
// (and every causal d = 64 problem: fwd_short_causal()), built next to the default one.
// fp8: the e4m3 kernels (FwdTraits::kFp8), whose PV GEMM takes 32 keys per
// WGMMA (tile_n a multiple of 32), whose P carries a max offset that lazy
// rescaling would push past e4m3's range (slack 0), and whose producer
// warpgroup transposes V (no dynamic scheduler thread: no short-causal
// persistent variant).
constexpr FwdTileConfig fwd_tile_config(int d, int dv, bool causal_or_local, bool local = false,
                                        bool short_causal = false, bool fp8 = false) {
  FwdTileConfig c = fwd_tile_shape(d, dv, causal_or_local, local);
  if (fp8) {
    if (d > 128 && d <= 192) c.tile_n = local ? 64 : 128;  // 112 is not a multiple of 32
    c.rescale_slack = 0;
    c.persistent = d <= 128 && !causal_or_local;
    // Three stages of K, V and the transposed V where they fit (d = 192 has
    // room for two): with two, the transpose of block j + 2 waits for both
    // consumer warpgroups to release sVt(j) and then has less than a block's
    // time left. d = 128 / 256 +3 to +9%, d = 64 within +-2% (with the
    // transpose's two units per trip; docs/performance.md, "FP8 forward").
    if (d <= 128 || d > 192) c.num_stages = 3;
    // The transposing producer warps need more than 24 registers.
    if (c.num_mma_wg == 2) {
      c.producer_regs = 40;
      c.consumer_regs = 232;
    }
    return c;
  }
  // d = 64 stays eager: its O rescale is only 32 FMULs per thread, and the
  // vote lengthens the latency-bound softmax chain (measured -1 to -5%).
  c.rescale_slack = d <= 64 ? 0 : kFwdRescaleSlack;
  // Persistent CTAs need their own sO buffer, which fits next to Q and the K/V
  // ring only for d <= 128. Unmasked: +4 to +7% at 2k-4k, +0 to +3% at 8k-16k.
  // Masked tiles have unequal cost: long causal problems keep one tile per CTA
  // in longest-first launch order; short ones gain from overlapping each
  // tile's epilogue with the next tile's loads.
  c.persistent = d <= 128 && (!causal_or_local || (short_causal && !local));
  return c;
}

// Whether a causal forward of this head dim has a short_causal variant, and
// whether a problem with seqlen_k keys takes it.
constexpr bool fwd_has_short_causal(int d, int dv) {
  return fwd_tile_config(d, dv, true, false, true).persistent;
}
// Causal d = 64 takes the persistent kernel at every seqlen_k: its
// steady-state loop has no local memory access, while the one-tile-per-CTA
// d = 64 causal kernel (160 registers) reloads two spilled values per KV block
// (8k +2.9%, 16k -0.6%).
constexpr bool fwd_short_causal(int d, int seqlen_k) {
  return seqlen_k <= kFwdPersistentCausalMaxSeqlen || d <= 64;
}

// ---------------------------------------------------------------- backward
// One CTA owns tile_n keys (64 per consumer warpgroup) and streams tile_m query
// rows per iteration (seed 7.4-7.7). S^T = K Q^T and dP^T = V dO^T are computed
// "swapAB", so each warpgroup holds P^T / dS^T for its own 64 keys in registers
// and feeds them straight into dV += P^T dO and dK += dS^T Q (register-sourced
// WGMMA); only dS goes through shared memory, for dQ = dS K.
struct BwdTileConfig {
  int tile_m;         // query rows per iteration
  int tile_n;         // keys per CTA
  int q_stages;       // Q (+ LSE) ring depth
  int do_stages;      // dO (+ D) ring depth
  int num_mma_wg;     // consumer warpgroups
  int producer_regs;  // setmaxnreg, producer warpgroup (TMA warp + dQ store warp)
  int consumer_regs;  // setmaxnreg, each consumer warpgroup
  // false: warpgroup w owns keys [64w, 64w + 64): P^T / dS^T stay in registers
  //        and feed dV / dK directly (tile_n = 64 x num_mma_wg).
  // true : for large head dims, the warpgroups split head_dim (dK, dV, dQ
  //        columns) and the queries of S^T / dP^T; P^T and dS^T go through
  //        shared memory (tile_n = 64). Same register budget as d = 128.
  bool split_hdim;
};

// Registers per consumer thread (d = dv = 128, keys split, tile_m = 80): dK 64
// + dV 64 accumulators live across the loop, S^T 40 + dP^T 40 per iteration
// (S^T dies at its bf16 conversion: kLeanSdP), dQ^T 40 after S/dP are dead.
// d = 64, tile_m = 128: dK 32 + dV 32, S^T 64 + dP^T 64, dQ 32.
// d = 256 (head_dim split): dK 64 + dV 64, S^T 16 + dP^T 16, dQ 64.
// SMEM (d = 128, tile_m = 80): K 32 + V 32 + 2 x Q 20 + 2 x dO 20 + 2 x dS 20 +
// dQ staging 40 KB = 226 KB of the 227 KB.
// SMEM (d = 256): K 32 + V 32 + Q 32 + dO 32 + 2 x (P + dS) 16 + dQ staging 64 KB
// = 224 KB: one Q / dO stage is all that fits.

// Head dims with a second, short-sequence tile (64 query rows), and when it
// runs (kBwdD128ShortSeqlen).
constexpr bool bwd_has_short_tile(int d) { return d > 96 && d <= 128; }
constexpr bool bwd_short_tile(int d, int seqlen_q) {
  return bwd_has_short_tile(d) && seqlen_q < kBwdD128ShortSeqlen;
}

// Query rows per iteration: d = 64 takes 128 (FA3's choice; +7 to +14% over
// 64 at 2k-16k, both masks, with dQ split over queries, BwdTraits::kdQSplitM,
// and S^T / dP^T kept lean, kLeanSdP: without those it spilled 136-172 bytes).
// d = 128 takes 80 (FA3's unmasked choice; dQ computed swapAB,
// BwdTraits::kdQSwapAB, with 1 KB of shared memory left): +1.5% on average
// over 64 at 2k-16k, unmasked and causal.
constexpr BwdTileConfig bwd_tile_config(int d, int dv, bool causal_or_local, bool short_q = false) {
  (void)causal_or_local;  // one table for masked and unmasked problems
  (void)dv;
  if (d <= 64) return {128, 128, 2, 2, 2, 24, 240, false};
  if (d <= 96) return {64, 128, 2, 2, 2, 24, 240, false};
  if (d <= 128) return {short_q ? 64 : 80, 128, 2, 2, 2, 24, 240, false};
  if (d <= 192) return {64, 64, 2, 2, 2, 24, 240, true};
  return {64, 64, 1, 1, 2, 24, 240, true};
}

constexpr int bwd_smem_bytes(const BwdTileConfig& c, int d, int dv, int elem_bytes) {
  return (c.tile_n * (d + dv) + c.q_stages * c.tile_m * d + c.do_stages * c.tile_m * dv +
          (c.split_hdim ? 4 : 2) * c.tile_m * c.tile_n) *
             elem_bytes +
         c.tile_m * d * 4 + (c.q_stages + c.do_stages) * c.tile_m * 4 + 1024;
}

}  // namespace flash3
