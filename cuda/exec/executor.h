// Runs a Plan on a transport (transport/local_transport.h). Owns the running counters every rank advances identically:
// barrier sequence numbers and the staging-buffer cursor.
#pragma once
#include <c10/core/ScalarType.h>

#include <functional>
#include <vector>

#include "common/plan_types.h"
#include "common/red_op.h"
#include "transport/local_transport.h"
#include "transport/net_transport.h"

namespace hoccl {

// Where one op's time went, by kind of step (HOCCL_DEBUG=INFO and up). "read" is cross-memory
// reads of peers' buffers, also those a reduction pulls; "reduce" is the arithmetic alone.
struct PhaseTimes {
  double barrierUs = 0, copyUs = 0, readUs = 0, reduceUs = 0;
  double netUs = 0;  // waiting for transfers across hosts
  int barriers = 0;
};

struct ExecContext {
  std::vector<char*> in, out;  // block base pointers
  c10::ScalarType dtype = c10::ScalarType::Byte;
  RedOp op = RedOp::Sum;
  double factor = 1.0;  // PREMUL_SUM
  OpDesc desc{};        // published with the first barrier
  // Set once an earlier plan of the same op published this op's buffer addresses: plans run
  // after it read peers through those and publish nothing at their own first barrier.
  bool addressesPublished = false;
  // After the first barrier: compare peers' descriptors (throws on mismatch).
  std::function<void(uint32_t parity)> validate;
  // While blocked on a peer: throws on timeout, abort or a dead peer.
  std::function<void(int waitingFor)> check;
  PhaseTimes* times = nullptr;  // accumulates per-step time when set
  // Copies into the outputs use streaming (cache-bypassing) stores: the backend sets it for ops
  // whose outputs are too large to still be in cache when the caller reads them.
  bool streamOutputs = false;
  // Plans across hosts (Plan::crossesHosts): Send/Recv steps go to `net` with tag `netTag` (one
  // per op, the same on every rank), and plans name ranks of the whole group, which
  // `localIndex` maps to the local transport's ranks (-1: another host). Unset on one host.
  NetTransport* net = nullptr;
  int64_t netTag = 0;
  const std::vector<int>* localIndex = nullptr;
  // While waiting for a transfer with group rank `peer`: throws on timeout or abort.
  std::function<void(int peer)> checkNet;
};

class Executor {
 public:
  explicit Executor(LocalTransport& transport) : transport_(transport) {}
  void run(const Plan& plan, ExecContext& ctx);
  // Once per collective, after its last plan: lets go of peers' shared tensors idle for a while.
  void endOp() { transport_.endOp(); }
  // Barrier index the next barrier will use (parity selects descriptor/split buffers).
  uint32_t nextBarrier() const { return barriers_ + 1; }

 private:
  char* resolve(const Loc& loc, const ExecContext& ctx) const;
  size_t publishedIndex(const Loc& loc) const;
  void runSteps(const Plan& plan, ExecContext& ctx);
  // Peer memory as a local pointer when the transport can map it; nullptr: use readPeer.
  const char* mappedPeer(const Loc& loc, size_t bytes, const ExecContext& ctx);
  void readPeer(const Loc& loc, int64_t extraOffset, void* dst, size_t bytes, const ExecContext& ctx);
  void copy(const Step& step, const ExecContext& ctx);
  void reduce(const Step& step, const ExecContext& ctx);
  void post(const Step& step, const ExecContext& ctx);
  void waitTransfer(const Step& step, const ExecContext& ctx);
  // On a failure path: no transfer of the plan may still write into memory the caller frees.
  void cancelTransfers(const ExecContext& ctx);
  int local(int rank, const ExecContext& ctx) const;
  LocalTransport& transport_;
  uint32_t addressParity_ = 0;  // parity of the current op's first barrier
  std::vector<char> tiles_;     // per-source staging for reductions over remote memory
  std::vector<char> scratch_;   // Space::Scratch of the running plan
  std::vector<NetTransport::Handle> handles_;  // per transfer of the running plan; -1 once waited
  uint32_t barriers_ = 0;
  uint32_t bufCursor_ = 0;
};

}  // namespace hoccl
