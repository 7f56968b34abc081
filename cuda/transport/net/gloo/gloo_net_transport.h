// The reference network engine (transport/net_transport.h) over gloo: plans' network transfers on
// the multi-host group's framed point-to-point engine (framed_p2p.h), the one its user send/recv
// use. Plans pass tags from 2^30 up, disjoint from user tags; the framing gives the size check
// and MPI's non-overtaking order per (sender, receiver, tag). Byte ranges travel as uint8 views of
// the caller's memory (at::from_blob): no copies beyond the framing's own for payloads up to 16 KiB.
//
// gloo's waits cannot poll (a wait that expires breaks the whole gloo context), so wait() hands the
// blocking wait to a waiter thread and waits for its answer in slices of kWaitSlice, calling
// `check` between them; a recv already matched with nothing in flight completes on the caller's
// thread. Waiter threads are pooled (one per transfer being waited at once) and outlive this object
// only as long as a wait they hold.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "transport/net/gloo/framed_p2p.h"
#include "transport/net_transport.h"

namespace hoccl {

class GlooNetTransport : public NetTransport {
 public:
  // How errors name a peer, e.g. "rank 3 on host 'b' (ranks 2, 3)"; the creator supplies it.
  using PeerNamer = std::function<std::string(int peer)>;
  static constexpr std::chrono::milliseconds kWaitSlice{10};

  GlooNetTransport(std::shared_ptr<FramedP2P> framed, int world, PeerNamer peerName);
  ~GlooNetTransport() override;

  int rank() const override { return framed_->rank(); }
  int world() const override { return world_; }
  Handle isend(int peer, int64_t tag, const void* data, size_t bytes) override;
  Handle irecv(int peer, int64_t tag, void* data, size_t bytes) override;
  // Throws NetTransportError naming the peer when gloo fails or the engine's timeout (the group's,
  // FramedP2P::timeout) passes; std::runtime_error for a size mismatch (FramedP2P's words) and
  // after abort(). When `check` throws, the transfer is cancelled (see cancel) before it rethrows,
  // so the caller may free the memory.
  void wait(Handle h, const std::function<void(int waitingFor)>& check) override;
  // A recv no message matched yet is withdrawn at once; any other transfer is waited out, at most
  // the engine's timeout (plus a second); errors are ignored. Unknown handles are ignored.
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
  // Waits `t` out, at most the engine's timeout plus a second, ignoring its error.
  void settle(const std::shared_ptr<Transfer>& t);
  [[noreturn]] void fail(const Transfer& t, std::exception_ptr error) const;
  std::string describe(const Transfer& t) const;
  std::string aborted() const;
  void checkPeer(const Transfer& t) const;  // a valid peer, and not aborted

  std::shared_ptr<FramedP2P> framed_;
  int world_;
  PeerNamer peerName_;
  std::shared_ptr<Waiters> waiters_;

  mutable std::mutex mutex_;
  std::unordered_map<Handle, std::shared_ptr<Transfer>> transfers_;
  Handle next_ = 0;
  std::string aborted_;
};

}  // namespace hoccl
