// Flag validators shared by the subcommands. CLI11's Range lets NaN through (every comparison with
// NaN is false) and its integer conversion wraps "-1" into an unsigned seed, so numbers are checked
// here as text first: one line naming the flag, the value and what would be valid.
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <string>

#include "src/core/text.h"

namespace colossal::app {

// A finite real number in [lo, hi].
inline CLI::Validator finite_in(double lo, double hi) {
  const std::string range = "[" + format_number(lo) + ", " + format_number(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double x = 0;
        size_t used = 0;
        try {
          x = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !std::isfinite(x) || x < lo || x > hi)
          return "'" + text + "' is not a number in " + range;
        return "";
      },
      "NUMBER in " + range);
}

// A whole number in [0, max] written in decimal digits (no sign, no exponent).
inline CLI::Validator whole_up_to(uint64_t max) {
  return CLI::Validator(
      [max](std::string& text) -> std::string {
        const auto x = parse_whole(text);
        return x && *x <= max ? "" : "'" + text + "' is not a whole number in [0, " + std::to_string(max) + "]";
      },
      "INTEGER in [0, " + std::to_string(max) + "]");
}

}  // namespace colossal::app
