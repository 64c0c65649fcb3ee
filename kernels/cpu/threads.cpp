// See threads.h. OpenMP's thread count is a per-thread setting: this changes the caller's only.
#include "kernels/cpu/threads.h"

#include <omp.h>

namespace colossal::kernels {

void set_threads_of_this_thread(int threads) { omp_set_num_threads(threads < 1 ? 1 : threads); }

}  // namespace colossal::kernels
