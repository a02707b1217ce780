// Schedule ablation for bf16 d=128 (built with -DFLASH3_ABLATION=ON): the default
// tile config with pingpong and/or the intra-warpgroup overlap switched off.
#include "launch/fwd_launch.cuh"

namespace flash3 {

Status run_fwd_ablation_tile_n(const FwdParams& p, cudaStream_t stream);
Status run_fwd_ablation_d64(const FwdParams& p, cudaStream_t stream);

namespace {
template <bool kOverlap, bool kPingpong>
Status run_sched(const FwdParams& p, cudaStream_t stream) {
  using E = cutlass::bfloat16_t;
  if (p.is_local) return Status::NotSupported("schedule ablation with a sliding window");
  if (p.is_causal) {
    using Cfg = AblatedFwdConfig<DefaultFwdConfig<128, 128, true>, kOverlap, kPingpong>;
    return launch_fwd_variant<FwdTraits<E, 128, 128, Cfg, MaskCausal>, LptTileScheduler>(p, stream);
  }
  using Cfg = AblatedFwdConfig<DefaultFwdConfig<128, 128, false>, kOverlap, kPingpong>;
  return launch_fwd_variant<FwdTraits<E, 128, 128, Cfg, MaskNone>, SingleTileScheduler>(p, stream);
}
}  // namespace

Status run_fwd_ablation(const FwdParams& p, cudaStream_t stream) {
  if (p.dtype == DType::kBFloat16 && p.head_dim == 64 && p.head_dim_v == 64) return run_fwd_ablation_d64(p, stream);
  if (p.dtype != DType::kBFloat16 || p.head_dim != 128 || p.head_dim_v != 128) {
    return Status::NotSupported("schedule ablation outside bf16 d=128");
  }
  switch (p.schedule) {
    case FwdSchedule::kNoPingpong: return run_sched<true, false>(p, stream);
    case FwdSchedule::kNoOverlap: return run_sched<false, true>(p, stream);
    case FwdSchedule::kNeither: return run_sched<false, false>(p, stream);
    default: return run_fwd_ablation_tile_n(p, stream);
  }
}

}  // namespace flash3
