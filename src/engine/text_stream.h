// TextStream: one completion's text as its tokens arrive, released only once certain: a trailing
// incomplete UTF-8 character is held back (byte-fallback and byte-level tokens can end inside one), and
// so is any tail that could still become the start of a stop string. When a stop string appears the
// completion ends before it. The generator (infer) and the serving engine stream through it alike.
//
// Each token costs a decode of the last few tokens, not of the whole completion: the text up to an
// anchor is kept, and a window that starts a few tokens before the anchor is decoded, its part up to the
// anchor taken off (the same leading-space and partial-character handling applies to both, so the rest
// is exactly what the new tokens add). Where a tokenizer's decode of the longer window does not begin
// with the shorter one's, the whole completion is decoded instead. Decoding everything at each token
// had made a long completion quadratic: at 800 tokens SentencePiece's decode was 2% of a one-sequence
// decoding step, and `serve` decodes every stream's token on its engine thread.
#pragma once
#include <string>
#include <vector>

#include "src/data/tokenizer.h"

namespace colossal {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop);
  // Appends token `id`; returns the text newly certain (maybe ""). After a stop string stopped() is true
  // and the returned text ends where the stop string began.
  std::string push(int id);
  // The rest of the text once no token follows: at the end-of-text token what is certain (an incomplete
  // last character dropped), at the length limit all of it (an incomplete character as U+FFFD).
  std::string finish_at_eos();
  std::string finish_at_length();
  bool stopped() const { return stopped_; }
  const std::vector<int>& ids() const { return ids_; }
  const std::string& emitted() const { return emitted_; }

 private:
  std::string release(const std::string& text, bool final);
  std::string current_text();   // the stable text of ids_
  const Tokenizer* tokenizer_;
  std::vector<std::string> stop_;
  size_t hold_ = 0;   // bytes kept back: the longest stop string but one
  std::vector<int> ids_;
  std::string emitted_;
  bool stopped_ = false;
  // The anchor is where base_ ends: base_ is the text of the ids before it (whole characters), and
  // window_text_ that of the ids from window_ up to it.
  size_t window_ = 0;
  std::string base_, window_text_;
};

// The text of `ids` without a trailing incomplete UTF-8 character; `whole`, when given, says whether
// there was none.
std::string stable_text(const Tokenizer& tokenizer, const std::vector<int>& ids, bool* whole = nullptr);

}  // namespace colossal
