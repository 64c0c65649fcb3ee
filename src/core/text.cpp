// Text helpers: see text.h.
#include "src/core/text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace colossal {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  // A typo changes a few characters; beyond a third of the word it is a different name.
  size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_d <= limit ? best : "";
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (std::fabs(n) >= 1000 && u < 4) n /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.1f%s", n, units[u]);
  return buf;
}

std::string human_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", s / 60, s % 60);
  return buf;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

}  // namespace colossal
