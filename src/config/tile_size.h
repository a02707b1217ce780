// The one tile-size table for the forward kernel. Used by the launcher (as
// constexpr template arguments) and by host-side heuristics/tests, so the two can
// never disagree. Values follow the seed's Table 4.1 reasoning (SMEM: Q + 2 stages
// of K and V must fit in 227 KB; registers: the O accumulator is
// tile_m x dv x 4 bytes spread over the consumer threads).
#pragma once

// Tile widths that are not multiples of 32 (keys 80 / 176, the d = 96 backward's
// 48-column dQ halves) need CuTe's extended WGMMA shapes; without them its GMMA
// selectors silently fall back to m64n16 atoms (about 30% slower; docs/performance.md).
#if defined(__CUDACC__) && !defined(CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
#error "flash3 kernels need -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED on the CUDA flags (CMakeLists.txt sets it)"
#endif

// Knobs (-D on the CUDA flags). Each was measured (docs/performance.md, 2026-11-30);
// the defaults are what measured fastest.
//
// FLASH3_D64_3WG_LOCAL: the 3-warpgroup d = 64 forward tile for sliding windows too.
#ifndef FLASH3_D64_3WG_LOCAL
#define FLASH3_D64_3WG_LOCAL 0
#endif
// FLASH3_D64_EXP2_EMU=k: every k-th exp2 of the d = 64 forward softmax on the FMA
// pipe; off because it measured no gain (k = 8) or a loss (k = 4): the d = 64
// softmax is latency-bound, not MUFU-bound.
#ifndef FLASH3_D64_EXP2_EMU
#define FLASH3_D64_EXP2_EMU 0
#endif
// FLASH3_FWD_PERSISTENT: persistent CTAs for unmasked d <= 128 (on by default;
// 0 builds the one-tile-per-CTA kernels for the ablation). Measured with
// bench/ab.py (interleaved): +4 to +7% at 2k-4k, +0 to +3% at 8k-16k.
#ifndef FLASH3_FWD_PERSISTENT
#define FLASH3_FWD_PERSISTENT 1
#endif
// FLASH3_FWD_PERSISTENT_CAUSAL_MAX_SEQLEN: causal d <= 128 problems with
// seqlen_k up to this run persistent CTAs that claim tiles from a global
// counter in longest-first order (DynamicLptTileScheduler); longer ones keep
// one tile per CTA (0: never persistent). Measured (bf16, interleaved A/B,
// 2026-11-30, forced on for every seqlen), with just-in-time claims: d = 128
// 1k/2k/4k/8k/16k +17.0/+8.8/+2.7/-1.6/+0.3%, d = 64 +15.1/+9.9/+2.6/0.0/-1.2%
// (claiming a whole tile ahead: -2 to -7% at 8k-16k; a static round-robin:
// -5 to -13% at 2k-16k). The threshold covers 4k since 2026-11-30 (fourth
// session; full runs in docs/performance.md).
#ifndef FLASH3_FWD_PERSISTENT_CAUSAL_MAX_SEQLEN
#define FLASH3_FWD_PERSISTENT_CAUSAL_MAX_SEQLEN 4096
#endif
// FLASH3_FWD_D64_CAUSAL_ALWAYS_DYNAMIC: causal d = 64 takes the dynamic
// persistent kernel at every seqlen_k. Its steady-state loop has no local
// memory access; the one-tile-per-CTA d = 64 causal kernel (160 registers)
// reloads two spilled values per KV block there. Measured (bf16, sustained
// A/B, 2026-11-30 sixth session): 8k +2.9%, 16k -0.6%.
#ifndef FLASH3_FWD_D64_CAUSAL_ALWAYS_DYNAMIC
#define FLASH3_FWD_D64_CAUSAL_ALWAYS_DYNAMIC 1
#endif
// FLASH3_FWD_Q_IN_REGS: register-sourced QK^T for d = 96 / 128. Measured
// (interleaved A/B): d = 128 -3 to 0%, d = 96 +1 to +4%; off: the d = 128 loop
// is not limited by the Q operand's shared-memory reads.
#ifndef FLASH3_FWD_Q_IN_REGS
#define FLASH3_FWD_Q_IN_REGS 0
#endif
// FLASH3_FWD_D{128,192,256}_TILE_N: forward keys per KV block for unmasked
// d = 96/128, d = 192 with dv = 192, and d = 256. Any multiple of 16 works now
// that the extended WGMMA shapes are on (one full-width atom per warpgroup,
// tests/unit/test_mma_atoms.cu). Measured (bf16, interleaved A/B): d = 192 at 112
// keys +5 to +14% over 64 (kept); d = 128 at 176 -2 to 0% and d = 256 at 80 -1 to
// -4% (not kept: at 128 / 64 the kernels already keep the tensor pipe ~85% busy,
// and the wider S tile only adds registers and masked-tail work).
// FLASH3_FWD_D256_PINGPONG: pingpong between the two d = 256 consumer
// warpgroups for unmasked problems. Measured (bf16, interleaved A/B, four runs,
// 2026-11-30): unmasked 8k +1.8%, 16k +3.0% on average (4k -1 to +1.5%);
// causal -4 to -7%, so causal keeps it off.
#ifndef FLASH3_FWD_D256_PINGPONG
#define FLASH3_FWD_D256_PINGPONG 1
#endif
// FLASH3_FWD_RESCALE_SLACK: lazy O rescaling in the forward softmax
// (OnlineSoftmax::step): a row's stored max moves only when a block's max
// exceeds it by more than this many powers of two, so in the steady state
// whole warps skip the O rescale (d_v / 2 FMULs per thread per block at two
// rows per thread) and P stays <= 2^slack (exact in bf16/fp16; the fp32 row sum
// and O are unaffected). 0: rescale at every block, as before 2026-11-30 (sixth session).
// Measured (bf16, sustained A/B, 4k-16k, both masks): d = 256 +3 to +11%,
// d = 128 +1 to +5%, d = 64 -1 to -5% (d = 64 keeps eager rescaling).
#ifndef FLASH3_FWD_RESCALE_SLACK
#define FLASH3_FWD_RESCALE_SLACK 8
#endif
#ifndef FLASH3_FWD_D128_TILE_N
#define FLASH3_FWD_D128_TILE_N 128
#endif
#ifndef FLASH3_FWD_D192_TILE_N
#define FLASH3_FWD_D192_TILE_N 112
#endif
#ifndef FLASH3_FWD_D256_TILE_N
#define FLASH3_FWD_D256_TILE_N 64
#endif
// FLASH3_BWD_D64_TILE_M: query rows per backward iteration at d = 64. 128
// (FA3's choice): +7 to +14% over 64 at 2k-16k, both masks (sustained A/Bs,
// 2026-11-30, seventh session), once dQ is split over queries and S^T / dP^T
// (64 registers each) are kept lean (BwdTraits::kdQSplitM, kLeanSdP); before
// that it spilled 136-172 bytes and measured -7 to -19%.
#ifndef FLASH3_BWD_D64_TILE_M
#define FLASH3_BWD_D64_TILE_M 128
#endif
// FLASH3_BWD_D128_TILE_M[_CAUSAL]: query rows per backward iteration at
// d = 128, unmasked / causal-or-local. 80 (FA3's unmasked choice) computes dQ
// swapAB (BwdTraits::kdQSwapAB) and leaves 1 KB of shared memory free. Two
// sustained A/Bs against 64 (2026-11-30, seventh session), 2k-16k: unmasked
// 0.976-1.052, causal 0.993-1.049, about +1.5% on average.
#ifndef FLASH3_BWD_D128_TILE_M
#define FLASH3_BWD_D128_TILE_M 80
#endif
#ifndef FLASH3_BWD_D128_TILE_M_CAUSAL
#define FLASH3_BWD_D128_TILE_M_CAUSAL 80
#endif
// FLASH3_BWD_D128_SHORT_SEQLEN: below this many queries d = 128 keeps 64-row
// query tiles (a second set of kernels): 80 rows pad 512 queries to 560 and
// measured -4% (causal -10%) at 512 and -2% at 1k, against +-1% at 2k
// (sustained table, 2026-11-30 seventh session). 0 disables the short tiles.
#ifndef FLASH3_BWD_D128_SHORT_SEQLEN
#define FLASH3_BWD_D128_SHORT_SEQLEN 2048
#endif
// FLASH3_BWD_LEAN_SDP_MIN_TILE_M: keys-split backward variants with at least
// this many query rows per iteration read the LSE inside the exp2 loop and
// build dS^T from the packed 16-bit P^T (BwdTraits::kLeanSdP). At tile_m = 64
// (d = 128) it adds 41 instructions per iteration and measured no gain
// (0.963-1.037).
#ifndef FLASH3_BWD_LEAN_SDP_MIN_TILE_M
#define FLASH3_BWD_LEAN_SDP_MIN_TILE_M 80
#endif
// FLASH3_BWD_L2_SHARE_MB: causal/local backward CTAs go longest-first within
// groups of heads whose Q, dO and fp32 dQ accumulator fit in this many MB of
// L2 (bwd_tile_group; 0: one longest-first order over all heads, as before
// 2026-11-30's fifth session).
#ifndef FLASH3_BWD_L2_SHARE_MB
#define FLASH3_BWD_L2_SHARE_MB 16
#endif
// FLASH3_BWD_TAIL_WAVES: the last head groups of a causal/local backward
// launch merge into one longest-first group of at least this many waves of
// CTAs (BwdScheduler::tail_heads; 0: plain groups to the end). Measured
// (bf16, sustained A/B, 2026-11-30 ninth session): causal d = 128 2k / 4k / 8k
// +2.9 / +2.6 / +3.2%, d = 64 +1.4 / +2.4 / +1.0%, 16k within +-0.4%.
#ifndef FLASH3_BWD_TAIL_WAVES
#define FLASH3_BWD_TAIL_WAVES 3
#endif
// FLASH3_BWD_SPLIT_FIXED_ITERS, FLASH3_BWD_SPLIT_SLOT_ITERS: the unmasked
// backward's cost model for splitting the last, partial wave's KV blocks over
// their query range (bwd_split_plan): a CTA's fixed cost (K / V load, pipeline
// fill, epilogue, the partial's write) and the cost of summing one more
// partial, in query-block iterations. FLASH3_BWD_SPLIT_FIXED_ITERS < 0 turns
// the split off.
#ifndef FLASH3_BWD_SPLIT_FIXED_ITERS
#define FLASH3_BWD_SPLIT_FIXED_ITERS 3
#endif
#ifndef FLASH3_BWD_SPLIT_SLOT_ITERS
#define FLASH3_BWD_SPLIT_SLOT_ITERS 0.3
#endif
// FLASH3_BWD_SPLIT_STAGING_ITERS: what fp32 dK / dV staging adds to every
// block of a split launch (d = 128 512 unmasked, 8 query blocks per KV block,
// ran 5.5% slower with it: about 0.5 iterations).
#ifndef FLASH3_BWD_SPLIT_STAGING_ITERS
#define FLASH3_BWD_SPLIT_STAGING_ITERS 0.5
#endif
// FLASH3_BWD_SPLIT_PIECES > 0: that many pieces per split block instead of
// the cost model's choice (experiments; still at most one per query block and
// 3 waves of pieces).
#ifndef FLASH3_BWD_SPLIT_PIECES
#define FLASH3_BWD_SPLIT_PIECES 0
#endif

namespace flash3 {

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
  int exp2_emu_every = 0;  // > 0: every k-th score's exp2 on the FMA pipe (OnlineSoftmax::exp2_fma)
  // One CTA per SM looping over tiles (unmasked problems only): the next tile's
  // K/V and Q loads overlap this tile's epilogue; O gets its own smem buffer.
  bool persistent = false;
  // Q read once per tile from shared memory into registers (ldmatrix) and the
  // QK^T WGMMA register-sourced: halves that GEMM's shared-memory operand traffic.
  bool q_in_regs = false;
  // Lazy O rescaling threshold in log2 units (0: eager); FLASH3_FWD_RESCALE_SLACK.
  int rescale_slack = 0;
};

constexpr int fwd_smem_bytes(const FwdTileConfig& c, int d, int dv, int elem_bytes) {
  return (c.tile_m * d + c.num_stages * c.tile_n * (d + dv) + (c.persistent ? c.tile_m * dv : 0)) * elem_bytes + 1024;
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
    // fit. Measured (bf16, 2026-11-30, docs/performance.md): +5 to +10% over the
    // 2-warpgroup tiles at 4k-16k, unmasked and causal. The sliding-window
    // kernel spills 324 bytes at 160 registers and was not benchmarked, so it
    // keeps two warpgroups at 240 (FLASH3_D64_3WG_LOCAL builds it with three).
    if (!local || FLASH3_D64_3WG_LOCAL) return {192, 128, 2, 3, true, true, true, 32, 160};
    return {128, 128, 2, 2, true, true, true, 24, 240};
  }
  if (d <= 128) {
    return {128, causal_or_local ? 128 : FLASH3_FWD_D128_TILE_N, 2, 2, true, true, true, 24, 240};
  }
  if (d <= 192) {
    // Q 48 KB + 2 stages of K (d) and V (dv): 128 keys fit for dv = 128, 112 for
    // dv = 192 (48 + 2 x 112 x 384 x 2 B = 216 KB).
    // Pingpong off for d = 192: the O accumulator leaves too few registers for the
    // overlapped S/P fragments plus the turn-taking slack (seed 5.3). (d = 256,
    // with 64-key blocks, has the room: FLASH3_FWD_D256_PINGPONG.)
    // Sliding windows keep 64 keys: at 112 that kernel spills 80 bytes (ptxas) and
    // was not measured.
    return {128, dv <= 128 ? 128 : (local ? 64 : FLASH3_FWD_D192_TILE_N), 2, 2, true, false, true, 24, 240};
  }
  // d = 256: Q 64 KB + 2 x (64 x 256 x 2) x 2 = 192 KB.
  return {128, FLASH3_FWD_D256_TILE_N, 2, 2, true, bool(FLASH3_FWD_D256_PINGPONG) && !causal_or_local, true, 24, 240};
}

// The table plus the per-head-dim policies, each decided here once.
// short_causal: the causal variant for seqlen_k <= FLASH3_FWD_PERSISTENT_CAUSAL_MAX_SEQLEN
// (and every causal d = 64 problem: fwd_short_causal()), built next to the default one.
constexpr FwdTileConfig fwd_tile_config(int d, int dv, bool causal_or_local, bool local = false,
                                        bool short_causal = false) {
  FwdTileConfig c = fwd_tile_shape(d, dv, causal_or_local, local);
  if (d <= 64) c.exp2_emu_every = FLASH3_D64_EXP2_EMU;
  if (d > 64 && d <= 128) c.q_in_regs = bool(FLASH3_FWD_Q_IN_REGS);
  // d = 64 stays eager: its O rescale is only 32 FMULs per thread, and the
  // vote lengthens the latency-bound softmax chain (measured -1 to -5%).
  c.rescale_slack = d <= 64 ? 0 : FLASH3_FWD_RESCALE_SLACK;
  // Persistent CTAs need their own sO buffer, which fits next to Q and the K/V
  // ring only for d <= 128. Masked tiles have unequal cost: long causal
  // problems keep one tile per CTA in longest-first launch order; short ones
  // gain from overlapping each tile's epilogue with the next tile's loads.
  const bool persistent_causal = short_causal && !local && FLASH3_FWD_PERSISTENT_CAUSAL_MAX_SEQLEN > 0;
  c.persistent = FLASH3_FWD_PERSISTENT && d <= 128 && (!causal_or_local || persistent_causal);

  return c;
}

// Whether a causal forward of this head dim has a short_causal variant, and
// whether a problem with seqlen_k keys takes it.
constexpr bool fwd_has_short_causal(int d, int dv) {
  return fwd_tile_config(d, dv, true, false, true).persistent;
}
constexpr bool fwd_short_causal(int d, int seqlen_k) {
  return seqlen_k <= FLASH3_FWD_PERSISTENT_CAUSAL_MAX_SEQLEN || (d <= 64 && FLASH3_FWD_D64_CAUSAL_ALWAYS_DYNAMIC);
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
// Head dims with a second, short-sequence tile (64 query rows), and when it runs.
constexpr bool bwd_has_short_tile(int d) {
  return d > 96 && d <= 128 && FLASH3_BWD_D128_SHORT_SEQLEN > 0 &&
         (FLASH3_BWD_D128_TILE_M != 64 || FLASH3_BWD_D128_TILE_M_CAUSAL != 64);
}
constexpr bool bwd_short_tile(int d, int seqlen_q) {
  return bwd_has_short_tile(d) && seqlen_q < FLASH3_BWD_D128_SHORT_SEQLEN;
}

constexpr BwdTileConfig bwd_tile_config(int d, int dv, bool causal_or_local, bool short_q = false) {
  if (d <= 64) return {FLASH3_BWD_D64_TILE_M, 128, 2, 2, 2, 24, 240, false};
  if (d <= 96) return {64, 128, 2, 2, 2, 24, 240, false};
  if (d <= 128) {
    const int tile_m = short_q ? 64 : causal_or_local ? FLASH3_BWD_D128_TILE_M_CAUSAL : FLASH3_BWD_D128_TILE_M;
    return {tile_m, 128, 2, 2, 2, 24, 240, false};
  }
  if (d <= 192) return {64, 64, 2, 2, 2, 24, 240, true};
  (void)dv;
  return {64, 64, 1, 1, 2, 24, 240, true};
}

constexpr int bwd_smem_bytes(const BwdTileConfig& c, int d, int dv, int elem_bytes) {
  return (c.tile_n * (d + dv) + c.q_stages * c.tile_m * d + c.do_stages * c.tile_m * dv +
          (c.split_hdim ? 4 : 2) * c.tile_m * c.tile_n) *
             elem_bytes +
         c.tile_m * d * 4 + (c.q_stages + c.do_stages) * c.tile_m * 4 + 1024;
}

}  // namespace flash3
