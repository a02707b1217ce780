// Named hardware barriers of the forward kernel, in one place with their
// participant counts. CUTLASS reserves ids below FirstUserBarrier (8); the
// values here are user ids and cutlass::arch::NamedBarrier adds that offset.
#pragma once
#include <cutlass/arch/barrier.h>

namespace flash3 {

enum class FwdBarrier : int {
  // All consumer threads: sO aliases sQ, so no warpgroup may write its O tile
  // before every warpgroup has issued (and waited for) its last QK^T WGMMA.
  // Second generation: the smem writes are complete before the TMA store warp
  // reads them.
  kEpilogue = 0,
  // Pingpong turn-taking: warpgroup w waits on kWarpSchedulerWG1 + w - 1 with
  // 2 x 128 participants (its own 128 sync + 128 arrivals from its predecessor).
  kWarpSchedulerWG1 = 1,
  kWarpSchedulerWG2 = 2,
  kWarpSchedulerWG3 = 3,
};

CUTLASS_DEVICE void named_barrier_sync(int num_threads, FwdBarrier id) {
  cutlass::arch::NamedBarrier::sync(num_threads, static_cast<int>(id));
}
CUTLASS_DEVICE void named_barrier_arrive(int num_threads, FwdBarrier id) {
  cutlass::arch::NamedBarrier::arrive(num_threads, static_cast<int>(id));
}
CUTLASS_DEVICE void named_barrier_sync(int num_threads, int id) {
  cutlass::arch::NamedBarrier::sync(num_threads, id);
}
CUTLASS_DEVICE void named_barrier_arrive(int num_threads, int id) {
  cutlass::arch::NamedBarrier::arrive(num_threads, id);
}

}  // namespace flash3
