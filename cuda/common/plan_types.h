// The Plan IR: the deterministic list of steps one rank runs for one collective. Algorithms only
// build plans (plan/*.cpp); executors only run them (exec/executor.cpp, transport/ce's executor).
// Every rank builds its plan from the same request, so all ranks agree on barriers, staging
// slots and the messages they exchange without talking.
//
// One plan spans every host of a group: steps that stay on a host name memory the host's ranks
// share (staging slots, peers' blocks) and run on the local transport; Send/Recv steps move a
// byte range to or from a rank on another host and run on the network transport. Send and Recv
// are posted, not finished: the plan says when it needs one done with a Wait, so that a builder
// keeps transfers in flight while it reduces or copies (post the send of chunk k, reduce chunk
// k+1, wait for k).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hoccl {

enum class OpKind : int8_t {
  AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Gather, Scatter, AllToAll, Barrier
};
const char* opKindName(OpKind k);

// Where bytes live. In/Out: the op's own input/output blocks (block = tensor, or a slice of
// one). Slot: rank `rank`'s staging buffer `buf` (relative to the running buffer cursor), on
// this rank's host. PeerIn/PeerOut: another rank's input/output block on this host, read
// directly from its memory (cross-memory copy, one copy instead of staging's two). Scratch:
// this rank's private buffer of Plan::scratchBytes (where network receives land before they
// are reduced or forwarded).
enum class Space : int8_t { In, Out, Slot, PeerIn, PeerOut, Scratch };

struct Loc {
  Space space;
  int32_t index;  // block for In/Out/PeerIn/PeerOut, rank for Slot
  int32_t buf;    // Slot: buffer; PeerIn/PeerOut: the peer rank
  int64_t offset; // bytes
  static Loc in(int block, int64_t off) { return {Space::In, block, 0, off}; }
  static Loc out(int block, int64_t off) { return {Space::Out, block, 0, off}; }
  static Loc slot(int rank, int buf, int64_t off) { return {Space::Slot, rank, buf, off}; }
  static Loc peerIn(int rank, int block, int64_t off) { return {Space::PeerIn, block, rank, off}; }
  static Loc peerOut(int rank, int block, int64_t off) { return {Space::PeerOut, block, rank, off}; }
  static Loc scratch(int64_t off) { return {Space::Scratch, 0, 0, off}; }
  bool remote() const { return space == Space::PeerIn || space == Space::PeerOut; }
};

// Which ranks a barrier waits for: every rank of the group (a plan on one host), or the ranks
// of this rank's host (a plan across hosts synchronizes hosts with messages instead).
enum class Scope : int8_t { Group, Host };

struct Step {
  enum class Kind : int8_t { Copy, Reduce, Barrier, Send, Recv, Wait } kind;
  Loc dst{};
  Loc src{};                // Copy, Send
  int64_t bytes = 0;        // Copy, Send, Recv
  std::vector<Loc> srcs;    // Reduce, in rank order
  int64_t count = 0;        // Reduce: elements
  bool finalize = false;    // Reduce: apply AVG / PREMUL_SUM scaling to dst
  Scope scope = Scope::Group;  // Barrier
  int32_t peer = -1;        // Send, Recv: the rank on another host (a rank of the group)
  int32_t transfer = -1;    // Send, Recv: this plan's number for it; Wait: the one it waits for
  int32_t message = -1;     // Send, Recv: its position among this plan's messages to (from) peer

  static Step copy(Loc dst, Loc src, int64_t bytes) {
    Step s{Kind::Copy};
    s.dst = dst; s.src = src; s.bytes = bytes;
    return s;
  }
  static Step reduce(Loc dst, std::vector<Loc> srcs, int64_t count, bool finalize) {
    Step s{Kind::Reduce};
    s.dst = dst; s.srcs = std::move(srcs); s.count = count; s.finalize = finalize;
    return s;
  }
  static Step barrier(Scope scope = Scope::Group) {
    Step s{Kind::Barrier};
    s.scope = scope;
    return s;
  }
  bool isTransfer() const { return kind == Kind::Send || kind == Kind::Recv; }
};

struct Plan {
  std::string algo;
  std::vector<Step> steps;
  int buffersUsed = 0;      // how far the staging-buffer cursor advances
  int64_t scratchBytes = 0; // the Scratch space the plan uses
  int transfers = 0;        // Send and Recv steps, numbered 0..transfers-1

  // Appends a Send of `bytes` from `src` to `peer` (Recv: from `peer` into `dst`) and returns
  // its transfer number for Wait. The k-th message a plan sends to a peer is the k-th the
  // peer's plan receives from this rank: builders post them in the same order on both sides.
  int send(int peer, Loc src, int64_t bytes);
  int recv(int peer, Loc dst, int64_t bytes);
  void wait(int transfer);
  void waitAll(const std::vector<int>& transfers);
  // Reserves `bytes` of Scratch (8-byte aligned) and returns its offset.
  int64_t reserveScratch(int64_t bytes);

  int barriers() const;
  bool readsPeers() const;       // some step reads a peer's memory directly (cross-memory or mapped)
  bool crossesHosts() const;     // some step is a Send or Recv
  std::string describe() const;  // for HOCCL_DEBUG=TRACE

 private:
  int post(Step s, std::vector<int>& perPeer);
  std::vector<int> sentTo_, receivedFrom_;  // messages so far, per peer
};

// What crossing hosts costs: the network engine's cost per message at the rank that sends or
// receives it, one host link's rate each way, and the rate at which a rank's host legs move the
// bytes a relay packs and unpacks. VarioPath weighs all_to_all's forms across hosts by them
// (varipath/across_hosts.h). A group spanning hosts measures the first two when it is created
// (backend/multihost/net_costs.h); the defaults here serve plans built without a group. The
// host legs' rate is configured (HOCCL_NET_RELAY_MBYTES), not measured: it is not a memcpy rate
// but carries the staging copies in and out on both hosts and their barriers, on cores the ranks
// share (1 GB/s fits the 2-core VM's relay, where memcpy runs at ~10 GB/s), and timing the relay
// against the direct form at group creation measured anywhere from 1 to 100 GB/s there.
struct NetCosts {
  double messageSec = 250e-6;
  double linkBytesPerSec = 0.5e9;
  double copyBytesPerSec = 1e9;
};

// all_to_all across hosts: VarioPath's choice (Auto) or a form configuration forces.
enum class AllToAllHostsForm : uint8_t { Auto, Direct, Relay };

struct Transfer3 { int32_t src; int32_t dst; int64_t bytes; };
using TransferPhase = std::vector<Transfer3>;

// What a plan builder needs; identical on every rank except `rank`.
struct PlanRequest {
  OpKind kind;
  int rank = 0, world = 1, root = 0;
  int64_t elemSize = 1;
  int64_t bytes = 0;             // per-rank payload (allreduce/broadcast/reduce: whole tensor;
                                 // allgather/gather: one rank's block; reduce_scatter/scatter: one output block)
  int64_t slotBytes = 0;
  int64_t oneShotMaxBytes = 0;   // allreduce: at or below this, every rank reduces everything
  bool crossMemory = false;      // peers' buffers are directly readable
  int64_t crossMemoryMinBytes = 0;  // use direct reads at or above this payload
  int64_t allReduceDirectReadMaxBytes = 0;  // all_reduce: direct reads only while bytes x world is below
  std::vector<TransferPhase> phases;  // alltoall: the schedule (every pair's bytes, in order)
  // An earlier barrier of this op published every rank's buffer addresses (direct-read plans
  // then start reading without a barrier of their own).
  bool addressesPublished = false;
  // all_reduce: every rank's tensor is a shared tensor (hoccl_backend.empty), so peers read it
  // through mappings at memcpy speed and direct reads beat staging at any size.
  bool everyTensorShared = false;
  // Per rank: the host it runs on, numbered 0..hosts-1 in the order of the group's host table
  // (never derived from rank // ranks-per-host). Empty: every rank shares one host.
  std::vector<int> hostOf;
  // Across hosts, all_reduce: up to this payload the host leaders alone cross hosts (fewer
  // messages); above it every rail carries its share (plan/allreduce_hosts.cpp).
  int64_t leaderMaxBytes = 0;
  // Across hosts: the largest message a pipelined builder sends at once (0: no limit).
  int64_t netChunkBytes = 0;
  // Across hosts: the ranks of this rank's host read each other's buffers directly (crossMemory
  // for them). The one input that may differ between hosts: builders let it change only steps
  // inside a host, never a message, a staging round count or a chunk size.
  bool hostReadsPeers = false;
  // Across hosts, all_to_all: the costs VarioPath chooses the form by, unless one is forced.
  NetCosts netCosts;
  AllToAllHostsForm allToAllForm = AllToAllHostsForm::Auto;

  int hosts() const;
  bool acrossHosts() const { return hosts() > 1; }

  // The plan runs on the copy-engine executor (transport/ce, CUDA tensors): buildPlan chooses
  // among the plans that executor runs, by its own rule (plan/copy_engine.cpp). Staging there is
  // `slotBytes` of pinned host memory per rank; the CPU thresholds above do not apply.
  bool onCopyEngine = false;
  // Copy engine: every peer's buffers are mapped into this process (CUDA IPC, the group's p2p
  // path), so the plan may read peers' blocks in place; false: every byte goes through staging.
  bool everyPeerMapped = false;
};

}  // namespace hoccl
