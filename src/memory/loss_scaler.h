// Dynamic loss scaling for fp16 (Micikevicius et al., "Mixed Precision Training", 2018; the rule of
// torch.amp.GradScaler): the loss is multiplied by `scale` before backward so small gradients survive
// fp16's range, and gradients are divided by it before the update. A step whose gradients overflowed
// (a non-finite norm) is skipped and the scale multiplied by backoff; after growth_interval clean steps
// in a row it is multiplied by growth. bf16 has fp32's range and needs none of this.
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace colossal::memory {

struct LossScaleOptions {
  double initial_scale = 65536, growth_factor = 2, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& o) : opt_(o), scale_(o.initial_scale) {}
  double scale() const { return scale_; }
  int64_t skipped() const { return skipped_; }   // overflowed steps so far
  // After a step's gradients were checked: grows or backs off the scale. Returns whether to skip it.
  bool update(bool overflowed);

  // The scale, the clean-step count and the skipped count, as checkpoint metadata, and back.
  std::map<std::string, std::string> state() const;
  void load_state(const std::map<std::string, std::string>& state, const std::string& where);

 private:
  LossScaleOptions opt_;
  double scale_;
  int64_t good_steps_ = 0, skipped_ = 0;
};

}  // namespace colossal::memory
