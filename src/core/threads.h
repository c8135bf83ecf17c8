// Bounds on the thread counts a user can ask for (--dataloader_num_workers, --num_proc, OMP_NUM_THREADS),
// so that a typo gets a message instead of a failed thread start deep inside a pool (an abort or a crash).
#pragma once

namespace tr {

// The most threads one pool of ours may start: 4x the cores and at least 1024 - far above any useful count,
// below what exhausts a system's thread limit or memory (each thread's stack).
int max_pool_threads();

// OMP_NUM_THREADS, when set, checked before the first parallel region: its first value (OpenMP's list is
// per nesting level) above max_pool_threads() throws, naming the variable. Values OpenMP itself ignores
// with a warning (not a number, 0) are left to it.
void check_omp_num_threads_env();

}  // namespace tr
