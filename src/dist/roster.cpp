// Roster: see roster.h.
#include "src/dist/roster.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "src/dist/backend.h"

namespace colossal::dist {
namespace {

constexpr auto kHeartbeat = std::chrono::milliseconds(200);
constexpr auto kQueryWait = std::chrono::seconds(3);
std::string progress_key(int64_t rank) { return "colossal/progress/" + std::to_string(rank); }

// "dp=41;world=3" <-> map
std::string encode(const std::map<std::string, int64_t>& counts) {
  std::string s;
  for (const auto& [g, n] : counts) s += (s.empty() ? "" : ";") + g + "=" + std::to_string(n);
  return s;
}
int64_t count_in(const std::string& encoded, const std::string& group) {
  size_t at = 0;
  while (at < encoded.size()) {
    size_t end = encoded.find(';', at);
    if (end == std::string::npos) end = encoded.size();
    const std::string item = encoded.substr(at, end - at);
    const size_t eq = item.find('=');
    if (eq != std::string::npos && item.substr(0, eq) == group) return std::stoll(item.substr(eq + 1));
    at = end + 1;
  }
  return 0;
}

}  // namespace

struct Roster::Impl {
  c10::intrusive_ptr<c10d::Store> publisher;  // the job's store: the heartbeat's sets are small and rare
  // For laggards(): its own connection with a short timeout, cloned by a thread of its own on the first
  // question and waited for at most kQueryWait, so a frozen store host cannot hold an error back. Not
  // made at joining: a clone's connect cost a test harness that joins many worlds in one process 5 s
  // each time, and a job asks only when something already went wrong.
  std::shared_future<c10::intrusive_ptr<c10d::Store>> query;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, int64_t> counts;
  bool changed = true, stop = false;
  std::thread thread;
};

Roster::Roster(const StoreHandle* store, int64_t rank, std::vector<std::string> hosts)
    : impl_(std::make_unique<Impl>()), rank_(rank), hosts_(std::move(hosts)) {
  if (!store) return;
  impl_->publisher = store->store;
  impl_->thread = std::thread([this] { heartbeat(); });
}

Roster::~Roster() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string Roster::who(int64_t rank) const {
  if (rank < 0 || rank >= world()) return "rank " + std::to_string(rank);
  return "rank " + std::to_string(rank) + " (node " + hosts_[static_cast<size_t>(rank)] + ")";
}

int64_t Roster::enter(const std::string& group) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->changed = true;
  return ++impl_->counts[group];
}

void Roster::heartbeat() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  while (!impl_->stop) {
    if (impl_->changed) {
      const std::string value = encode(impl_->counts);
      impl_->changed = false;
      lock.unlock();
      try {
        impl_->publisher->set(progress_key(rank_), store_bytes(value));
      } catch (const std::exception&) {
        // The store's host (rank 0 or the launcher) is gone; the collectives report that themselves.
      }
      lock.lock();
    }
    impl_->cv.wait_for(lock, kHeartbeat, [&] { return impl_->stop; });
  }
}

std::vector<int64_t> Roster::laggards(const std::string& group, const std::vector<int64_t>& ranks, int64_t n,
                                      std::string* detail) {
  std::vector<int64_t> behind;
  if (!impl_->publisher) return behind;
  std::shared_future<c10::intrusive_ptr<c10d::Store>> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->query.valid()) {
      auto promise = std::make_shared<std::promise<c10::intrusive_ptr<c10d::Store>>>();
      impl_->query = promise->get_future().share();
      std::thread([promise, base = impl_->publisher] {
        try {
          auto q = base->clone();
          q->setTimeout(kQueryWait);
          promise->set_value(q);
        } catch (const std::exception&) {
          promise->set_value(base);   // a store that cannot clone shares its connection
        }
      }).detach();
    }
    pending = impl_->query;
  }
  if (pending.wait_for(kQueryWait) != std::future_status::ready) return behind;   // the store host does not answer
  const c10::intrusive_ptr<c10d::Store> query = pending.get();
  std::string text;
  for (int64_t r : ranks) {
    if (r == rank_) continue;
    int64_t reached = 0;
    try {
      const std::string key = progress_key(r);
      if (query->check({key})) {
        reached = count_in(store_text(query->get(key)), group);
      }
    } catch (const std::exception&) {
      return {};   // the store is unreachable: nothing can be said about the others
    }
    if (reached < n) {
      behind.push_back(r);
      text += (text.empty() ? "" : ", ") + who(r) + " (at " + group + " #" + std::to_string(reached) + ")";
    }
  }
  if (detail) *detail = text;
  return behind;
}

}  // namespace colossal::dist
