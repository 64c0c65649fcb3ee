// The OpenMP team size of the calling thread's parallel regions. A thread of its own (the optimizer
// update beside the next forward) sizes its teams here without touching the training thread's.
#pragma once

namespace colossal::kernels {

void set_threads_of_this_thread(int threads);

}  // namespace colossal::kernels
