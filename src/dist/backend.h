// Internal to src/dist: the c10d objects behind Group and Roster, kept out of the public headers so
// that code using the runtime does not compile c10d's (and Gloo's) headers.
#pragma once
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace colossal::dist {

struct BackendHandle {
  c10::intrusive_ptr<c10d::Backend> pg;
};

struct StoreHandle {
  c10::intrusive_ptr<c10d::Store> store;
};

// Store values are bytes; everything colossal keeps there is text.
inline std::vector<uint8_t> store_bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string store_text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace colossal::dist
