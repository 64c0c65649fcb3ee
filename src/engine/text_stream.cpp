// Incremental detokenising with stop strings: see text_stream.h.
#include "src/engine/text_stream.h"

#include <algorithm>

namespace colossal {

namespace {

// Tokens decoded before the anchor: one would do for SentencePiece's leading space, a few cover byte
// runs and tokenizers whose pieces join their neighbours. The window grows to twice this before the
// anchor moves up.
constexpr size_t kContext = 4;

}  // namespace

std::string stable_text(const Tokenizer& tok, const std::vector<int>& ids, bool* whole) {
  std::string text = tok.decode(ids, /*skip_special=*/true);
  const size_t decoded = text.size();
  static const std::string replacement = "\xEF\xBF\xBD";   // SentencePiece marks an unfinished character so
  while (text.size() >= 3 && text.compare(text.size() - 3, 3, replacement) == 0) text.resize(text.size() - 3);
  size_t lead = text.size();
  while (lead > 0 && text.size() - lead < 3 && (static_cast<unsigned char>(text[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead > 0) {
    const auto b = static_cast<unsigned char>(text[lead - 1]);
    const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    if (text.size() - (lead - 1) < need) text.resize(lead - 1);
  }
  if (whole) *whole = text.size() == decoded;
  return text;
}

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop) : tokenizer_(&tokenizer), stop_(std::move(stop)) {
  for (const auto& s : stop_) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
}

std::string TextStream::release(const std::string& text, bool final) {
  const size_t upto = final ? text.size() : (text.size() > hold_ ? text.size() - hold_ : 0);
  if (upto <= emitted_.size()) return "";
  std::string piece = text.substr(emitted_.size(), upto - emitted_.size());
  emitted_ += piece;
  return piece;
}

std::string TextStream::current_text() {
  bool whole = false;
  const std::string window = stable_text(*tokenizer_, std::vector<int>(ids_.begin() + static_cast<std::ptrdiff_t>(window_), ids_.end()), &whole);
  if (window.compare(0, window_text_.size(), window_text_) != 0) return stable_text(*tokenizer_, ids_);
  std::string text = base_ + window.substr(window_text_.size());
  if (whole && ids_.size() - window_ >= 2 * kContext) {   // move the anchor here
    window_ = ids_.size() - kContext;
    base_ = text;
    window_text_ = stable_text(*tokenizer_, std::vector<int>(ids_.begin() + static_cast<std::ptrdiff_t>(window_), ids_.end()));
  }
  return text;
}

std::string TextStream::push(int id) {
  ids_.push_back(id);
  const std::string text = current_text();
  // A stop string can only begin in what is not yet out: anything earlier was followed by hold_ more
  // characters when it went out, enough for the longest stop string to have been seen.
  const size_t from = emitted_.size() > hold_ ? emitted_.size() - hold_ : 0;
  size_t cut = std::string::npos;
  for (const auto& s : stop_)
    if (!s.empty()) cut = std::min(cut, text.find(s, from));
  if (cut == std::string::npos) return release(text, false);
  stopped_ = true;
  return release(text.substr(0, cut), true);
}

std::string TextStream::finish_at_eos() { return stopped_ ? "" : release(stable_text(*tokenizer_, ids_), true); }

std::string TextStream::finish_at_length() { return stopped_ ? "" : release(tokenizer_->decode(ids_, /*skip_special=*/true), true); }

}  // namespace colossal
