// d=64 ablation for bf16 (built with -DFLASH3_ABLATION=ON): stage count,
// pingpong and tile_n around the default d=64 config, and the previous
// 2-warpgroup tile against the 3-warpgroup default.
#include "launch/fwd_launch.cuh"

namespace flash3 {

namespace {
// The d = 64 configs before 2026-11-30: 2 consumer warpgroups at 240
// registers, 128 x 192 tile unmasked, 128 x 128 causal.
template <int kTileN>
struct D64TwoWarpgroupConfig {
  static constexpr FwdTileConfig value = {128, kTileN, 2, 2, true, true, true, 24, 240};
};

Status run_d64_two_warpgroups(const FwdParams& p, cudaStream_t stream) {
  using E = cutlass::bfloat16_t;
  if (p.is_local) return Status::NotSupported("the 2-warpgroup d=64 ablation with a sliding window (its default)");
  if (p.is_causal) {
    return launch_fwd_variant<FwdTraits<E, 64, 64, D64TwoWarpgroupConfig<128>, MaskCausal>, LptTileScheduler>(p, stream);
  }
  return launch_fwd_variant<FwdTraits<E, 64, 64, D64TwoWarpgroupConfig<192>, MaskNone>, SingleTileScheduler>(p, stream);
}

template <bool kPingpong, int kTileNNoMask, int kTileNCausal, int kStages>
Status run_d64(const FwdParams& p, cudaStream_t stream) {
  using E = cutlass::bfloat16_t;
  if (p.is_local) return Status::NotSupported("d=64 ablation with a sliding window");
  if (p.is_causal) {
    using Cfg = AblatedFwdConfig<DefaultFwdConfig<64, 64, true>, true, kPingpong, kTileNCausal, kStages>;
    return launch_fwd_variant<FwdTraits<E, 64, 64, Cfg, MaskCausal>, LptTileScheduler>(p, stream);
  }
  using Cfg = AblatedFwdConfig<DefaultFwdConfig<64, 64, false>, true, kPingpong, kTileNNoMask, kStages>;
  return launch_fwd_variant<FwdTraits<E, 64, 64, Cfg, MaskNone>, SingleTileScheduler>(p, stream);
}
}  // namespace

Status run_fwd_ablation_d64(const FwdParams& p, cudaStream_t stream) {
  switch (p.schedule) {
    case FwdSchedule::kD64Stages3: return run_d64<true, 0, 0, 3>(p, stream);
    case FwdSchedule::kD64NoPingpong: return run_d64<false, 0, 0, 0>(p, stream);
    case FwdSchedule::kD64TwoWarpgroups: return run_d64_two_warpgroups(p, stream);
    case FwdSchedule::kD64CausalTileN192: return run_d64<true, 0, 192, 0>(p, stream);
    default: return Status::NotSupported("this FLASH3_FWD_SCHEDULE value for d=64");
  }
}

}  // namespace flash3
