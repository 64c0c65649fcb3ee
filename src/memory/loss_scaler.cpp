// Dynamic loss scaling: see loss_scaler.h.
#include "src/memory/loss_scaler.h"

#include <charconv>
#include <cmath>

#include "src/core/error.h"

namespace colossal::memory {

bool LossScaler::update(bool overflowed) {
  if (overflowed) {
    scale_ *= opt_.backoff_factor;
    good_steps_ = 0;
    ++skipped_;
    return true;
  }
  if (++good_steps_ >= opt_.growth_interval) {
    scale_ *= opt_.growth_factor;
    good_steps_ = 0;
  }
  return false;
}

std::map<std::string, std::string> LossScaler::state() const {
  char buf[32];
  const std::string scale(buf, std::to_chars(buf, buf + sizeof buf, scale_).ptr);   // reads back exactly
  return {{"loss_scale", scale}, {"loss_scale_good_steps", std::to_string(good_steps_)}, {"loss_scale_skipped", std::to_string(skipped_)}};
}

void LossScaler::load_state(const std::map<std::string, std::string>& state, const std::string& where) {
  auto read = [&](const char* key, auto& out) {
    auto it = state.find(key);
    if (it == state.end()) return false;   // a checkpoint from an fp32 or bf16 run: start afresh
    const auto& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    if (ec != std::errc() || end != text.data() + text.size())
      throw Error("checkpoint " + where + ": metadata " + key + " = \"" + text + "\" (expected a number)");
    return true;
  };
  double scale = 0;
  int64_t good = 0, skipped = 0;
  if (!read("loss_scale", scale)) return;
  if (!std::isfinite(scale) || scale <= 0)
    throw Error("checkpoint " + where + ": metadata loss_scale = " + state.at("loss_scale") + " (expected a positive finite number)");
  read("loss_scale_good_steps", good);
  read("loss_scale_skipped", skipped);
  scale_ = scale;
  good_steps_ = std::max<int64_t>(0, good);
  skipped_ = std::max<int64_t>(0, skipped);
}

}  // namespace colossal::memory
