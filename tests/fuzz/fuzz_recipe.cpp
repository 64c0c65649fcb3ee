// Fuzz target: the recipe parser with --set overrides. The input is TOML text, optionally followed by
// a line "%%" and one override per line ("section.key=value"), as `--set` would pass them.
#include <string>
#include <vector>

#include "src/core/recipe.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string text = input;
  std::vector<std::string> overrides;
  if (const size_t cut = input.find("\n%%\n"); cut != std::string::npos) {
    text = input.substr(0, cut);
    size_t start = cut + 4;
    while (start <= input.size()) {
      const size_t end = input.find('\n', start);
      overrides.push_back(input.substr(start, end == std::string::npos ? std::string::npos : end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  colossal::fuzz::reject_only([&] {
    const colossal::Recipe r = colossal::parse_recipe(text, "fuzz.toml", overrides);
    (void)r.to_toml();   // an accepted recipe must also print (the dry run shows it)
  });
  return 0;
}
