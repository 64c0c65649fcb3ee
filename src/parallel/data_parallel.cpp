// Data parallelism: see data_parallel.h.
#include "src/parallel/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "src/core/error.h"

namespace colossal::parallel {

namespace {

// Runs after a parameter's gradient accumulator: the parameter's gradient for this backward is final.
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    on_ready_();
    return outputs;
  }

 private:
  std::function<void()> on_ready_;
};

}  // namespace

struct DataParallel::Hooks {
  using Accumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<std::pair<Accumulator, uintptr_t>> installed;   // kept alive: autograd holds them weakly
};

DataParallel::DataParallel(std::vector<GradBuffer> buffers, dist::Group& group, int64_t bucket_bytes)
    : buffers_(std::move(buffers)), group_(group), hooks_(std::make_unique<Hooks>()) {
  if (!group_.active()) return;   // nothing to reduce: no buckets, no hooks
  for (size_t bi = 0; bi < buffers_.size(); ++bi) {
    const auto& buf = buffers_[bi];
    const int64_t elem = static_cast<int64_t>(buf.grads.element_size());
    // Cut in reverse parameter order; a bucket closes once it reaches bucket_bytes (a parameter larger
    // than a bucket gets one of its own).
    Bucket cur;
    std::vector<std::pair<size_t, int64_t>> owner;   // slice -> bucket
    auto close = [&] {
      if (cur.params == 0) return;
      buckets_.push_back(cur);
      cur = Bucket{};
    };
    for (size_t k = buf.slices.size(); k-- > 0;) {
      const auto& s = buf.slices[k];
      if (cur.params == 0) {
        cur.buffer = static_cast<int64_t>(bi);
        cur.offset = s.offset + s.numel;
      }
      if (s.offset + s.numel != cur.offset)
        throw Error("data parallel: gradient buffer slices are not contiguous (internal)");
      cur.offset = s.offset;
      cur.numel += s.numel;
      ++cur.params;
      owner.push_back({k, static_cast<int64_t>(buckets_.size())});
      if (cur.numel * elem >= bucket_bytes) close();
    }
    close();
    for (const auto& [k, bucket] : owner) {
      const at::Tensor& p = buf.slices[k].param;
      if (!p.requires_grad()) {
        --buckets_[static_cast<size_t>(bucket)].params;   // never gets a gradient: not waited for
        continue;
      }
      auto acc = torch::autograd::impl::grad_accumulator(p);
      if (!acc) throw Error("data parallel: parameter without a gradient accumulator (internal)");
      const int64_t b = bucket;
      auto key = acc->add_post_hook(std::make_unique<ReadyHook>([this, b] { ready(b); }));
      hooks_->installed.emplace_back(acc, key);
    }
  }
}

DataParallel::~DataParallel() {
  for (auto& [acc, key] : hooks_->installed) acc->del_post_hook(key);
}

std::vector<std::pair<int64_t, int64_t>> DataParallel::bucket_ranges(int64_t buffer) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& b : buckets_)
    if (b.buffer == buffer) out.emplace_back(b.offset, b.numel);
  return out;
}

void DataParallel::prepare(bool sync) {
  sync_ = sync && group_.active();
  if (!sync_) return;
  for (auto& b : buckets_) {
    b.waiting = b.params;
    b.launched = false;
  }
}

void DataParallel::launch(Bucket& b, int64_t index) {
  b.launched = true;
  at::Tensor view = buffers_[static_cast<size_t>(b.buffer)].grads.narrow(0, b.offset, b.numel);
  // Average as a sum of pre-scaled parts: the scaling runs here, overlapped with backward, not after.
  view.mul_(1.0 / static_cast<double>(group_.size()));
  b.pending = group_.all_reduce_async(view, "gradient bucket " + std::to_string(index));
}

void DataParallel::ready(int64_t index) {
  if (!sync_) return;
  Bucket& b = buckets_[static_cast<size_t>(index)];
  if (--b.waiting == 0 && !b.launched) launch(b, index);
}

void DataParallel::finish() {
  if (!sync_) return;
  sync_ = false;
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!buckets_[i].launched) launch(buckets_[i], static_cast<int64_t>(i));
  for (auto& b : buckets_) group_.wait(b.pending);
}

void DataParallel::broadcast_from_root(const std::vector<at::Tensor>& flat_params) {
  at::NoGradGuard no_grad;
  for (auto t : flat_params) group_.broadcast(t, 0, "initial parameters");
}

}  // namespace colossal::parallel
