// A Plan is the deterministic list of steps one rank runs for one collective. Algorithms only
// build plans (plan/*.cpp); executors only run them (exec/executor.cpp). Every rank builds its plan
// from the same inputs, so all ranks agree on barriers and staging-buffer use.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "exec/reduce_kernels.h"

namespace hoccl {

enum class OpKind : int8_t {
  AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Gather, Scatter, AllToAll, Barrier
};
const char* opKindName(OpKind k);

// Where bytes live. In/Out: the op's own input/output blocks (block = tensor, or a slice of
// one). Slot: rank `rank`'s staging buffer `buf` (relative to the running buffer cursor).
// PeerIn/PeerOut: another rank's input/output block, read directly from its memory
// (cross-memory copy, one copy instead of staging's two).
enum class Space : int8_t { In, Out, Slot, PeerIn, PeerOut };

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
  bool remote() const { return space == Space::PeerIn || space == Space::PeerOut; }
};

struct Step {
  enum class Kind : int8_t { Copy, Reduce, Barrier } kind;
  Loc dst{};
  Loc src{};                // Copy
  int64_t bytes = 0;        // Copy
  std::vector<Loc> srcs;    // Reduce, in rank order
  int64_t count = 0;        // Reduce: elements
  bool finalize = false;    // Reduce: apply AVG / PREMUL_SUM scaling to dst

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
  static Step barrier() { return Step{Kind::Barrier}; }
};

struct Plan {
  std::string algo;
  std::vector<Step> steps;
  int buffersUsed = 0;  // how far the staging-buffer cursor advances
  int barriers() const;
  bool readsPeers() const;       // some step reads a peer's memory directly (cross-memory or mapped)
  std::string describe() const;  // for HOCCL_DEBUG=TRACE
};

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
};

Plan buildPlan(const PlanRequest& req);
// True when buildPlan(req) picks a direct-read plan (peers' buffers read in place).
bool readsPeersDirectly(const PlanRequest& req);
// all_reduce past allReduceDirectReadMaxBytes: the plan depends on whether every rank's tensor
// is shared, which ranks learn from a first barrier that publishes addresses and regions.
bool allReduceChoosesAfterPublishing(const PlanRequest& req);

// Plan builders, one algorithm family per file.
Plan planAllReduceOneShot(const PlanRequest& req);
Plan planAllReduceRsAg(const PlanRequest& req);
Plan planAllGather(const PlanRequest& req, bool onlyRoot);  // gather = allgather to root only
Plan planBroadcast(const PlanRequest& req);
Plan planScatter(const PlanRequest& req);
Plan planReduce(const PlanRequest& req);
Plan planStagedReduce(const PlanRequest& req, bool rootOnly, const char* algo);
Plan planReduceScatter(const PlanRequest& req);
Plan planAllToAll(const PlanRequest& req);
// Single-copy variants: every rank reads what it needs straight from its peers' buffers.
Plan planDirectRead(const PlanRequest& req);
Plan planAllToAllDirectRead(const PlanRequest& req);

}  // namespace hoccl
