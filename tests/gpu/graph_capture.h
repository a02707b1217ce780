// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Capturing one flash3::forward into a CUDA graph, shared by
// test_fwd_workspace_gpu.cpp and test_splitkv_gpu.cpp: the capture, the
// graph's nodes checked (no allocation or free: the caller workspace covers
// everything the forward needs), and the instantiation.
#pragma once

#include <cstddef>
#include <vector>

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_test_util.h"

namespace flash3::gputest {

// A captured graph and its executable, destroyed with it.
struct CapturedForward {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedForward() = default;
  CapturedForward(const CapturedForward&) = delete;
  CapturedForward& operator=(const CapturedForward&) = delete;
  ~CapturedForward() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// Captures flash3::forward(a, stream) into g (the stream idle before) and
// instantiates it; the graph must hold no allocation or free node. *kernels
// (optional) receives its kernel node count. Fatal failures return early:
// callers check HasFatalFailure().
inline void capture_forward(const flash3::ForwardArgs& a, cudaStream_t stream, CapturedForward* g,
                            int* kernels = nullptr) {
  FLASH3_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const flash3::Status st = flash3::forward(a, stream);
  const cudaError_t end = cudaStreamEndCapture(stream, &g->graph);
  ASSERT_TRUE(st.ok()) << "forward during capture: " << st.message;
  ASSERT_EQ(end, cudaSuccess) << "cudaStreamEndCapture: " << cudaGetErrorString(end);
  size_t n_nodes = 0;
  FLASH3_CUDA_OK(cudaGraphGetNodes(g->graph, nullptr, &n_nodes));
  ASSERT_GT(n_nodes, 0u) << "the captured graph is empty";
  std::vector<cudaGraphNode_t> nodes(n_nodes);
  FLASH3_CUDA_OK(cudaGraphGetNodes(g->graph, nodes.data(), &n_nodes));
  int n_kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    FLASH3_CUDA_OK(cudaGraphNodeGetType(node, &type));
    n_kernels += type == cudaGraphNodeTypeKernel;
    EXPECT_NE(type, cudaGraphNodeTypeMemAlloc) << "the graph allocates despite the caller workspace";
    EXPECT_NE(type, cudaGraphNodeTypeMemFree) << "the graph frees despite the caller workspace";
  }
  if (kernels != nullptr) *kernels = n_kernels;
  FLASH3_CUDA_OK(cudaGraphInstantiate(&g->exec, g->graph, 0));
}

}  // namespace flash3::gputest
