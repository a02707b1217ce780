// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Argument validation (validate.cpp, validate_kvcache.cpp, validate_combine.cpp
// over the shared checks of checks.h); lowering is plan/lower.h.
//
// The public entry points validate_forward()/validate_backward()/validate_combine() (flash3.h) run,
// in order:
//   1. structural checks (options, presence, ndim, sizes, dtypes, head dims,
//      shapes, strides, alignment, index limits, outputs overlapping inputs,
//      each other or themselves)                          -> kInvalidArgument / kNotSupported (fp8)
//   2. an empty problem (forward_is_empty / backward_is_empty) stops here: it is
//      valid and needs neither a kernel nor a device
//   3. kernel availability for (dtype, head_dim, head_dim_v) -> kNotSupported
//   4. device checks (pointer kinds of the tensors, the workspace and the
//      varlen arrays opts.cu_seqlens_* / opts.seqused_*; current device is
//      sm_90), skipped only where a unit test turned them off
//      (set_device_checks_for_testing, api/checks.h)      -> kInvalidArgument / kCudaError / kNotSupported
// The pieces are exposed here for forward()/backward() and the unit tests.
#pragma once
#include <string>

#include "combine/combine.h"
#include "common/params.h"
#include "kvcache/append_kv.h"
#include "flash3/flash3.h"

namespace flash3 {

// True where a unit test turned the device checks off (set_device_checks_for_testing).
bool device_check_skipped();

// The options' checks of step 1 (shared by every entry point).
Status check_attention_options(const AttentionOptions& opts);

// Step 1 only.
Status check_forward_structure(const ForwardArgs& args);
Status check_backward_structure(const BackwardArgs& args);

// Batch elements one launch may take: the per-(block, head, batch) grids put
// batch in gridDim.z (<= 65535), and the kernels count tiles and CTAs in
// int32. forward()/backward() split larger batches into several launches. 0
// when a single batch element has too many tiles (validation rejects that).
int64_t batch_per_launch(int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv);

// Whether the (structurally valid) problem has nothing to compute. Forward:
// batch == 0 or seqlen_q == 0 (varlen: opts.num_sequences == 0 or total_q ==
// 0). Backward: batch == 0 or seqlen_q == seqlen_k == 0 (dK / dV are zeroed
// when only seqlen_q is 0); varlen as the forward.
bool forward_is_empty(const ForwardArgs& args);
bool backward_is_empty(const BackwardArgs& args);

// Step 3: NotSupported naming (pass, dtype, head_dim, head_dim_v) and the built
// list; with softcap > 0 the softcap units must be built too.
Status check_kernel_built(bool forward_pass, DType dtype, int head_dim, int head_dim_v, float softcap = 0.f);
// "bf16 64x64, bf16 128x128, ..." or "none".
std::string built_kernels_list(bool forward_pass);

// Layout checks shared with the other entry points' validation (quantize.cpp):
// a written tensor's elements each have their own memory (name.stride[i] /
// name.shape[i] in the messages), and a tensor's last byte offset fits in int64.
Status check_written_tensor(const char* name, const TensorView& t);
Status check_tensor_span(const char* name, const TensorView& t);

// Step 4 (not affected by set_device_checks_for_testing: callers decide).
// ptr must be device memory on the current device (or managed memory);
// a null ptr is accepted (empty tensors).
Status check_device_pointer(const char* name, const void* ptr);
// A view's shape for messages, "(2, 8, 3)".
std::string shape_str(const TensorView& t);
// The current device must be an sm_90 GPU.
Status check_current_device();
Status check_forward_device(const ForwardArgs& args);
Status check_backward_device(const BackwardArgs& args);
// Combine (split-KV), in the same order: step 1 (structure: presence, ndim,
// sizes, dtypes, num_splits and head_dim ranges, shapes, strides, alignment,
// outputs overlapping inputs, each other or themselves), step 2 (nothing to
// compute when batch, seqlen or heads is 0), step 4 (pointers on the current
// device, sm_90; skipped where device checks are off). There is no step 3:
// the combine kernel is in every build.
Status check_combine_structure(const CombineArgs& args);
bool combine_is_empty(const CombineArgs& args);
Status check_combine_device(const CombineArgs& args);

// KV cache (forward_kvcache), in the same order: step 1 (structure, with the
// attention's varlen views through the same checks as forward()), step 2
// (batch 0: nothing to do), step 3 (kernel built), step 4 (pointers, sm_90).
Status check_kvcache_structure(const KVCacheArgs& args);
bool kvcache_is_empty(const KVCacheArgs& args);
Status check_kvcache_device(const KVCacheArgs& args);

// The stream must belong to the current device (the legacy and per-thread
// default streams always do).
Status check_stream_device(cudaStream_t stream);

}  // namespace flash3
