#include <cstdio>
#include <cstring>

#include <flash3/flash3.h>
#include <flash3/flash3_c.h>

int main() {
  // Links against the installed library and reads its build manifest.
  std::printf("flash3 %s, bf16 d=128 forward built: %d\n", flash3::version(),
              int(flash3::forward_is_built(flash3::DType::kBFloat16, 128, 128)));
  return std::strcmp(flash3_version(), flash3::version()) == 0 ? 0 : 1;
}
