// SentencePiece models: the tokenizers `colossal data tokenizer` trains, and tokenizer.model files of
// Hugging Face model directories.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "src/data/tokenizer_impl.h"

namespace colossal {

// Error naming `label` if the bytes are not a SentencePiece model. `add_bos`: encoding with special
// tokens starts with the model's BOS (tokenizer_config.json's add_bos_token).
std::shared_ptr<const TokenizerImpl> sentencepiece_tokenizer(const std::string& model_bytes, const std::string& label, bool add_bos);

// Trains BPE on `text_path` (one sentence per line) and writes the model to `out_path` atomically.
// Identity normalisation, newline a piece of its own, byte fallback: any UTF-8 text round-trips.
void train_sentencepiece(const std::string& text_path, int64_t vocab_size, const std::string& out_path);

}  // namespace colossal
