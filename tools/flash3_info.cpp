// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// flash3_info: prints the library version, the built kernel variants and whether
// this machine has a GPU flash3 can run on. `--check` prints only a failure line
// and exits 2 when there is no Hopper GPU.
#include <cstdio>
#include <cstring>
#include <string>

#include "flash3/flash3.h"

int main(int argc, char** argv) {
  const bool check = argc > 1 && std::strcmp(argv[1], "--check") == 0;
  std::string why;
  const bool ok = flash3::device_is_supported(&why);
  if (check) {
    if (!ok) std::printf("flash3: no Hopper GPU: %s\n", why.c_str());
    return ok ? 0 : 2;
  }
  std::printf("flash3 %s\n", flash3::version());
  std::printf("device: %s\n", ok ? "supported (sm_90)" : why.c_str());
  const int dims[][2] = {  // every pair the manifest knows (tools/manifest.py)
#define FLASH3_HEAD_DIM(D, DV) {D, DV},
#include "head_dims.inc"
#undef FLASH3_HEAD_DIM
  };
  for (auto dt : {flash3::DType::kBFloat16, flash3::DType::kFloat16}) {
    for (auto& d : dims) {
      std::printf("  %-4s d=%3d dv=%3d  fwd: %-9s bwd: %s\n", flash3::dtype_name(dt), d[0], d[1],
                  flash3::forward_is_built(dt, d[0], d[1]) ? "built" : "not built",
                  flash3::backward_is_built(dt, d[0], d[1]) ? "built" : "not built");
    }
  }
  return ok ? 0 : 2;
}
