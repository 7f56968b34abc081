// Send/recv across hosts with a size check. gloo posts a recv of a fixed size and cannot say
// what is coming (it ends the process on a longer message, short-fills on a shorter one), so
// every message travels as two: a fixed-size header on one gloo slot, then the payload on a
// slot of its own. One listener thread per group receives headers from any rank, matches them
// to posted recvs by (source, tag) in order, and posts the payload recv into the user's buffer,
// or into a scratch buffer of the sender's size when the sizes differ: the sender's work still
// completes and the recv raises, naming both sides.
//
// The gloo group is this object's alone: headers on slot 0, payloads on per-sender slots
// 1..2^31-2 (the user's tag rides in the header), so a header recv can never meet a payload.
// Payloads up to 16 KiB ride inside their header's message instead.
//
// Ordered messages (sendOrdered/recvOrdered) are for callers whose both sides derive every
// message's size and order from the same data (plans): one gloo message each, the k-th to a peer
// on ordered slot k, no header and no listener hop, so the receive is posted when the caller
// posts it and the payload streams as soon as both sides are there. gloo cannot check their
// sizes; the framed messages can.
//
// The same engine serves the multi-host group's user send/recv (framed) and plans' network
// transfers through GlooNetTransport (gloo_net_transport.h; ordered).
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/any_source_claim.h"

namespace hoccl {

class FramedP2P : public std::enable_shared_from_this<FramedP2P> {
 public:
  // What a header says about its payload; a small payload comes inline (slot 0).
  struct Header {
    int64_t tag, slot, bytes, dtype, numel;
    at::Tensor inlined;  // bytes, when the payload came with the header
  };
  // One recv: posted by the caller, matched by the listener (or at once, to a header that came
  // first). Guarded by the engine's mutex.
  struct Pending {
    int wantSrc;  // -1: any source
    int64_t tag;
    at::Tensor user, buffer;  // buffer: contiguous, the user tensor itself when it can be
    bool matched = false;
    int src = -1;
    c10::intrusive_ptr<c10d::Work> payload;  // null for an empty message
    std::string mismatch;                    // set when the sender's size differs
    std::string failed;                      // set when the message can never come
    std::shared_ptr<AnySourceClaim> claim;   // a recv from any source another engine holds too
  };

  FramedP2P(c10::intrusive_ptr<c10d::Backend> gloo, int rank, std::chrono::milliseconds timeout);
  ~FramedP2P();

  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int dst, int64_t tag);
  // With a claim (src -1 only; common/any_source_claim.h), a header matches this recv only if it
  // takes the claim first; once another engine has it, the recv is withdrawn and its work is
  // never to be waited.
  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& user, int src, int64_t tag,
                                      std::shared_ptr<AnySourceClaim> claim = nullptr);
  // Ordered messages (above): `bytes` is a contiguous uint8 view of the caller's memory.
  c10::intrusive_ptr<c10d::Work> sendOrdered(const at::Tensor& bytes, int dst);
  c10::intrusive_ptr<c10d::Work> recvOrdered(const at::Tensor& bytes, int src);
  void setTimeout(std::chrono::milliseconds timeout);
  // Ends the listener; recvs still waiting fail with `reason`. Idempotent.
  void stop(const std::string& reason);

  // For the recv work: blocks until `p` is matched or `budget` has passed since `start`;
  // raises on timeout (withdrawing the recv) or failure.
  void awaitMatch(const std::shared_ptr<Pending>& p, std::chrono::steady_clock::time_point start,
                  std::chrono::milliseconds budget);
  std::chrono::milliseconds timeout() const;
  int rank() const { return rank_; }

 private:
  void listen();
  void deliver(int src, const Header& h);
  void match(Pending& p, int src, const Header& h);  // under mutex_
  // Under mutex_: whether `p` may take a message (its claim, if any, taken by the network).
  static bool claims(const Pending& p);
  void withdraw(const std::shared_ptr<Pending>& p);
  void failAll(const std::string& reason);           // under mutex_
  c10::intrusive_ptr<c10d::Work> post(bool isSend, const at::Tensor& t, int peer, int slot);

  c10::intrusive_ptr<c10d::Backend> gloo_;
  int rank_;
  std::chrono::milliseconds timeout_;

  std::mutex postMutex_;  // ProcessGroupGloo's send/recv are not thread-safe
  std::vector<uint32_t> sent_;  // per destination: messages sent (picks the payload slot)
  std::vector<uint32_t> orderedSent_, orderedReceived_;  // per peer: ordered messages so far

  mutable std::mutex mutex_;
  std::condition_variable matched_;
  std::deque<std::shared_ptr<Pending>> posted_;  // unmatched recvs, in posting order
  std::deque<std::pair<int, Header>> early_;      // headers no recv wanted yet, in arrival order
  std::string stopped_;                            // why no more messages will come
  c10::intrusive_ptr<c10d::Work> listening_;       // the listener's header recv
  std::thread listener_;
  std::mutex joinMutex_;
};

}  // namespace hoccl
