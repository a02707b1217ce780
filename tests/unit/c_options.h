// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The C ABI's flash3_options of a C++ AttentionOptions, field by field, for
// the tests that run the same call through both interfaces.
#pragma once
#include "flash3/flash3.h"
#include "flash3/flash3_c.h"

namespace flash3::testutil {

inline flash3_options to_c_options(const AttentionOptions& o) {
  flash3_options c = flash3_default_options();
  c.softmax_scale = o.softmax_scale;
  c.causal = o.causal;
  c.window_left = o.window_left;
  c.window_right = o.window_right;
  c.softcap = o.softcap;
  c.deterministic = o.deterministic;
  c.cu_seqlens_q = o.cu_seqlens_q;
  c.cu_seqlens_k = o.cu_seqlens_k;
  c.max_seqlen_q = o.max_seqlen_q;
  c.max_seqlen_k = o.max_seqlen_k;
  c.num_sequences = o.num_sequences;
  c.seqused_q = o.seqused_q;
  c.seqused_k = o.seqused_k;
  c.pack_gqa = o.pack_gqa;
  c.num_splits = o.num_splits;
  return c;
}

}  // namespace flash3::testutil
