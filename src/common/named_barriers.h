// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
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
  // PackGQA: warpgroup w's threads have loaded its 64 Q rows (kPackedQWG1 + w,
  // 128 participants) before its first QK^T WGMMA reads them.
  kPackedQWG1 = 4,
  kPackedQWG2 = 5,
  kPackedQWG3 = 6,
  // Paged KV: the producer warpgroup's 128 threads have each issued their
  // share of a stage's cp.async gather (and its deferred mbarrier arrival)
  // before thread 0 makes the stage's one plain arrival (FwdMainloop::load_gathered;
  // fwd/paged_kv.h with FLASH3_SERVING_WIP).
  kPagedKVProducer = 7,
};

// Backward (seed 7.4.1). Ids are reused from the forward's: a kernel is one or the other.
enum class BwdBarrier : int {
  // All consumer threads: every warpgroup's dS^T slice is in shared memory
  // before any warpgroup's dQ GEMM reads the whole tile.
  kPdS = 0,
  // One-slot mailboxes between consumer warpgroup w (128 threads) and the dQ
  // store warp (32 threads): 160 arrivals per generation.
  kdQFullWG0 = 1,   // + w: the staging chunk is written (consumers arrive, store warp syncs)
  kdQEmptyWG0 = 3,  // + w: the bulk reduce has read it (store warp arrives, consumers sync)
  kEpilogue = 5,    // all consumer threads: sK / sV free, then dK / dV staged there
};

CUTLASS_DEVICE void named_barrier_sync(int num_threads, FwdBarrier id) {
  cutlass::arch::NamedBarrier::sync(num_threads, static_cast<int>(id));
}
CUTLASS_DEVICE void named_barrier_arrive(int num_threads, FwdBarrier id) {
  cutlass::arch::NamedBarrier::arrive(num_threads, static_cast<int>(id));
}
CUTLASS_DEVICE void named_barrier_sync(int num_threads, BwdBarrier id, int plus = 0) {
  cutlass::arch::NamedBarrier::sync(num_threads, static_cast<int>(id) + plus);
}
CUTLASS_DEVICE void named_barrier_arrive(int num_threads, BwdBarrier id, int plus = 0) {
  cutlass::arch::NamedBarrier::arrive(num_threads, static_cast<int>(id) + plus);
}
CUTLASS_DEVICE void named_barrier_sync(int num_threads, int id) {
  cutlass::arch::NamedBarrier::sync(num_threads, id);
}
CUTLASS_DEVICE void named_barrier_arrive(int num_threads, int id) {
  cutlass::arch::NamedBarrier::arrive(num_threads, id);
}

}  // namespace flash3
