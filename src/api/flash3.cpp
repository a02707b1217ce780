// Public entry points: validate, lower, launch. Nothing here throws: every
// failure, including an unexpected exception, becomes a Status.
#include <cstdint>
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

Status backward(const BackwardArgs& args, cudaStream_t stream) {
  try {
    Status s = validate_backward(args);
    if (!s.ok()) return s;
    if (args.opts.softcap > 0.f) return Status::NotSupported("softcap");
    if (args.opts.cu_seqlens_q != nullptr) return Status::NotSupported("varlen (cu_seqlens)");
    if (backward_is_empty(args)) return Status::Ok();  // nothing to write
    BwdParams params = make_bwd_params(args);
    const size_t need = backward_workspace_bytes(params);
    if (args.workspace != nullptr) {
      if (args.workspace_bytes < need) {
        return Status::Invalid("workspace: " + std::to_string(args.workspace_bytes) +
                               " bytes given, backward_workspace_size() = " + std::to_string(need) + " needed");
      }
      if (reinterpret_cast<uintptr_t>(args.workspace) % 256 != 0) {
        return Status::Invalid("workspace: must be 256-byte aligned");
      }
      params.workspace = args.workspace;
      return launch_backward(params, stream);
    }
    // Stream-ordered scratch: no device-wide synchronisation, reusable by the
    // driver's pool as soon as the kernels that use it have run.
    if (need > 0) FLASH3_CUDA_TRY(cudaMallocAsync(&params.workspace, need, stream));
    Status launched = launch_backward(params, stream);
    Status freed = need > 0 ? cuda_status(cudaFreeAsync(params.workspace, stream), "cudaFreeAsync(workspace)")
                            : Status::Ok();
    return launched.ok() ? freed : launched;
  } catch (const std::exception& e) {
    return internal_error("flash3::backward", e.what());
  } catch (...) {
    return internal_error("flash3::backward", "unknown");
  }
}

// From the shapes of q, k (seqlen_k, KV heads) and v (head_dim_v), the mask
// options and the current device's SM count (the unmasked launch's split
// plan, BwdSplitPlan). 0 for an empty or malformed q. Without a k (a caller
// sizing scratch before it has the other tensors), the split part is sized
// for the worst case, which any k then fits.
size_t backward_workspace_size(const BackwardArgs& args) {
  try {
    const TensorView& q = args.q;
    const TensorView& k = args.k;
    if (args.opts.cu_seqlens_q != nullptr || q.ndim != 4 || args.v.ndim != 4) return 0;
    for (int i = 0; i < 4; ++i)
      if (q.shape[i] <= 0) return 0;
    if (q.shape[0] > INT32_MAX || q.shape[1] > INT32_MAX || q.shape[2] > INT32_MAX || q.shape[3] > 256) return 0;
    BwdParams p;
    p.batch = static_cast<int>(q.shape[0]);
    p.seqlen_q = static_cast<int>(q.shape[1]);
    p.heads_q = static_cast<int>(q.shape[2]);
    p.head_dim = static_cast<int>(q.shape[3]);
    p.head_dim_v = static_cast<int>(args.v.shape[3]);
    apply_mask_options(args.opts, &p);
    const bool have_k = k.ndim == 4 && k.shape[1] > 0 && k.shape[1] <= INT32_MAX && k.shape[2] > 0 &&
                        k.shape[2] <= p.heads_q && p.heads_q % k.shape[2] == 0;
    if (!have_k) return backward_workspace_bytes_bound(p);
    p.seqlen_k = static_cast<int>(k.shape[1]);
    p.heads_kv = static_cast<int>(k.shape[2]);
    return backward_workspace_bytes(p);
  } catch (...) {
    return 0;
  }
}

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
