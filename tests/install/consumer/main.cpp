// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors

#include <cstdio>
#include <cstring>

#include <flash3/flash3.h>
#include <flash3/flash3_c.h>

// Every public function, by address: the link fails when libflash3.so's export map
// (cmake/flash3.map) hides one of them.
static const void* const kPublicApi[] = {
    // C ABI (flash3_c.h)
    reinterpret_cast<const void*>(&flash3_default_options), reinterpret_cast<const void*>(&flash3_forward),
    reinterpret_cast<const void*>(&flash3_forward_with_workspace), reinterpret_cast<const void*>(&flash3_forward_fp8),
    reinterpret_cast<const void*>(&flash3_quantize_fp8), reinterpret_cast<const void*>(&flash3_quantize_fp8_rotary),
    reinterpret_cast<const void*>(&flash3_forward_workspace_size), reinterpret_cast<const void*>(&flash3_backward),
    reinterpret_cast<const void*>(&flash3_backward_workspace_size), reinterpret_cast<const void*>(&flash3_combine),
    reinterpret_cast<const void*>(&flash3_default_kvcache_args), reinterpret_cast<const void*>(&flash3_forward_kvcache),
    reinterpret_cast<const void*>(&flash3_kvcache_workspace_size), reinterpret_cast<const void*>(&flash3_forward_plan),
    reinterpret_cast<const void*>(&flash3_validate_forward), reinterpret_cast<const void*>(&flash3_forward_is_built),
    reinterpret_cast<const void*>(&flash3_backward_is_built), reinterpret_cast<const void*>(&flash3_device_is_supported),
    reinterpret_cast<const void*>(&flash3_last_error), reinterpret_cast<const void*>(&flash3_version),
    reinterpret_cast<const void*>(&flash3_version_number),
    // C++ API (flash3.h)
    reinterpret_cast<const void*>(&flash3::dtype_name), reinterpret_cast<const void*>(&flash3::dtype_size),
    reinterpret_cast<const void*>(&flash3::TensorView::contiguous), reinterpret_cast<const void*>(&flash3::TensorView::make4d),
    reinterpret_cast<const void*>(&flash3::TensorView::make3d), reinterpret_cast<const void*>(&flash3::validate_quantize_fp8),
    reinterpret_cast<const void*>(&flash3::quantize_fp8), reinterpret_cast<const void*>(&flash3::validate_forward),
    reinterpret_cast<const void*>(&flash3::validate_backward), reinterpret_cast<const void*>(&flash3::validate_combine),
    reinterpret_cast<const void*>(&flash3::validate_kvcache), reinterpret_cast<const void*>(&flash3::forward),
    reinterpret_cast<const void*>(&flash3::backward), reinterpret_cast<const void*>(&flash3::backward_workspace_size),
    reinterpret_cast<const void*>(&flash3::forward_workspace_size), reinterpret_cast<const void*>(&flash3::forward_kvcache),
    reinterpret_cast<const void*>(&flash3::kvcache_workspace_size), reinterpret_cast<const void*>(&flash3::combine),
    reinterpret_cast<const void*>(&flash3::forward_plan), reinterpret_cast<const void*>(&flash3::forward_is_built),
    reinterpret_cast<const void*>(&flash3::backward_is_built), reinterpret_cast<const void*>(&flash3::device_is_supported),
    reinterpret_cast<const void*>(&flash3::version), reinterpret_cast<const void*>(&flash3::serving_wip_built),
};

int main() {
  // Links against the installed library and reads its build manifest.
  std::printf("flash3 %s (headers %s), bf16 d=128 forward built: %d, %zu API functions linked\n",
              flash3::version(), FLASH3_VERSION_STRING,
              int(flash3::forward_is_built(flash3::DType::kBFloat16, 128, 128)),
              sizeof(kPublicApi) / sizeof(kPublicApi[0]));
  // numel is a const member function: call it rather than take its address.
  const int64_t shape[4] = {1, 2, 3, 4};
  if (flash3::TensorView::contiguous(nullptr, flash3::DType::kBFloat16, 4, shape).numel() != 24) return 1;
  if (std::strcmp(flash3_version(), flash3::version()) != 0) return 1;
  // The loaded library is the one the headers describe.
  if (std::strcmp(flash3_version(), FLASH3_VERSION_STRING) != 0) {
    std::printf("version mismatch: library %s, headers %s\n", flash3_version(), FLASH3_VERSION_STRING);
    return 1;
  }
  return flash3_version_number() == FLASH3_VERSION_NUMBER ? 0 : 1;
}
