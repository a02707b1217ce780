// tile_n ablation for unmasked bf16 d=128 (built with -DFLASH3_ABLATION=ON).
#include "launch/fwd_launch.cuh"

namespace flash3 {

namespace {
template <int kTileN>
Status run_tile(const FwdParams& p, cudaStream_t stream) {
  if (p.is_causal || p.is_local) return Status::NotSupported("tile_n ablation with a mask");
  using Cfg = AblatedFwdConfig<DefaultFwdConfig<128, 128, false>, true, true, kTileN>;
  return launch_fwd_variant<FwdTraits<cutlass::bfloat16_t, 128, 128, Cfg, MaskNone>, SingleTileScheduler>(p, stream);
}
}  // namespace

Status run_fwd_ablation_tile_n(const FwdParams& p, cudaStream_t stream) {
  switch (p.schedule) {
    case FwdSchedule::kTileN128: return run_tile<128>(p, stream);
    case FwdSchedule::kTileN144: return run_tile<144>(p, stream);
    case FwdSchedule::kTileN160: return run_tile<160>(p, stream);
    case FwdSchedule::kTileN192: return run_tile<192>(p, stream);
    default: return Status::Invalid("unknown FLASH3_FWD_SCHEDULE value");
  }
}

}  // namespace flash3
