// Reading a Hugging Face tokenizer from the files of a model directory, in the order transformers
// prefers them: tokenizer.json (the whole pipeline), else vocab.json + merges.txt (byte-level BPE as
// GPT-2 first shipped it), else vocab.txt (BERT's WordPiece); tokenizer_config.json and
// special_tokens_map.json name the special tokens and the options the older files leave out.
// Everything is checked as it is read: errors name the file, the field and what would be valid.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "src/data/tokenizer_impl.h"

namespace colossal {

using TokenizerFiles = std::map<std::string, std::string>;   // file name -> bytes

// Null when `files` holds none of the three forms. `dir` names the directory in messages.
std::shared_ptr<const TokenizerImpl> hf_tokenizer_from_files(const TokenizerFiles& files, const std::string& dir);

}  // namespace colossal
