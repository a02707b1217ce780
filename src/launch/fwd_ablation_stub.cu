// Builds without -DFLASH3_ABLATION=ON: the FLASH3_FWD_SCHEDULE knob is refused.
#include "common/params.h"

namespace flash3 {

Status run_fwd_ablation(const FwdParams&, cudaStream_t) {
  return Status::NotSupported("FLASH3_FWD_SCHEDULE (configure with -DFLASH3_ABLATION=ON)");
}

}  // namespace flash3
