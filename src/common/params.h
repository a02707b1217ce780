// Internal kernel parameters: the public TensorViews lowered once on the host
// (after validation) into plain integers the kernels and host heuristics use.
#pragma once
#include <cstdint>

#include "common/block_info.h"
#include "flash3/flash3.h"

namespace flash3 {

// Forward schedule ablation (only honoured in -DFLASH3_ABLATION=ON builds, bf16 d=128 / d=64):
// the FLASH3_FWD_SCHEDULE environment variable picks it (see docs/performance.md).
enum class FwdSchedule : int {
  kDefault = 0,
  kNoPingpong = 1,
  kNoOverlap = 2,
  kNeither = 3,
  kTileN128 = 4,  // tile_n override (unmasked problems)
  kTileN144 = 5,
  kTileN160 = 6,
  kTileN192 = 7,
  // bf16 d=64 variants
  kD64Stages3 = 8,
  kD64NoPingpong = 9,
  kD64TwoWarpgroups = 10,  // the 2-warpgroup tiles (default before 2026-11-30): 128x192 unmasked, 128x128 causal
  kD64CausalTileN192 = 11,
  // Every build: causal/local tile order (default: grouped longest-first).
  kNoLpt = 12,      // plain m_block-fastest order
  kLptGlobal = 13,  // longest first over all heads at once
};

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null: LSE not stored

  DType dtype = DType::kBFloat16;
  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0;
  int head_dim = 0, head_dim_v = 0;

  // Strides in elements; head_dim stride is 1 for every attention tensor.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // lse row stride is 1

  float softmax_scale = 0.f;       // already defaulted to 1/sqrt(d)
  float softmax_scale_log2 = 0.f;  // softmax_scale * log2(e) (or 1/softcap * log2(e) with softcap)
  float softcap = 0.f;

  // Mask, normalised: causal is local with (left=-1 -> unbounded, right=0).
  bool is_causal = false;
  bool is_local = false;
  int window_left = -1;   // -1: unbounded (only meaningful with is_local)
  int window_right = -1;

  FwdSchedule schedule = FwdSchedule::kDefault;
};

// Lowers validated args. Only call after validate_forward() succeeded.
FwdParams make_fwd_params(const ForwardArgs& args);

// The kernels' view of the mask (shared by forward and backward launches):
// causal is a right bound of 0 with the left unbounded.
inline MaskSpec make_mask_spec(const FwdParams& p) {
  MaskSpec m;
  m.seqlen_q = p.seqlen_q;
  m.seqlen_k = p.seqlen_k;
  m.window_left = p.is_local ? p.window_left : -1;
  m.window_right = p.is_causal ? 0 : (p.is_local ? p.window_right : -1);
  return m;
}

// Backward: the forward's problem description (q/k/v/o, shapes, strides, scale,
// mask) plus the gradients, the statistics and the scratch buffers.
struct BwdParams : FwdParams {
  const void* dout = nullptr;
  const float* lse_in = nullptr;  // (b, hq, sq) natural-log LSE from the forward
  const float* dlse = nullptr;    // optional gradient of the LSE
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dlse_batch_stride = 0, dlse_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  bool deterministic = false;
  void* workspace = nullptr;  // backward_workspace_size() bytes, 256-byte aligned
};

// Lowers validated args (workspace left null; the caller provides it).
BwdParams make_bwd_params(const BackwardArgs& args);
// The mask flags and window of `opts`, normalised as make_fwd_params does.
void apply_mask_options(const AttentionOptions& opts, FwdParams* p);

}  // namespace flash3
