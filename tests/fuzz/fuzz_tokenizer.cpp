// Fuzz target: the files of a Hugging Face tokenizer as Tokenizer::from_files reads them, then
// encoding and decoding with whatever was accepted. The input's first byte picks the file it
// stands for, the rest is its content; the other files come from the fixtures:
//   0 tokenizer.json                 alone
//   1 vocab.txt                      alone (BERT's WordPiece)
//   2 merges.txt                     beside gpt2-bpe-files' vocab.json and tokenizer_config.json
//   3 tokenizer_config.json          beside roberta-bpe's tokenizer.json
// An accepted tokenizer encodes a few fixed strings and the content itself (arbitrary bytes), and
// decodes what it produced plus ids outside its vocabulary.
#include <fstream>
#include <sstream>

#include "src/data/tokenizer.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

std::string fixture_file(const std::string& rel) {
  std::ifstream in(std::string(COLOSSAL_FIXTURES_DIR) + "/" + rel, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const colossal::TokenizerFiles bpe_files = {{"vocab.json", fixture_file("tokenizers/gpt2-bpe-files/vocab.json")},
                                                     {"tokenizer_config.json", fixture_file("tokenizers/gpt2-bpe-files/tokenizer_config.json")}};
  static const std::string roberta = fixture_file("tokenizers/roberta-bpe/tokenizer.json");
  const std::string content(reinterpret_cast<const char*>(data + 1), size - 1);
  colossal::TokenizerFiles files;
  switch (data[0] % 4) {
    case 0: files = {{"tokenizer.json", content}}; break;
    case 1: files = {{"vocab.txt", content}}; break;
    case 2: files = bpe_files, files["merges.txt"] = content; break;
    default: files = {{"tokenizer.json", roberta}, {"tokenizer_config.json", content}}; break;
  }
  colossal::fuzz::reject_only([&] {
    const auto tok = colossal::Tokenizer::from_files(files, "fuzz");
    for (const std::string& text : {std::string("Hello world, it's 3.14 naïve 你好 🙂"), std::string(" <s> [MASK] </s>"), content.substr(0, 512)}) {
      auto ids = tok.encode(text, true);
      ids.push_back(-1);
      ids.push_back(static_cast<int>(tok.vocab_size()));
      (void)tok.decode(ids);
      (void)tok.decode(ids, true);
    }
    (void)tok.end_of_text();
  });
  return 0;
}
