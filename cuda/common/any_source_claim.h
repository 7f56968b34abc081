// One recv from any source held by several engines at once. A group spanning hosts posts it on
// the host's shared memory (for senders on this host) and on the network (for the others): each
// pair's messages travel on one engine only, so neither engine alone sees every sender. The
// first engine with a message for it takes the claim before consuming anything and receives; the
// others withdraw theirs and leave their messages for later recvs. A waiter that gives up takes
// the claim as TimedOut, which withdraws every engine's.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace hoccl {

class AnySourceClaim {
 public:
  enum class Owner { None, SharedMemory, Network, TimedOut };

  // True when `who` took the claim; then every other engine's withdraw hook runs (on this thread,
  // after the claim's own lock is released).
  bool take(Owner who) {
    std::vector<std::function<void()>> losers;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (owner_ != Owner::None) return false;
      owner_ = who;
      for (auto& [side, withdraw] : hooks_)
        if (side != who) losers.push_back(std::move(withdraw));
      hooks_.clear();
    }
    taken_.notify_all();
    for (auto& withdraw : losers) withdraw();
    return true;
  }

  Owner owner() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return owner_;
  }

  // What withdraws `side`'s recv once another side has the claim; runs at once when that has
  // happened already.
  void onWithdraw(Owner side, std::function<void()> withdraw) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (owner_ == Owner::None) {
        hooks_.emplace_back(side, std::move(withdraw));
        return;
      }
      if (owner_ == side) return;
    }
    withdraw();
  }

  // The owner once there is one, or None at `deadline`.
  Owner waitTaken(std::chrono::steady_clock::time_point deadline) const {
    std::unique_lock<std::mutex> lock(mutex_);
    taken_.wait_until(lock, deadline, [&] { return owner_ != Owner::None; });
    return owner_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable taken_;
  Owner owner_ = Owner::None;
  std::vector<std::pair<Owner, std::function<void()>>> hooks_;
};

}  // namespace hoccl
