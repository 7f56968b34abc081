// The reference network engine (transport/net_transport.h) over gloo: plans' network transfers are
// the ordered messages of the multi-host group's point-to-point engine (framed_p2p.h): one gloo
// message each, matched by order per (sender, receiver) across every tag, which is the order both
// sides' plans post them in. They carry no header, so a receive waits posted in gloo from its post
// and the payload streams without the framed path's second handshake (a 2x2-host 16 MB
// all_reduce took 46 ms framed, 42 ms ordered; a skewed 64 KB all_to_all 5.9 ms and 3.0 ms);
// gloo checks no sizes (net_transport.h). Byte ranges travel as uint8 views of the caller's memory
// (at::from_blob), never copied.
//
// gloo's waits cannot poll (a wait that expires breaks the whole gloo context), so wait() runs the
// caller's `check` once and blocks in gloo on the caller's thread: one wake-up per message (a helper
// thread that woke the caller after gloo woke it cost a second one). Checking while blocked would
// not end the wait sooner: a transfer given up on must be waited out before its memory is free.
// gloo's budget runs from the post whoever waits, so a cut link fails every transfer of a plan at
// about the same moment; abort() ends blocked waits (gloo's abortWaitSend/Recv). Transfers given
// up on are waited out by pooled waiter threads (see cancel), which outlive this object only as
// long as a wait they hold.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/net/gloo/framed_p2p.h"
#include "transport/net_transport.h"

namespace hoccl {

class GlooNetTransport : public NetTransport {
 public:
  // How errors name a peer, e.g. "rank 3 on host 'b' (ranks 2, 3)"; the creator supplies it.
  using PeerNamer = std::function<std::string(int peer)>;

  // `callerRank`: the rank errors name this side by, where the engine's ranks are a subgroup's
  // (-1: its own rank).
  GlooNetTransport(std::shared_ptr<FramedP2P> framed, int world, PeerNamer peerName, int callerRank = -1);
  ~GlooNetTransport() override;

  int rank() const override { return framed_->rank(); }
  int world() const override { return world_; }
  Handle isend(int peer, int64_t tag, const void* data, size_t bytes) override;
  Handle irecv(int peer, int64_t tag, void* data, size_t bytes) override;
  // Blocks on the caller's thread. Throws NetTransportError naming the peer when gloo fails or
  // the engine's timeout (the group's, FramedP2P::timeout, from the post) passes;
  // std::runtime_error after abort(). `check` (may be empty) runs once, before blocking; when it
  // throws, or abort() ends the wait, the transfer is waited out (see cancel) before wait()
  // throws, so the caller may free the memory.
  void wait(Handle h, const std::function<void(int waitingFor)>& check) override;
  // The transfer is waited out, at most the engine's timeout (plus a second) from its post; errors
  // are ignored. Unknown handles are ignored.
  void cancel(Handle h) override;
  // Stops the framed engine (FramedP2P::stop: the group's user recvs fail too), wakes every wait;
  // transfers then fail with `reason` as std::runtime_error.
  void abort(const std::string& reason) override;
  std::string peerName(int peer) const override;

  // Transfers posted and not yet waited or cancelled.
  size_t inFlight() const;

 private:
  struct Transfer;
  struct Waiters;

  Handle add(std::shared_ptr<Transfer> t);
  std::shared_ptr<Transfer> take(Handle h);
  // Waits `t` out, until a second past its deadline, ignoring its error.
  void settle(const std::shared_ptr<Transfer>& t);
  [[noreturn]] void fail(const Transfer& t, std::exception_ptr error) const;
  std::string describe(const Transfer& t) const;
  std::string aborted() const;
  void checkPeer(const Transfer& t) const;  // a valid peer, and not aborted

  std::shared_ptr<FramedP2P> framed_;
  int world_;
  PeerNamer peerName_;
  int callerRank_;
  std::shared_ptr<Waiters> waiters_;

  mutable std::mutex mutex_;
  std::unordered_map<Handle, std::shared_ptr<Transfer>> transfers_;
  std::vector<std::shared_ptr<Transfer>> waiting_;  // blocked in wait(), for abort()
  Handle next_ = 0;
  std::string aborted_;
};

}  // namespace hoccl
