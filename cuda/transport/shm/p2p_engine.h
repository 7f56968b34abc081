// send/recv over per-pair byte rings in the group's shared segment. A progress thread moves
// every posted operation forward as far as it can, so no pattern of posted sends and receives
// can deadlock on a single blocked call (isend/irecv in any order work, like gloo).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

#include "common/any_source_claim.h"
#include "transport/shm/shm_group.h"

namespace hoccl {

class P2PEngine {
 public:
  using Done = std::function<void(std::exception_ptr error, int peer)>;

  P2PEngine(ShmGroup& group, std::chrono::milliseconds timeout);
  ~P2PEngine();

  void postSend(int dst, int tag, const char* data, int64_t bytes, Done done);
  // src = -1 receives from whichever rank first has a message with this tag next. With a claim
  // (src -1 only), the recv binds to a sender only if it takes the claim first, and is dropped
  // without a callback once another engine has it; its timeout is then the claim holder's.
  void postRecv(int src, int tag, char* data, int64_t bytes, Done done,
                std::shared_ptr<AnySourceClaim> claim = nullptr);
  // How errors and callbacks name this group's ranks: groupRankOf[r] for rank r here (a host's
  // group inside a group spanning hosts names the whole group's ranks). Before the first post.
  void setRankNames(std::vector<int> groupRankOf) { names_ = std::move(groupRankOf); }

 private:
  struct Op {
    bool send;
    int peer;  // -1: any source (recv)
    int tag;
    char* data;
    int64_t bytes;
    int64_t done = 0;     // payload bytes moved
    bool framed = false;  // header written (send) or read (recv)
    std::chrono::steady_clock::time_point deadline;
    Done callback;
    std::shared_ptr<AnySourceClaim> claim;
  };
  struct Header {
    int32_t tag;
    int32_t pad;
    int64_t bytes;
  };

  void loop();
  bool progressSend(Op& op);
  bool progressRecv(Op& op);
  bool claimAnySource(Op& op);
  void ringWrite(int dst, const char* src, int64_t n);
  void ringRead(int src, char* dst, int64_t n);
  int64_t ringFree(int dst) const;
  int64_t ringAvailable(int src) const;
  // The tag of src's next message, without consuming it; -1 while its header is not in.
  int64_t nextTag(int src) const;
  void ring(int rankToWake);
  void fail(Op& op, const std::string& message);
  std::string describe(const Op& op) const;
  int name(int r) const { return r >= 0 && r < static_cast<int>(names_.size()) ? names_[r] : r; }

  ShmGroup& group_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::list<Op> ops_;  // in posting order; per-peer FIFO order is kept by scanning in order
  std::atomic<bool> stop_{false};
  std::chrono::steady_clock::time_point lastPeerCheck_{};
  std::vector<int> names_;
  std::thread thread_;
};

}  // namespace hoccl
