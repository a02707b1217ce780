// d=64 ablation for bf16 (built with -DFLASH3_ABLATION=ON): stage count,
// pingpong and tile_n around the default d=64 config.
#include "launch/fwd_launch.cuh"

namespace flash3 {

namespace {
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
    case FwdSchedule::kD64TileN128: return run_d64<true, 128, 0, 0>(p, stream);
    case FwdSchedule::kD64CausalTileN192: return run_d64<true, 0, 192, 0>(p, stream);
    default: return Status::NotSupported("this FLASH3_FWD_SCHEDULE value for d=64");
  }
}

}  // namespace flash3
