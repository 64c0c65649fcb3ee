// SpareBuffers: see spare_buffers.h.
#include "src/core/spare_buffers.h"

#include <ATen/ATen.h>

namespace colossal {

SpareBuffers::Key SpareBuffers::key_of(int64_t numel, const at::TensorOptions& options) {
  return {numel, static_cast<int>(options.dtype().toScalarType()), static_cast<int>(options.device().type()),
          static_cast<int>(options.device().index())};
}

at::Tensor SpareBuffers::take(int64_t numel, const at::TensorOptions& options) {
  return take(numel, options, [&] { return at::empty({numel}, options); });
}

at::Tensor SpareBuffers::take(int64_t numel, const at::TensorOptions& options, const std::function<at::Tensor()>& make) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = spare_.find(key_of(numel, options));
    if (it != spare_.end() && !it->second.empty()) {
      at::Tensor t = std::move(it->second.back());
      it->second.pop_back();
      return t;
    }
  }
  return make();
}

void SpareBuffers::give(at::Tensor t) {
  // Only a whole buffer is worth keeping: a view would keep its larger storage alive unseen.
  if (!t.defined() || t.dim() != 1 || t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& list = spare_[key_of(t.numel(), t.options())];
  if (list.size() < keep_) list.push_back(std::move(t));
}

void SpareBuffers::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  spare_.clear();
}

size_t SpareBuffers::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [k, list] : spare_) n += list.size();
  return n;
}

}  // namespace colossal
