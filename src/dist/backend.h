// Internal to src/dist: the c10d objects behind Group and Roster, kept out of the public headers so
// that code using the runtime does not compile c10d's (and Gloo's) headers.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace colossal::dist {

struct BackendHandle {
  c10::intrusive_ptr<c10d::Backend> pg;
};

}  // namespace colossal::dist

namespace colossal::dist {

struct StoreHandle {
  c10::intrusive_ptr<c10d::Store> store;
};

}  // namespace colossal::dist
