// What the executor needs from a network engine: the interface every transport between ranks
// on different hosts implements (transport/net/gloo/ today; an NCCL or RDMA engine goes beside
// it). Plans name network transfers by peer rank and byte range (common/plan_types.h, Send and
// Recv steps); the engine moves the bytes and turns a lost peer into an error naming it.
//
// Matching follows MPI's non-overtaking rule: messages from one sender to one receiver with
// the same tag match the receiver's recvs in the order both posted them. Both sides of a plan
// derive every message's size and order from the same request (tests/plan_simulator.py checks
// every builder for it), so an engine need not check sizes; one that does fails the recv whose
// sender sent a different number of bytes, naming both sizes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace hoccl {

// What a network engine throws when a transfer fails on the network (a lost or unreachable
// peer, the engine's own timeout); the backend names the lost host from it. Size mismatches
// and aborts are ordinary runtime errors.
struct NetTransportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class NetTransport {
 public:
  using Handle = int64_t;
  virtual ~NetTransport() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // Post a transfer of `bytes` at `data` to (from) group rank `peer`. The memory must stay valid
  // until wait() returns or cancel() has run for the handle.
  virtual Handle isend(int peer, int64_t tag, const void* data, size_t bytes) = 0;
  virtual Handle irecv(int peer, int64_t tag, void* data, size_t bytes) = 0;
  // Blocks until the transfer is done. `check` throws on the group's abort: an engine runs it
  // before blocking, and may run it again while blocked if its waits can poll (a check that fires
  // cannot free the memory sooner: the transfer is still waited out, see cancel). A failed
  // transfer (lost peer, the engine's timeout, a size mismatch where the engine checks sizes)
  // throws here.
  virtual void wait(Handle h, const std::function<void(int waitingFor)>& check) = 0;
  // On a failure path, before the memory of an unfinished transfer is freed: makes sure nothing
  // touches that memory any more (withdraws a recv that has not started, or waits the transfer
  // out, bounded by the group's timeout), ignores errors.
  virtual void cancel(Handle h) = 0;
  // Fails every pending and future transfer with `reason`. Idempotent.
  virtual void abort(const std::string& reason) = 0;
  // How errors name a peer, e.g. "rank 3 on host 'b'".
  virtual std::string peerName(int peer) const = 0;
};

}  // namespace hoccl
