// The host side of the runtime -> compile-time switch (implemented in dispatch.cu,
// the one file that maps (dtype, head_dim, head_dim_v) onto the generated instantiations).
#pragma once
#include "common/params.h"

namespace flash3 {

bool fwd_kernel_built(DType dtype, int head_dim, int head_dim_v);
bool bwd_kernel_built(DType dtype, int head_dim, int head_dim_v);
// Launches the forward for validated params (mask variant chosen inside).
Status launch_forward(const FwdParams& params, cudaStream_t stream);
// Launches preprocess, main kernel and postprocess for validated params;
// params.workspace must hold backward_workspace_bytes(params).
Status launch_backward(const BwdParams& params, cudaStream_t stream);
size_t backward_workspace_bytes(const BwdParams& params);

}  // namespace flash3
