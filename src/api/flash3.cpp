// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Public entry points: validate, lower, launch. Nothing here throws: every
// failure, including an unexpected exception, becomes a Status.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>

#include <cuda_runtime_api.h>

#include "api/validate.h"
#include "common/cuda_check.h"
#include "common/params.h"
#include "flash3/flash3.h"
#include "launch/dispatch.h"
#include "plan/fwd_plan.h"
#include "plan/kvcache_plan.h"
#include "plan/lower.h"

namespace flash3 {

namespace {
Status internal_error(const char* where, const char* what) {
  return {StatusCode::kInternal, std::string(where) + ": unexpected exception: " + what};
}

// Batch elements [b0, b0 + n) of a fixed-length attention tensor or LSE
// (batch is dimension 0 of both); an undefined view stays undefined.
TensorView batch_slice(const TensorView& t, int64_t b0, int64_t n) {
  if (t.data == nullptr || t.ndim == 0) return t;
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + b0 * t.stride[0] * dtype_size(t.dtype);
  s.shape[0] = n;
  return s;
}

// Batch elements per launch for q and k of a fixed-length call (varlen calls
// are one launch and never sliced).
int64_t launch_batch(const TensorView& q, const TensorView& k) {
  return batch_per_launch(q.shape[1], k.shape[1], q.shape[2], k.shape[2]);
}

ForwardArgs forward_slice(const ForwardArgs& a, int64_t b0, int64_t n) {
  ForwardArgs s = a;
  for (TensorView* t : {&s.q, &s.k, &s.v, &s.out, &s.lse, &s.q_descale, &s.k_descale, &s.v_descale})
    *t = batch_slice(*t, b0, n);
  return s;
}

BackwardArgs backward_slice(const BackwardArgs& a, int64_t b0, int64_t n) {
  BackwardArgs s = a;
  for (TensorView* t : {&s.q, &s.k, &s.v, &s.out, &s.dout, &s.lse, &s.dlse, &s.dq, &s.dk, &s.dv})
    *t = batch_slice(*t, b0, n);
  return s;
}

// Whether k's shape can size scratch (a caller may size it from q alone).
bool k_usable(const TensorView& q, const TensorView& k) {
  return k.ndim == 4 && k.shape[1] >= 0 && k.shape[1] <= INT32_MAX && k.shape[2] > 0 && k.shape[2] <= q.shape[2] &&
         q.shape[2] % k.shape[2] == 0;
}

// The scratch bytes of a launch of `batch` elements; the shapes come from q
// (and k / v where usable).
size_t workspace_bytes_for(const BackwardArgs& args, int64_t batch) {
  const TensorView& q = args.q;
  const TensorView& k = args.k;
  BwdParams p;
  p.batch = static_cast<int>(batch);
  p.seqlen_q = static_cast<int>(q.shape[1]);
  p.heads_q = static_cast<int>(q.shape[2]);
  p.head_dim = static_cast<int>(q.shape[3]);
  p.head_dim_v = static_cast<int>(args.v.shape[3]);
  if (!k_usable(q, k)) return backward_workspace_bytes_bound(p);
  p.seqlen_k = static_cast<int>(k.shape[1]);
  p.heads_kv = static_cast<int>(k.shape[2]);
  apply_mask_options(args.opts, p.seqlen_q, p.seqlen_k, &p);
  return plan_backward(p).workspace_bytes;
}
// Varlen scratch (BwdPlan's varlen layout): depends on the totals, the head
// counts and dims, the number of sequences and, through the tile config,
// max_seqlen_q and the mask. 0 for malformed shapes.
size_t varlen_workspace_bytes(const BackwardArgs& args) {
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  if (q.ndim != 3 || k.ndim != 3 || v.ndim != 3 || args.opts.num_sequences <= 0) return 0;
  for (const TensorView* t : {&q, &k, &v})
    for (int i = 0; i < 3; ++i)
      if (t->shape[i] < 0 || t->shape[i] > INT32_MAX) return 0;
  if (q.shape[1] <= 0 || k.shape[1] <= 0 || q.shape[2] <= 0 || q.shape[2] > 256) return 0;
  // Tile maps sized in int32 rows (validation's check_limits): beyond, the call is rejected.
  if (std::max(q.shape[0], k.shape[0]) + int64_t(args.opts.num_sequences) * 256 > int64_t(INT32_MAX) - 1024) return 0;
  BwdParams p;
  p.varlen = true;
  p.batch = args.opts.num_sequences;
  p.seqlen_q = static_cast<int>(q.shape[0]);
  p.seqlen_k = static_cast<int>(k.shape[0]);
  p.heads_q = static_cast<int>(q.shape[1]);
  p.heads_kv = static_cast<int>(k.shape[1]);
  p.head_dim = static_cast<int>(q.shape[2]);
  p.head_dim_v = static_cast<int>(v.shape[2]);
  p.max_seqlen_q = std::max(args.opts.max_seqlen_q, 1);  // as make_bwd_params plans 0
  p.max_seqlen_k = std::max(args.opts.max_seqlen_k, 1);
  apply_mask_options(args.opts, p.max_seqlen_q, p.max_seqlen_k, &p);
  return plan_backward(p).workspace_bytes;
}
// The forward's scratch for q / k / v's shapes and the options: the largest
// of its launches' plans (fixed length: batch slices of batch_per_launch
// elements and the shorter last one; varlen: one launch). 0 for malformed
// shapes or where no launch needs scratch.
size_t forward_workspace_bytes_of(const ForwardArgs& args) {
  FwdParams problem;
  if (!forward_shape_problem(args, args.q.shape[0], &problem)) return 0;
  if (problem.varlen) return plan_forward(problem).workspace.bytes;
  const int64_t batch = args.q.shape[0];
  const int64_t per_launch = std::min(launch_batch(args.q, args.k), batch);
  if (per_launch <= 0) return 0;
  size_t need = 0;
  for (int64_t n : {per_launch, batch % per_launch}) {
    if (n == 0) continue;
    problem.batch = static_cast<int>(n);
    need = std::max(need, plan_forward(problem).workspace.bytes);
  }
  return need;
}

// One launch of a call: its plan, run on the call's scratch (which the plan
// must fit: the size queries sized it from the same plans).
Status plan_too_big(const char* pass, size_t need, size_t sized) {
  return {StatusCode::kInternal, std::string(pass) + ": the launch's plan needs " + std::to_string(need) +
                                     " bytes of workspace, the call sized " + std::to_string(sized)};
}
Status launch_planned(const FwdParams& problem, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  FwdPlan plan = plan_forward(problem);
  if (plan.workspace.bytes > workspace_bytes) return plan_too_big("forward", plan.workspace.bytes, workspace_bytes);
  plan.params.workspace = workspace;
  return launch_forward(plan, stream);
}
Status launch_planned(const BwdParams& problem, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  BwdPlan plan = plan_backward(problem);
  if (plan.workspace_bytes > workspace_bytes) return plan_too_big("backward", plan.workspace_bytes, workspace_bytes);
  plan.params.workspace = workspace;
  return launch_backward(plan, stream);
}

// A call's scratch: the caller's (checked: size and 256-byte alignment) or,
// without one, stream-ordered memory from the driver's pool (no device-wide
// synchronisation; reusable as soon as the kernels that use it have run),
// which release() gives back after the launches.
struct Scratch {
  void* ptr = nullptr;
  bool owned = false;
  Status acquire(void* given, size_t given_bytes, size_t need, const char* size_fn, cudaStream_t stream) {
    if (given != nullptr) {
      if (given_bytes < need) {
        return Status::Invalid("workspace: " + std::to_string(given_bytes) + " bytes given, " + size_fn + " = " +
                               std::to_string(need) + " needed");
      }
      if (reinterpret_cast<uintptr_t>(given) % 256 != 0) return Status::Invalid("workspace: must be 256-byte aligned");
      ptr = given;
      return Status::Ok();
    }
    if (need == 0) return Status::Ok();
    FLASH3_RETURN_IF_ERROR(cuda_call(cudaMallocAsync(&ptr, need, stream), "cudaMallocAsync(workspace)"));
    owned = true;
    return Status::Ok();
  }
  // The launches' status, or the free's error after successful launches.
  Status release(Status launched, cudaStream_t stream) {
    if (!owned) return launched;
    Status freed = cuda_call(cudaFreeAsync(ptr, stream), "cudaFreeAsync(workspace)");
    return launched.ok() ? freed : launched;
  }
};
}  // namespace

Status forward(const ForwardArgs& args, cudaStream_t stream) {
  try {
    Status s = validate_forward(args);
    if (!s.ok()) return s;
    // Nothing to compute (varlen: no sequences or no query rows), nothing launched.
    if (forward_is_empty(args)) return Status::Ok();
    if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_stream_device(stream));
    const size_t need = forward_workspace_size(args);
    Scratch ws;
    FLASH3_RETURN_IF_ERROR(ws.acquire(args.workspace, args.workspace_bytes, need, "forward_workspace_size()", stream));
    // Varlen: one launch over all sequences (the batch lives in cu_seqlens).
    // Fixed length: batch slices share the scratch (ordered on the stream).
    Status launched = Status::Ok();
    if (args.opts.cu_seqlens_q != nullptr) {
      launched = launch_planned(make_fwd_params(args), ws.ptr, need, stream);
    } else {
      const int64_t batch = args.q.shape[0];
      const int64_t per_launch = launch_batch(args.q, args.k);
      for (int64_t b0 = 0; b0 < batch && launched.ok(); b0 += per_launch) {
        const ForwardArgs slice = forward_slice(args, b0, std::min(per_launch, batch - b0));
        launched = launch_planned(make_fwd_params(slice), ws.ptr, need, stream);
      }
    }
    return ws.release(launched, stream);
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
    if (backward_is_empty(args)) return Status::Ok();  // nothing to write
    if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_stream_device(stream));
    const size_t need = backward_workspace_size(args);
    Scratch ws;
    FLASH3_RETURN_IF_ERROR(ws.acquire(args.workspace, args.workspace_bytes, need, "backward_workspace_size()", stream));
    // Launches of consecutive batch slices share the scratch: they are ordered
    // on the stream. Varlen: one launch over all sequences.
    const bool varlen = args.opts.cu_seqlens_q != nullptr;
    const int64_t batch = varlen ? 1 : args.q.shape[0];
    const int64_t per_launch = varlen ? 1 : launch_batch(args.q, args.k);
    Status launched = Status::Ok();
    if (varlen) launched = launch_planned(make_bwd_params(args), ws.ptr, need, stream);
    for (int64_t b0 = 0; !varlen && b0 < batch && launched.ok(); b0 += per_launch) {
      const BackwardArgs slice = backward_slice(args, b0, std::min(per_launch, batch - b0));
      launched = launch_planned(make_bwd_params(slice), ws.ptr, need, stream);
    }
    return ws.release(launched, stream);
  } catch (const std::exception& e) {
    return internal_error("flash3::backward", e.what());
  } catch (...) {
    return internal_error("flash3::backward", "unknown");
  }
}

size_t kvcache_workspace_size(const KVCacheArgs& args) {
  try {
    if (!check_kvcache_structure(args).ok() || kvcache_is_empty(args)) return 0;
    return plan_kvcache(args).bytes;
  } catch (...) {
    return 0;
  }
}

Status forward_kvcache(const KVCacheArgs& args, cudaStream_t stream) {
  try {
    FLASH3_RETURN_IF_ERROR(validate_kvcache(args));
    if (kvcache_is_empty(args)) return Status::Ok();
    if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_stream_device(stream));
    KVCachePlan plan = plan_kvcache(args);
    Scratch ws;
    FLASH3_RETURN_IF_ERROR(
        ws.acquire(args.workspace, args.workspace_bytes, plan.bytes, "kvcache_workspace_size()", stream));
    // The append (and rotary) first: the attention then reads the updated
    // cache and the rotated q, ordered on the stream.
    FwdParams& attention = plan.attention.params;
    if (plan.append.rotary_dim > 0) {
      plan.append.q_out = static_cast<char*>(ws.ptr) + plan.q_rot_offset;
      attention.q = plan.append.q_out;
      attention.q_row_stride = plan.append.qo_row_stride;
      attention.q_head_stride = plan.append.qo_head_stride;
    }
    Status launched = launch_append_kv(plan.append, stream);
    if (launched.ok() && plan.has_queries) {
      attention.workspace = ws.ptr;
      launched = launch_forward(plan.attention, stream);
    }
    return ws.release(launched, stream);
  } catch (const std::exception& e) {
    return internal_error("flash3::forward_kvcache", e.what());
  } catch (...) {
    return internal_error("flash3::forward_kvcache", "unknown");
  }
}

Status forward_plan(DType dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim,
                    int head_dim_v, const AttentionOptions& opts, ForwardPlan* plan) {
  try {
    if (plan == nullptr) return Status::Invalid("plan is null");
    FLASH3_RETURN_IF_ERROR(check_attention_options(opts));
    auto need = [](const char* name, int v, int lo) {
      return v >= lo ? Status::Ok()
                     : Status::Invalid(std::string(name) + " is " + std::to_string(v) + "; expected >= " +
                                       std::to_string(lo));
    };
    FLASH3_RETURN_IF_ERROR(need("batch", batch, 0));
    FLASH3_RETURN_IF_ERROR(need("seqlen_q", seqlen_q, 0));
    FLASH3_RETURN_IF_ERROR(need("seqlen_k", seqlen_k, 0));
    FLASH3_RETURN_IF_ERROR(need("heads_q", heads_q, 1));
    FLASH3_RETURN_IF_ERROR(need("heads_kv", heads_kv, 1));
    FLASH3_RETURN_IF_ERROR(need("head_dim", head_dim, 1));
    FLASH3_RETURN_IF_ERROR(need("head_dim_v", head_dim_v, 1));
    for (const auto& [name, d] : {std::pair<const char*, int>{"head_dim", head_dim}, {"head_dim_v", head_dim_v}})
      if (d % 8 != 0 || d > 256)
        return Status::Invalid(std::string(name) + " is " + std::to_string(d) + "; expected a multiple of 8 in [8, 256]");
    // The kernels add rows, columns and windows in int32 (validation's limit).
    if (int64_t(seqlen_q) + seqlen_k > int64_t(INT32_MAX) - 1024)
      return Status::Invalid("seqlen_q + seqlen_k is " + std::to_string(int64_t(seqlen_q) + seqlen_k) +
                             "; expected <= " + std::to_string(int64_t(INT32_MAX) - 1024) +
                             " (the kernels index rows in int32)");
    if (heads_q % heads_kv != 0)
      return Status::Invalid("heads_q (" + std::to_string(heads_q) + ") is not a multiple of heads_kv (" +
                             std::to_string(heads_kv) + ")");
    if (dtype != DType::kFloat16 && dtype != DType::kBFloat16)
      return Status::Invalid(std::string("dtype is ") + dtype_name(dtype) + "; expected fp16 or bf16");
    // The KV-cache / varlen launch: batch sequences of at most these lengths.
    FwdParams p;
    p.dtype = dtype;
    p.varlen = true;
    p.batch = batch;
    p.seqlen_q = static_cast<int>(std::min<int64_t>(int64_t(batch) * seqlen_q, INT32_MAX));
    p.seqlen_k = seqlen_k;
    p.max_seqlen_q = std::max(seqlen_q, 1);
    p.max_seqlen_k = std::max(seqlen_k, 1);
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.head_dim = head_dim;
    p.head_dim_v = head_dim_v;
    p.softcap = opts.softcap;
    p.pack_gqa = opts.pack_gqa;
    p.num_splits = opts.num_splits;
    apply_mask_options(opts, p.max_seqlen_q, p.max_seqlen_k, &p);
    const FwdPlan decided = plan_forward(p);
    plan->pack_gqa = decided.params.pack_gqa;
    plan->num_splits = decided.params.num_splits;
    return Status::Ok();
  } catch (const std::exception& e) {
    return internal_error("flash3::forward_plan", e.what());
  } catch (...) {
    return internal_error("flash3::forward_plan", "unknown");
  }
}

size_t forward_workspace_size(const ForwardArgs& args) {
  try {
    if (!check_attention_options(args.opts).ok()) return 0;  // validation would reject the call
    return forward_workspace_bytes_of(args);
  } catch (...) {
    return 0;
  }
}

// From the shapes of q, k (seqlen_k, KV heads) and v (head_dim_v), the mask
// options and the current device's SM count (the unmasked launch's split
// plan, BwdSplitPlan); the most any of the call's batch-slice launches needs.
// 0 for an empty or malformed q. Without a k (a caller sizing scratch before
// it has the other tensors), the split part is sized for the worst case,
// which any k then fits. Varlen (cu_seqlens_q set): from q's, k's and v's
// (total, heads, dim) shapes, opts.num_sequences and opts.max_seqlen_q.
size_t backward_workspace_size(const BackwardArgs& args) {
  try {
    if (!check_attention_options(args.opts).ok()) return 0;  // validation would reject the call
    const TensorView& q = args.q;
    if (args.opts.cu_seqlens_q != nullptr) return varlen_workspace_bytes(args);
    if (q.ndim != 4 || args.v.ndim != 4) return 0;
    for (int i = 0; i < 4; ++i)
      if (q.shape[i] <= 0) return 0;
    if (q.shape[0] > INT32_MAX || q.shape[1] > INT32_MAX || q.shape[2] > INT32_MAX || q.shape[3] > 256) return 0;
    const TensorView& k = args.k;
    const bool have_k = k_usable(q, k);
    int64_t per_launch = batch_per_launch(q.shape[1], have_k ? k.shape[1] : q.shape[1], q.shape[2],
                                          have_k ? k.shape[2] : q.shape[2]);
    if (per_launch <= 0) return 0;
    const int64_t batch = q.shape[0];
    per_launch = std::min(per_launch, batch);
    size_t need = workspace_bytes_for(args, per_launch);
    if (batch % per_launch != 0) need = std::max(need, workspace_bytes_for(args, batch % per_launch));
    return need;
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

// Split-KV combine: validate, lower, launch (one launch whatever the size: the
// kernel loops over rows in int64).
Status combine(const CombineArgs& args, cudaStream_t stream) {
  try {
    FLASH3_RETURN_IF_ERROR(validate_combine(args));
    if (combine_is_empty(args)) return Status::Ok();
    if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_stream_device(stream));
    return launch_combine(make_combine_params(args), stream);
  } catch (const std::exception& e) {
    return internal_error("flash3::combine", e.what());
  } catch (...) {
    return internal_error("flash3::combine", "unknown");
  }
}

}  // namespace flash3
