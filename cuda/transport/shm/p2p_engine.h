// send/recv over per-pair byte rings in the group's shared segment. A progress thread moves
// every posted operation forward as far as it can, so no pattern of posted sends and receives
// can deadlock on a single blocked call (isend/irecv in any order work, like gloo).
//
// Matching is MPI's and gloo's: a recv from a rank takes the earliest message of that rank with
// its tag, whatever was sent before it with other tags (the network engine across hosts matches
// the same way). A pair's ring delivers its messages in send order, so a message that a waiting
// recv must get past is moved out of the ring into this rank's memory (stashed) until a recv
// takes it; messages that arrive in the order they are received never are.
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
#include <vector>

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
    bool framed = false;  // send: header written; recv: bound to a message
    std::chrono::steady_clock::time_point deadline;
    Done callback;
    std::shared_ptr<AnySourceClaim> claim;
    // An unbound recv that may take the next message from `src`.
    bool waitsFor(int src) const { return !send && !framed && (peer == src || peer < 0); }
  };
  using OpIt = std::list<Op>::iterator;
  struct Header {
    int32_t tag;
    int32_t pad;
    int64_t bytes;
  };
  // A message taken out of a pair's ring before a recv asked for it.
  struct Stashed {
    int tag;
    std::vector<char> data;
  };
  // What this rank knows of the messages from one sender (progress thread only): the one at the
  // head of the ring, once its header is read, and where its payload goes; then those stashed.
  struct Incoming {
    bool framed = false;
    Header head{};
    int64_t done = 0;
    enum class Into { Nowhere, Recv, Stash, Discard } into = Into::Nowhere;
    OpIt recv{};              // Into::Recv
    std::vector<char> stash;  // Into::Stash
    std::deque<Stashed> stashed;
  };

  // Under mutex_, on the progress thread; true when anything moved.
  void loop();
  bool progressSends(bool checkPeers, std::list<Op>& finished);
  bool progressRecvs(bool checkPeers, std::list<Op>& finished);
  bool progressSend(Op& op);
  // A recv and the earliest message from `src` with its tag: stashed (copied at once: Completed),
  // at the head of the ring (Bound: drain streams it), or none yet. Failed: its size differs (the
  // callback has run). Dropped: another engine holds its claim. The caller erases those two.
  enum class BindResult { None, Bound, Completed, Failed, Dropped };
  BindResult bind(OpIt op, int src, std::list<Op>& finished);
  // Moves src's ring forward: into the recv its head message is bound to, or into a stash when a
  // recv for src (or from any source) waits behind a message no posted recv takes.
  bool drain(int src, std::list<Op>& finished);
  bool readHeader(int src);
  bool mustStash(int src) const;
  // A recv given up on while bound: the rest of its message is read and dropped.
  void unbind(const Op& op);
  void completeRecv(OpIt op, std::list<Op>& finished);
  void ringWrite(int dst, const char* src, int64_t n);
  void ringRead(int src, char* dst, int64_t n);
  int64_t ringFree(int dst) const;
  int64_t ringAvailable(int src) const;
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
  std::vector<Incoming> incoming_;  // per sender
  std::thread thread_;
};

}  // namespace hoccl
