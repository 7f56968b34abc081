// monitored_barrier: a barrier that names the ranks that did not arrive.
//
// Unlike barrier(), some ranks may never call it, so it cannot use the group's shared-memory
// barrier (that would wait for everyone). It runs on the caller's thread over the group's
// store, with gloo's protocol and messages: every rank but 0 announces its arrival and waits
// for rank 0's release; rank 0 waits for the arrivals in rank order with one overall timeout,
// reports the first missing rank (or all of them with wait_all_ranks), and releases the others
// only when everyone arrived. Each call uses fresh keys (a per-group call counter) and deletes
// them once read, so a long job does not grow the store.
#include <chrono>
#include <sstream>

#include "backend/multihost/host_span.h"
#include "backend/process_group.h"

namespace hoccl {
namespace {

std::string joinRanks(const std::vector<int>& ranks) {
  std::ostringstream s;
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  return s.str();
}

}  // namespace

void ProcessGroupHOCCL::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  if (span_) return span_->monitoredBarrier(opts, waitAllRanks);
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  const milliseconds timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const std::string base = "hoccl/monitored_barrier/" + std::to_string(++monitoredBarriers_) + "/";
  const auto arrived = [&](int r) { return base + "arrived/" + std::to_string(r); };
  const auto released = [&](int r) { return base + "released/" + std::to_string(r); };

  if (rank_ != 0) {
    store_->set(arrived(rank_), std::vector<uint8_t>{1});
    try {
      store_->wait({released(rank_)}, timeout);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "Rank ", rank_, " successfully reached monitoredBarrier, but received errors while ",
                  "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank. (", e.what(), ")");
    }
    store_->deleteKey(released(rank_));
    return;
  }

  const auto start = Clock::now();
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    auto remaining = timeout - std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    bool here = false;
    if (remaining.count() > 0) {
      try {
        store_->wait({arrived(r)}, remaining);
        here = true;
      } catch (const std::exception&) {
      }
    } else if (waitAllRanks) {
      here = store_->check({arrived(r)});  // time is up: count who is already here
    } else {
      TORCH_CHECK(false, "Rank 0 timed out in monitoredBarrier after ", timeout.count(), " ms.");
    }
    if (here) continue;
    TORCH_CHECK(waitAllRanks, "[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ", timeout.count(),
                " ms");
    missing.push_back(r);
  }
  TORCH_CHECK(missing.empty(), "[Rank 0]: Ranks ", joinRanks(missing), " failed to pass monitoredBarrier in ",
              timeout.count(), " ms");
  for (int r = 1; r < size_; ++r) {
    store_->deleteKey(arrived(r));
    store_->set(released(r), std::vector<uint8_t>{1});
  }
}

}  // namespace hoccl
