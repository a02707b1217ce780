// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The forward's workspace on the CPU: forward_workspace_size() (C++) and
// flash3_forward_workspace_size() (C ABI) for fixed-length calls (0 unless the
// persistent causal kernels need their tile counter), varlen calls (the
// per-sequence maps and the tile map) and malformed shapes (0); a caller
// workspace that is too small or misaligned is rejected after validation and
// before anything is launched, by flash3::forward and by
// flash3_forward_with_workspace alike. Fake, aligned device addresses with
// Device checks off (skip_device_check.h): nothing is dereferenced or launched.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "c_options.h"
#include "config/tile_size.h"
#include "flash3/flash3.h"
#include "flash3/flash3_c.h"
#include "launch/dispatch.h"  // kFwdTileCounterBytes, fwd_pack_kernel_built
#include "skip_device_check.h"
#include "status_matchers.h"

namespace {

using flash3::unittest::IsError;

using flash3::DType;
using flash3::ForwardArgs;
using flash3::Status;
using flash3::StatusCode;
using flash3::TensorView;

void* fake(uintptr_t addr) { return reinterpret_cast<void*>(addr); }

struct Dims {
  int64_t b = 2, sq = 1024, sk = 1024, hq = 8, hkv = 8, d = 128, dv = 128;
  DType dt = DType::kBFloat16;
  bool causal = false;
};

// (b, s, h, d) tensors and (b, hq, sq) lse, contiguous.
ForwardArgs fixed(const Dims& p) {
  ForwardArgs a;
  const int64_t q[4] = {p.b, p.sq, p.hq, p.d}, k[4] = {p.b, p.sk, p.hkv, p.d}, v[4] = {p.b, p.sk, p.hkv, p.dv},
                o[4] = {p.b, p.sq, p.hq, p.dv}, l[3] = {p.b, p.hq, p.sq};
  a.q = TensorView::contiguous(fake(0x10000000), p.dt, 4, q);
  a.k = TensorView::contiguous(fake(0x20000000), p.dt, 4, k);
  a.v = TensorView::contiguous(fake(0x30000000), p.dt, 4, v);
  a.out = TensorView::contiguous(fake(0x40000000), p.dt, 4, o);
  a.lse = TensorView::contiguous(fake(0x50000000), DType::kFloat32, 3, l);
  a.opts.causal = p.causal;
  return a;
}

struct Varlen {
  int sequences = 3;
  int64_t total_q = 1024, total_k = 2048, hq = 8, hkv = 2, d = 128, dv = 128;
  int max_q = 512, max_k = 1024;
  DType dt = DType::kBFloat16;
  bool causal = true;
  int pack_gqa = -1;
};

// (total, h, d) tensors and (hq, total_q) lse; fake prefix-sum arrays.
ForwardArgs varlen(const Varlen& p) {
  ForwardArgs a;
  const int64_t q[3] = {p.total_q, p.hq, p.d}, k[3] = {p.total_k, p.hkv, p.d}, v[3] = {p.total_k, p.hkv, p.dv},
                o[3] = {p.total_q, p.hq, p.dv}, l[2] = {p.hq, p.total_q};
  a.q = TensorView::contiguous(fake(0x10000000), p.dt, 3, q);
  a.k = TensorView::contiguous(fake(0x20000000), p.dt, 3, k);
  a.v = TensorView::contiguous(fake(0x30000000), p.dt, 3, v);
  a.out = TensorView::contiguous(fake(0x40000000), p.dt, 3, o);
  a.lse = TensorView::contiguous(fake(0x50000000), DType::kFloat32, 2, l);
  a.opts.cu_seqlens_q = static_cast<const int*>(fake(0xA0000000));
  a.opts.cu_seqlens_k = static_cast<const int*>(fake(0xB0000000));
  a.opts.num_sequences = p.sequences;
  a.opts.max_seqlen_q = p.max_q;
  a.opts.max_seqlen_k = p.max_k;
  a.opts.causal = p.causal;
  a.opts.pack_gqa = p.pack_gqa;
  return a;
}

size_t ws(const ForwardArgs& a) { return flash3::forward_workspace_size(a); }

// The C ABI's view of the same arguments.
flash3_tensor to_c(const TensorView& t) {
  flash3_tensor c;
  std::memset(&c, 0, sizeof(c));
  c.data = t.data;
  c.dtype = static_cast<int32_t>(t.dtype);
  c.ndim = t.ndim;
  for (int i = 0; i < 4; ++i) {
    c.shape[i] = t.shape[i];
    c.stride[i] = t.stride[i];
  }
  return c;
}

flash3_options to_c(const flash3::AttentionOptions& o) { return flash3::testutil::to_c_options(o); }

struct CArgs {
  flash3_tensor q, k, v, out, lse;
  flash3_options opts;
  explicit CArgs(const ForwardArgs& a)
      : q(to_c(a.q)), k(to_c(a.k)), v(to_c(a.v)), out(to_c(a.out)), lse(to_c(a.lse)), opts(to_c(a.opts)) {}
  size_t size() const { return flash3_forward_workspace_size(&q, &k, &v, &opts); }
  flash3_status forward(void* workspace, size_t bytes) const {
    return flash3_forward_with_workspace(&q, &k, &v, &out, &lse, &opts, workspace, bytes, nullptr);
  }
};

class FwdWorkspace : public flash3::testutil::SkipDeviceCheckTest {};

// ----------------------------------------------------------------------------
// Sizes.
// ----------------------------------------------------------------------------
TEST_F(FwdWorkspace, FixedLengthUnmaskedNeedsNone) {
  for (int64_t d : {64, 96, 128, 192, 256})
    for (int64_t sk : {1, 128, 1024, 8192})
      for (int64_t hkv : {8, 2, 1}) {
        Dims p;
        p.d = p.dv = d;
        p.sk = sk;
        p.hkv = hkv;
        SCOPED_TRACE(testing::Message() << "d=" << d << " sk=" << sk << " hkv=" << hkv);
        EXPECT_EQ(ws(fixed(p)), 0u);
        ForwardArgs a = fixed(p);
        a.opts.softcap = 30.f;
        EXPECT_EQ(ws(a), 0u);
        a.opts.window_left = 100;  // a sliding window (local where it cuts anything), not causal
        a.opts.window_right = 100;
        EXPECT_EQ(ws(a), 0u);
      }
}

// The persistent causal kernels (DynamicLptTileScheduler) claim tiles with a
// counter: causal, d <= 128, seqlen_k <= kFwdPersistentCausalMaxSeqlen or
// d <= 64. None where the launch packs GQA heads or the mask is local.
TEST_F(FwdWorkspace, FixedLengthCausalTileCounter) {
  constexpr size_t kCounter = flash3::kFwdTileCounterBytes;
  EXPECT_EQ(kCounter, 256u);
  constexpr int64_t kShort = flash3::kFwdPersistentCausalMaxSeqlen;
  Dims p;
  p.causal = true;
  p.d = p.dv = 128;
  p.sq = p.sk = 1024;
  EXPECT_EQ(ws(fixed(p)), kCounter) << "causal bf16 d=128 seqlen 1024";
  p.dt = DType::kFloat16;
  EXPECT_EQ(ws(fixed(p)), kCounter) << "causal fp16 d=128 seqlen 1024";
  p.dt = DType::kBFloat16;
  // Independent of the batch (slices share it) and of seqlen_q.
  for (int64_t b : {1, 7, 1000}) {
    p.b = b;
    EXPECT_EQ(ws(fixed(p)), kCounter) << "b=" << b;
  }
  p.b = 2;
  p.sq = 1;
  EXPECT_EQ(ws(fixed(p)), kCounter) << "sq=1";
  p.sq = 1024;
  // The seqlen_k bound (d = 128): short takes the persistent kernel, long does not.
  p.sk = kShort;
  EXPECT_EQ(ws(fixed(p)), kCounter) << "sk=" << kShort;
  p.sk = kShort + 1;
  EXPECT_EQ(ws(fixed(p)), 0u) << "sk=" << kShort + 1;
  // d <= 64: every seqlen_k.
  p.d = p.dv = 64;
  EXPECT_EQ(ws(fixed(p)), kCounter) << "d=64 sk=" << kShort + 1;
  p.sk = 65536;
  EXPECT_EQ(ws(fixed(p)), kCounter) << "d=64 sk=65536";
  // d = 96 follows d = 128's rule.
  p.d = p.dv = 96;
  p.sk = 1024;
  EXPECT_EQ(ws(fixed(p)), kCounter) << "d=96 sk=1024";
  p.sk = kShort + 1;
  EXPECT_EQ(ws(fixed(p)), 0u) << "d=96 sk=" << kShort + 1;
  // d > 128: one tile per CTA, no counter.
  for (int64_t d : {192, 256}) {
    p.d = p.dv = d;
    p.sk = 1024;
    EXPECT_EQ(ws(fixed(p)), 0u) << "d=" << d;
  }
  p.d = 192;
  p.dv = 128;
  EXPECT_EQ(ws(fixed(p)), 0u) << "d=192 dv=128";
  // Local (causal with a finite left side): no counter; a left side that cuts
  // nothing is plain causal.
  p.d = p.dv = 128;
  ForwardArgs a = fixed(p);
  a.opts.window_left = 256;
  EXPECT_EQ(ws(a), 0u) << "causal local";
  a.opts.window_left = 1 << 30;
  EXPECT_EQ(ws(a), kCounter) << "causal, window_left cutting nothing";
  // Window (-1, 0) without causal is causal.
  a = fixed(p);
  a.opts.causal = false;
  a.opts.window_right = 0;
  EXPECT_EQ(ws(a), kCounter) << "window (-1, 0)";
  // softcap runs its own (unpacked) causal kernels, with the counter.
  a = fixed(p);
  a.opts.softcap = 30.f;
  EXPECT_EQ(ws(a), kCounter) << "causal softcap";
}

// GQA: a packed launch (one tile per CTA) needs no counter; pack_gqa 0, MHA,
// softcap and builds without the packgqa unit run the unpacked persistent kernel.
TEST_F(FwdWorkspace, FixedLengthCausalPackGqa) {
  constexpr size_t kCounter = flash3::kFwdTileCounterBytes;
  const bool pack_built = flash3::fwd_pack_kernel_built(DType::kBFloat16, 128, 128);
  Dims p;
  p.causal = true;
  p.hq = 8;
  p.hkv = 2;
  ForwardArgs a = fixed(p);
  a.opts.pack_gqa = 0;
  EXPECT_EQ(ws(a), kCounter) << "pack_gqa 0";
  a.opts.pack_gqa = 1;
  EXPECT_EQ(ws(a), pack_built ? 0u : kCounter) << "pack_gqa 1, packgqa unit built: " << pack_built;
  a.opts.softcap = 30.f;
  EXPECT_EQ(ws(a), kCounter) << "pack_gqa 1 with softcap (never packed)";
  // Heuristic: decode-like seqlen_q 1 packs (where the unit exists).
  p.sq = 1;
  a = fixed(p);
  EXPECT_EQ(ws(a), pack_built ? 0u : kCounter) << "pack_gqa -1, sq=1, packgqa unit built: " << pack_built;
  // MHA never packs.
  p.hkv = 8;
  a = fixed(p);
  a.opts.pack_gqa = 1;
  EXPECT_EQ(ws(a), kCounter) << "MHA, pack_gqa 1";
}

TEST_F(FwdWorkspace, VarlenNeedsMaps) {
  for (bool causal : {false, true})
    for (int pack : {-1, 0, 1}) {
      Varlen p;
      p.causal = causal;
      p.pack_gqa = pack;
      SCOPED_TRACE(testing::Message() << "causal=" << causal << " pack_gqa=" << pack);
      const size_t base = ws(varlen(p));
      EXPECT_GT(base, 0u);
      // More sequences, the same totals: more maps.
      Varlen more = p;
      more.sequences = 12;
      const size_t twelve = ws(varlen(more));
      EXPECT_GT(twelve, base);
      more.sequences = 1000;
      EXPECT_GT(ws(varlen(more)), twelve);
      // More query rows: a longer tile map.
      Varlen longer = p;
      longer.total_q = 8 * p.total_q;
      EXPECT_GT(ws(varlen(longer)), base);
      // Keys add nothing (the maps are per sequence and per query tile).
      Varlen keys = p;
      keys.total_k = 4 * p.total_k;
      EXPECT_EQ(ws(varlen(keys)), base);
      // No sequences: nothing to compute.
      Varlen none = p;
      none.sequences = 0;
      EXPECT_EQ(ws(varlen(none)), 0u);
    }
}

// The tile map grows by one entry per tile_m query rows, by g entries where the
// launch packs the g query heads of a KV head into one tile's rows.
TEST_F(FwdWorkspace, VarlenTileMapFollowsPacking) {
  const int tile_m = flash3::fwd_tile_config(128, 128, true, false).tile_m;
  const bool pack_built = flash3::fwd_pack_kernel_built(DType::kBFloat16, 128, 128);
  Varlen p;
  p.total_q = 8 * tile_m;
  auto grow = [&](int pack, int64_t tiles) {
    Varlen a = p, b = p;
    a.pack_gqa = b.pack_gqa = pack;
    b.total_q = p.total_q + tiles * tile_m;
    return ws(varlen(b)) - ws(varlen(a));
  };
  const size_t entry = grow(0, 1);
  ASSERT_GT(entry, 0u);
  EXPECT_EQ(grow(0, 5), 5 * entry) << "unpacked: one entry per tile_m rows";
  const int64_t g = p.hq / p.hkv;
  EXPECT_EQ(grow(1, 1), (pack_built ? g : 1) * entry) << "pack_gqa 1, packgqa unit built: " << pack_built;
  EXPECT_EQ(grow(-1, 1), (pack_built ? g : 1) * entry) << "varlen packs by default where it can";
  // MHA: nothing to pack.
  p.hkv = p.hq;
  EXPECT_EQ(grow(1, 1), entry);
}

TEST_F(FwdWorkspace, MalformedShapesNeedNone) {
  Dims p;
  p.causal = true;
  const ForwardArgs good = fixed(p);
  ASSERT_GT(ws(good), 0u);
  ForwardArgs a = good;
  a.q = TensorView{};
  EXPECT_EQ(ws(a), 0u) << "no q";
  a = good;
  a.k = TensorView{};
  EXPECT_EQ(ws(a), 0u) << "no k";
  a = good;
  a.v.ndim = 3;
  EXPECT_EQ(ws(a), 0u) << "v 3-D";
  a = good;
  a.q.shape[1] = -1;
  EXPECT_EQ(ws(a), 0u) << "negative seqlen_q";
  a = good;
  a.k.shape[1] = int64_t(1) << 32;
  EXPECT_EQ(ws(a), 0u) << "seqlen_k beyond int32";
  a = good;
  a.k.shape[2] = 3;  // 8 query heads
  EXPECT_EQ(ws(a), 0u) << "heads_q not a multiple of heads_kv";
  a = good;
  a.k.shape[2] = 0;
  EXPECT_EQ(ws(a), 0u) << "no KV heads";
  a = good;
  a.opts.cu_seqlens_q = static_cast<const int*>(fake(0xA0000000));  // varlen with 4-D tensors
  a.opts.cu_seqlens_k = static_cast<const int*>(fake(0xB0000000));
  a.opts.num_sequences = 2;
  EXPECT_EQ(ws(a), 0u) << "varlen with 4-D tensors";
  ForwardArgs v = varlen({});
  ASSERT_GT(ws(v), 0u);
  v.opts.num_sequences = -1;
  EXPECT_EQ(ws(v), 0u) << "negative num_sequences";
  v = varlen({});
  v.q.ndim = 4;
  EXPECT_EQ(ws(v), 0u) << "varlen with a 4-D q";
  v = varlen({});
  v.k.shape[1] = 3;
  EXPECT_EQ(ws(v), 0u) << "varlen heads_q not a multiple of heads_kv";
}

// ----------------------------------------------------------------------------
// C ABI.
// ----------------------------------------------------------------------------
TEST_F(FwdWorkspace, CAbiSizeAgreesWithCpp) {
  std::vector<ForwardArgs> cases;
  for (bool causal : {false, true})
    for (int64_t d : {64, 128, 256})
      for (int64_t sk : {1000, 10000})
        for (int pack : {-1, 0, 1}) {
          Dims p;
          p.causal = causal;
          p.d = p.dv = d;
          p.sk = sk;
          p.hkv = 2;
          ForwardArgs a = fixed(p);
          a.opts.pack_gqa = pack;
          cases.push_back(a);
        }
  for (int n : {1, 3, 100})
    for (bool causal : {false, true})
      for (int pack : {-1, 0, 1}) {
        Varlen p;
        p.sequences = n;
        p.causal = causal;
        p.pack_gqa = pack;
        cases.push_back(varlen(p));
      }
  ForwardArgs empty;
  cases.push_back(empty);
  size_t nonzero = 0;
  for (const ForwardArgs& a : cases) {
    const size_t cpp = ws(a);
    nonzero += cpp > 0;
    EXPECT_EQ(CArgs(a).size(), cpp) << "q.ndim=" << a.q.ndim << " d=" << a.q.shape[a.q.ndim > 0 ? a.q.ndim - 1 : 0]
                                    << " causal=" << a.opts.causal << " pack_gqa=" << a.opts.pack_gqa;
  }
  EXPECT_GT(nonzero, 0u);
  // NULL tensors and options, a bad struct_size, a bad dtype: 0.
  EXPECT_EQ(flash3_forward_workspace_size(nullptr, nullptr, nullptr, nullptr), 0u);
  Dims p;
  p.causal = true;
  CArgs c(fixed(p));
  ASSERT_EQ(c.size(), flash3::kFwdTileCounterBytes);
  EXPECT_EQ(flash3_forward_workspace_size(&c.q, &c.k, &c.v, nullptr), 0u) << "NULL opts: not causal";
  flash3_options zeroed;
  std::memset(&zeroed, 0, sizeof(zeroed));  // no struct_size: rejected, though causal
  zeroed.causal = 1;
  EXPECT_EQ(flash3_forward_workspace_size(&c.q, &c.k, &c.v, &zeroed), 0u);
  CArgs bad = c;
  bad.q.dtype = 99;
  EXPECT_EQ(bad.size(), 0u);
  // Varlen with NULL opts is fixed length: 3-D tensors are malformed there.
  CArgs vc(varlen({}));
  ASSERT_GT(vc.size(), 0u);
  EXPECT_EQ(flash3_forward_workspace_size(&vc.q, &vc.k, &vc.v, nullptr), 0u);
}

// ----------------------------------------------------------------------------
// Caller workspace errors: checked after validation and the device checks
// (skipped here), before any launch. Reaching them needs a built kernel;
// without one the kernel check answers first.
// ----------------------------------------------------------------------------

// Built (bf16, d) for a check that needs validation to pass; 0 if none.
int64_t built_bf16_head_dim() {
  for (int64_t d : {128, 64, 96})
    if (flash3::forward_is_built(DType::kBFloat16, int(d), int(d))) return d;
  return 0;
}

TEST_F(FwdWorkspace, CallerWorkspaceTooSmallOrMisaligned) {
  const int64_t d = built_bf16_head_dim();
  Dims p;
  p.causal = true;
  p.d = p.dv = d > 0 ? d : 128;
  Varlen vp;
  vp.d = vp.dv = p.d;
  for (const ForwardArgs& base : {fixed(p), varlen(vp)}) {
    const bool is_varlen = base.q.ndim == 3;
    SCOPED_TRACE(is_varlen ? "varlen" : "fixed length, causal");
    const size_t need = ws(base);
    ASSERT_GT(need, 0u);
    ForwardArgs small = base;
    small.workspace = fake(0xE0000000);
    small.workspace_bytes = need - 1;
    ForwardArgs misaligned = base;
    misaligned.workspace = fake(0xE0000010);
    misaligned.workspace_bytes = need + 256;
    const CArgs c_small(small), c_misaligned(misaligned);
    if (d == 0) {
      // The kernel check comes first.
      EXPECT_TRUE(IsError(flash3::forward(small, nullptr), StatusCode::kNotSupported, {"not built"}));
      EXPECT_TRUE(IsError(flash3::forward(misaligned, nullptr), StatusCode::kNotSupported, {"not built"}));
      EXPECT_EQ(c_small.forward(small.workspace, small.workspace_bytes), FLASH3_NOT_SUPPORTED);
      continue;
    }
    const std::string sizes = std::to_string(need - 1) + " bytes given, forward_workspace_size() = " +
                              std::to_string(need) + " needed";
    EXPECT_TRUE(IsError(flash3::forward(small, nullptr), StatusCode::kInvalidArgument, {"workspace", sizes.c_str()}));
    EXPECT_TRUE(IsError(flash3::forward(misaligned, nullptr), StatusCode::kInvalidArgument,
                        {"workspace", "256-byte aligned"}));
    EXPECT_EQ(c_small.forward(small.workspace, small.workspace_bytes), FLASH3_INVALID_ARGUMENT);
    std::string err = flash3_last_error();
    EXPECT_NE(err.find("flash3_forward_with_workspace: workspace: "), std::string::npos) << err;
    EXPECT_NE(err.find(sizes), std::string::npos) << err;
    EXPECT_EQ(c_misaligned.forward(misaligned.workspace, misaligned.workspace_bytes), FLASH3_INVALID_ARGUMENT);
    err = flash3_last_error();
    EXPECT_NE(err.find("256-byte aligned"), std::string::npos) << err;
    // A size of 0 with a pointer: too small as well.
    ForwardArgs zero = small;
    zero.workspace_bytes = 0;
    EXPECT_TRUE(IsError(flash3::forward(zero, nullptr), StatusCode::kInvalidArgument, {"workspace", "0 bytes given"}));
  }
}

// A call that needs no workspace still rejects a misaligned one (the pointer
// is checked whenever one is given).
TEST_F(FwdWorkspace, MisalignedWorkspaceRejectedWhenNoneNeeded) {
  const int64_t d = built_bf16_head_dim();
  if (d == 0) GTEST_SKIP() << "not built: no bf16 forward kernel of head dim 64, 96 or 128";
  Dims p;
  p.d = p.dv = d;
  ForwardArgs a = fixed(p);
  ASSERT_EQ(ws(a), 0u);
  a.workspace = fake(0xE0000080);
  a.workspace_bytes = 4096;
  EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {"workspace", "256-byte aligned"}));
  EXPECT_EQ(CArgs(a).forward(a.workspace, a.workspace_bytes), FLASH3_INVALID_ARGUMENT);
}

// Validation comes before the workspace: a bad argument is reported as such,
// whatever the workspace, on every build.
TEST_F(FwdWorkspace, ValidationBeforeWorkspace) {
  Dims p;
  p.causal = true;
  ForwardArgs a = fixed(p);
  a.k.dtype = DType::kFloat16;
  a.workspace = fake(0xE0000010);  // misaligned and too small
  a.workspace_bytes = 1;
  EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {"k.dtype"}));
  const CArgs c(a);
  EXPECT_EQ(c.forward(a.workspace, a.workspace_bytes), FLASH3_INVALID_ARGUMENT);
  const std::string err = flash3_last_error();
  EXPECT_NE(err.find("k.dtype"), std::string::npos) << err;
  EXPECT_EQ(err.find("bytes given"), std::string::npos) << err;
  EXPECT_EQ(err.find("aligned"), std::string::npos) << err;
}

// An empty problem returns before the workspace is looked at (nothing to launch).
TEST_F(FwdWorkspace, EmptyProblemIgnoresWorkspace) {
  Varlen vp;
  vp.sequences = 0;
  ForwardArgs a = varlen(vp);
  a.workspace = fake(0xE0000010);
  a.workspace_bytes = 0;
  EXPECT_TRUE(flash3::forward(a, nullptr).ok());
  EXPECT_EQ(CArgs(a).forward(a.workspace, a.workspace_bytes), FLASH3_OK);
  Dims p;
  p.b = 0;
  p.causal = true;
  ForwardArgs f = fixed(p);
  f.workspace = fake(0xE0000010);
  EXPECT_TRUE(flash3::forward(f, nullptr).ok());
}

// flash3_forward is flash3_forward_with_workspace with a NULL workspace: the
// same answers, each under its own name.
TEST_F(FwdWorkspace, CForwardIsNullWorkspace) {
  Dims p;
  p.causal = true;
  ForwardArgs a = fixed(p);
  a.opts.softcap = -1.f;
  const CArgs c(a);
  EXPECT_EQ(flash3_forward(&c.q, &c.k, &c.v, &c.out, &c.lse, &c.opts, nullptr), FLASH3_INVALID_ARGUMENT);
  std::string err = flash3_last_error();
  EXPECT_EQ(err.rfind("flash3_forward: opts.softcap", 0), 0u) << err;
  EXPECT_EQ(c.forward(nullptr, 0), FLASH3_INVALID_ARGUMENT);
  err = flash3_last_error();
  EXPECT_EQ(err.rfind("flash3_forward_with_workspace: opts.softcap", 0), 0u) << err;
  // Empty: OK through both.
  p.b = 0;
  const CArgs e(fixed(p));
  EXPECT_EQ(flash3_forward(&e.q, &e.k, &e.v, &e.out, &e.lse, &e.opts, nullptr), FLASH3_OK);
  EXPECT_EQ(e.forward(nullptr, 0), FLASH3_OK);
}

}  // namespace
