// Roster: who is in the job (rank -> host) and how far each rank has got, so that a failed collective
// can say which rank never arrived. Each rank counts the collectives it has entered per group; a
// heartbeat thread publishes the counts to the rendezvous store a few times a second (off the
// critical path: a store write per collective would put a network round trip in every bucket). A rank
// that hangs stops publishing at the count it reached, so after a timeout (>= 1 s, many heartbeats)
// the ranks still behind the failing collective's count are the ones that never arrived.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace colossal::dist {

struct StoreHandle;

class Roster {
 public:
  // `store` may be null (one process): nothing is published and no laggard is ever named. The roster
  // opens its own connections to it (clones) and keeps no reference to `store` itself.
  Roster(const StoreHandle* store, int64_t rank, std::vector<std::string> hosts);
  ~Roster();
  Roster(const Roster&) = delete;
  Roster& operator=(const Roster&) = delete;

  int64_t rank() const { return rank_; }
  int64_t world() const { return static_cast<int64_t>(hosts_.size()); }
  const std::string& host(int64_t rank) const { return hosts_.at(static_cast<size_t>(rank)); }
  std::string who(int64_t rank) const;   // "rank 3 (node gpu02)"

  // Counts a collective on `group` that this rank is entering; returns its number (1, 2, ...).
  int64_t enter(const std::string& group);
  // After collective number `n` on `group` failed here: the member ranks whose published count is
  // below n, as "rank 1 (node h) (at dp #40)" joined by ", " (empty if none is known to lag).
  std::vector<int64_t> laggards(const std::string& group, const std::vector<int64_t>& ranks, int64_t n,
                                std::string* detail = nullptr);

 private:
  void heartbeat();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t rank_;
  std::vector<std::string> hosts_;
};

}  // namespace colossal::dist
