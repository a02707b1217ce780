// BwdTraits::ds_byte_offset (the 32-bit offsets the consumers' stmatrix stores
// use) must equal the byte address CuTe's swizzled smem tensor computes for
// sdS(query, key, stage), for every head-dim variant's dS / P layout.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "bwd/kernel_traits.h"
#include "head_dims.h"

namespace {

template <int D, int DV>
void expect_offsets_match() {
  using T = flash3::BwdTraits<cutlass::bfloat16_t, D, DV, flash3::DefaultBwdConfig<D, DV, false>, flash3::MaskNone>;
  using L = typename T::SmemLayoutdS;
  // 1024-byte aligned like SharedStorage::smem_ds (the swizzle acts on address bits).
  std::vector<char> buf(cute::cosize_v<L> * 2 + 1024);
  auto* base = reinterpret_cast<cutlass::bfloat16_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 1023) & ~uintptr_t(1023));
  auto s = cute::make_tensor(cute::make_smem_ptr(base), L{});
  int mismatches = 0;
  for (int st = 0; st < int(cute::size<2>(L{})); ++st)
    for (int q = 0; q < int(cute::size<0>(L{})); ++q)
      for (int k = 0; k < int(cute::size<1>(L{})); ++k) {
        const long want = reinterpret_cast<char*>(cute::raw_pointer_cast(&s(q, k, st))) - reinterpret_cast<char*>(base);
        mismatches += long(T::ds_byte_offset(q, k, st)) != want;
      }
  EXPECT_EQ(mismatches, 0) << "d=" << D << " dv=" << DV;
}

TEST(BwdSmemOffsets, MatchSwizzledTensorAddresses) {
  flash3_test::for_each_head_dim_pair([](auto d, auto dv) { expect_offsets_match<d(), dv()>(); });
}

}  // namespace
