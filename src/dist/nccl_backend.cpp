// NCCL backend factory: see nccl_backend.h.
#include "src/dist/nccl_backend.h"

#include "src/core/error.h"

#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define COLOSSAL_HAVE_NCCL 1
#endif

namespace colossal::dist {

#ifdef COLOSSAL_HAVE_NCCL
bool nccl_available() { return at::hasCUDA(); }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t size, std::chrono::milliseconds timeout) {
  if (!at::hasCUDA()) throw Error("parallel.backend = \"nccl\" needs a CUDA GPU, and none is visible (use \"gloo\")");
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank), static_cast<int>(size), opts);
}
#else
bool nccl_available() { return false; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int64_t, int64_t,
                                                    std::chrono::milliseconds) {
  throw Error("parallel.backend = \"nccl\": this build of colossal has no NCCL (build with the CUDA toolkit's NCCL, or use \"gloo\")");
}
#endif

}  // namespace colossal::dist
