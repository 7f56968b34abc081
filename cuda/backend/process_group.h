// ProcessGroupHOCCL: the c10d::Backend. Collectives are validated on the calling thread,
// then run in issue order by one worker thread per group (the CPU stream manager); send/recv
// go to the P2P engine's progress thread.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <tuple>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/config.h"
#include "backend/host_table.h"
#include "backend/work.h"
#include "backend/op_profile.h"
#include "backend/op_queue.h"
#include "exec/executor.h"
#include "transport/shm/huge_pages.h"
#include "transport/shm/p2p_engine.h"
#include "plan/plan.h"
#include "transport/shm/shm_group.h"

namespace hoccl {
namespace varipath {
class Scheduler;
}
class HostSpan;
struct InterHostGroups;

class ProcessGroupHOCCL : public c10d::Backend {
 public:
  // rank and size are the group's (c10d's, in arguments and messages); its shared memory spans
  // the ranks on this rank's host, all of them unless spansHosts. A group spanning hosts runs its
  // collectives as plans across hosts (joinHosts), which name blocks of every rank of it.
  ProcessGroupHOCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, bool spansHosts = false);
  ~ProcessGroupHOCCL() override;

  const std::string getBackendName() const override { return "hoccl"; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void shutdown() override;
  // Counts collectives issued on this group (torch reads it for object collectives, logging).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return issued_.load(); }
  void abort() override;
  // Breaks the group on every rank of it with this reason (what their blocked ops then raise).
  void abortWith(const std::string& reason);

  // The VarioPath scheduler all_to_all plans with: the one varipath.scheduler_for() returns for
  // HOCCL_TOPOLOGY and HOCCL_VARIPATH_MODEL (set by the Python creator; null on the flat
  // topology, where every pair goes in one phase).
  void setAllToAllScheduler(std::shared_ptr<const varipath::Scheduler> scheduler);
  // Makes this group, created with spansHosts, run its collectives across hosts: over the gloo
  // groups the Python creator built (multihost.py), which it owns from then on. Once, before any op.
  void spanHosts(InterHostGroups groups, int64_t leaderMaxBytes, bool checkAcrossHosts);
  bool spansHosts() const { return span_ != nullptr; }
  // What crossing hosts costs, as plans and all_to_all's form weigh it (a group spanning hosts).
  NetCosts netCosts() const;
  // Ranks of each host, hosts in order of their lowest rank.
  const std::vector<std::vector<int>>& hostRanks() const { return hosts_.ranksOf; }
  std::string lastAlgorithm() const;
  // How this rank saw its cores at its latest op (core_sharing.h): tests and diagnostics.
  CoreSharing lastCoreSharing() const { return lastCoreSharing_.load(std::memory_order_relaxed); }
  // The phases the last all_to_all ran, its self-copy phase first (tests compare them).
  std::vector<TransferPhase> lastAllToAllPhases() const;
  // all_to_all split matrices planned so far, and those served from the plan cache.
  std::pair<uint64_t, uint64_t> allToAllPlanCounts() const;
  // Synchronous in-place all_reduce of a dense CPU tensor, without a c10d Work for the caller
  // (torch.ops.hoccl.all_reduce_, direct_allreduce.cpp).
  void allreduceNow(const at::Tensor& tensor, const c10d::ReduceOp& reduceOp);

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Synchronous, on the caller's thread, over the store (monitored_barrier.cpp).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

 private:
  friend class HostSpan;  // runs this group's plans, queue and host transfers for its ops
  struct Collective;  // one validated, ready-to-run collective

  // What a group spanning hosts runs its collectives across hosts with, as single plans
  // (across_hosts.cpp): steps inside the host on this group's shared memory, steps across hosts
  // on `net`. Set once, before the first such op.
  struct HostsContext {
    NetTransport* net = nullptr;
    int64_t leaderMaxBytes = 0;
    int64_t netChunkBytes = 0;
    NetCosts netCosts;             // what crossing hosts costs (measured when the group was created)
    // send/recv between this host's ranks: the whole group's timeout, not the longer one this
    // group's collectives wait inside the host (a host barrier may wait for a peer's network failure).
    std::chrono::milliseconds pointToPointTimeout{0};
  };
  void joinHosts(HostsContext hosts);
  // One collective of the whole group, on the calling thread (an op of this group's queue), over
  // raw blocks the caller keeps alive (laid out as the single-host entry points lay them out);
  // `netTag` must be the same on every rank of the group and unique among its ops in flight.
  struct HostsOp {
    const char* opName;
    OpKind kind;
    int root = 0;
    std::vector<char*> in, out;
    int64_t bytes = 0;     // PlanRequest::bytes
    int64_t elemSize = 1;
    int64_t numel = 0;     // what the host's ranks check they agree on
    c10::ScalarType dtype = c10::ScalarType::Byte;
    RedOp op = RedOp::Sum;
    double factor = 1.0;
    std::vector<TransferPhase> phases;  // all_to_all: every pair's bytes
    // all_to_all without the whole matrix (phases empty): this rank's send and receive bytes per
    // rank of the whole group; the host's ranks trade theirs through shared memory.
    std::vector<int64_t> sendBytes, recvBytes;
    AllToAllHostsForm allToAllForm = AllToAllHostsForm::Auto;
  };
  void runAcrossHosts(const HostsOp& op, int64_t netTag);
  void allreduceAcrossHosts(const at::Tensor& tensor, RedOp op, double factor, int64_t netTag);

  using Body = std::function<void()>;

  // Queues body for the worker, or runs it on the caller's thread when nothing is queued and the
  // op is small or the caller waits for it anyway (c10d's asyncOp=false, CPU tensors);
  // bytes = payload size.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, Body body,
                                         int64_t bytes = INT64_MAX, bool callerWaits = false);
  // enqueue() for an entry point that serves every host layout: a group spanning hosts queues by
  // HostSpan's rule (its CUDA staging captures the body; no size threshold).
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<at::Tensor> outputs, Body body,
                                        int64_t bytes, bool callerWaits);
  void runCollective(Collective& c);
  void runPlan(Collective& c, const std::shared_ptr<const Plan>& plan);
  void runAllToAll(Collective& c);
  std::shared_ptr<const Plan> allToAllPlan(Collective& c, const std::vector<int64_t>& matrix, bool published);
  bool everySplitIs(uint32_t parity, int64_t bytes) const;
  void promoteReusedBuffers(const Collective& c, bool peersRead);
  // Also records whether any rank saw the job's own compute (groupOtherWork_), from the same table.
  void validateDescriptors(const Collective& c, uint32_t parity);
  // Decides this op's view of the cores and publishes it in its descriptor (core_sharing.h).
  void noteCoreSharing(Collective& c);
  void validateSplits(const Collective& c, uint32_t parity) const;
  std::vector<TransferPhase> scheduleAllToAll(const std::vector<int64_t>& matrix);
  std::vector<TransferPhase> varipathPhases(const std::vector<int64_t>& matrix);

  std::shared_ptr<const Plan> planFor(const PlanRequest& req);
  // Slot bytes a staged plan of this payload uses per round (HOCCL_STAGED_ROUND_BYTES).
  int64_t crossMemoryMinBytes(OpKind kind) const;
  int64_t stagingRoundBytes(OpKind kind, int64_t payloadBytes) const;
  // The spin floor of an op run on a caller's thread that only waits for it (the shared-cores one
  // while cores are shared).
  std::chrono::microseconds callerSpin() const;
  // After a barrier with this parity: does every rank's input block 0 lie in a shared tensor?
  bool everyRankShared(uint32_t parity, int64_t bytes) const;
  void checkWait(const Collective& c, int peer);
  void ensureP2P();
  // CUDA tensors (cuda_tensors.cpp): order after the caller's stream, run on the comm
  // stream, copy-engine transport for the ops it covers, host staging for the rest.
  c10::intrusive_ptr<c10d::Work> enqueueCuda(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                                             const std::vector<at::Tensor>& outputs,
                                             std::function<void(c10::Stream)> deviceBody);
  c10::intrusive_ptr<c10d::Work> enqueueCudaViaHost(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                                                    const std::vector<at::Tensor>& outputs,
                                                    std::function<void(const std::vector<at::Tensor>&,
                                                                       const std::vector<at::Tensor>&)> hostBody);
  c10::Stream commStream(c10::Device device);
  void* ceGroup(c10::Device device);  // CeGroup*, created collectively on first use
  std::optional<c10::intrusive_ptr<c10d::Work>> tryCuda(const char* op, c10d::OpType type,
                                                         std::vector<at::Tensor> inputs,
                                                         std::vector<at::Tensor> outputs,
                                                         std::function<void(const std::vector<at::Tensor>&,
                                                                            const std::vector<at::Tensor>&)> hostBody,
                                                         std::function<void(c10::Stream)> ceBody = nullptr);
  // An op over CUDA tensors, rerun as `call` on host mirrors where no copy-engine body serves it.
  using HostCall = std::function<c10::intrusive_ptr<c10d::Work>(const std::vector<at::Tensor>& hostInputs,
                                                                const std::vector<at::Tensor>& hostOutputs)>;
  // Every entry point's CUDA routing: on a group spanning hosts through host mirrors
  // (HostSpan::viaHost), on one host by tryCuda. None when no tensor is on a GPU.
  std::optional<c10::intrusive_ptr<c10d::Work>> routeCuda(const char* op, c10d::OpType type,
                                                           const std::vector<at::Tensor>& inputs,
                                                           const std::vector<at::Tensor>& outputs, HostCall call,
                                                           std::function<void(c10::Stream)> ceBody = nullptr);
  std::function<void(c10::Stream)> ceAllReduce(at::Tensor t, RedOp op, double factor);
  std::function<void(c10::Stream)> ceAllGather(at::Tensor out, at::Tensor in);
  std::function<void(c10::Stream)> ceBroadcast(at::Tensor t, int root);
  std::function<void(c10::Stream)> ceAllToAll(at::Tensor out, at::Tensor in);
  at::Tensor cudaHostMirror(const at::Tensor& t, bool copyIn);
  static void finishCudaRecv(const at::Tensor& user, const at::Tensor& host, c10::Stream comm, WorkHOCCL& work);
  static bool anyCuda(const std::vector<at::Tensor>& ts);
  c10::intrusive_ptr<c10d::Work> postP2P(std::vector<at::Tensor>& tensors, int peer, int tag, bool send,
                                         std::shared_ptr<AnySourceClaim> claim = nullptr);

  // Collective builders shared by the public entry points.
  void allreduceTensor(const at::Tensor& tensor, RedOp op, double factor);
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors, RedOp op);
  void runSparseAllreduce(at::Tensor tensor, RedOp op);  // worker side, sparse_allreduce.cpp
  void allgatherBlocks(const at::Tensor& input, const std::vector<at::Tensor>& outputs, OpKind kind, int root);
  void reduceScatterBlocks(const std::vector<at::Tensor>& inputs, const at::Tensor& output, RedOp op, double factor);
  // Block b of in/out goes to/comes from rank b (pointers and sizes: no sub-tensors to build).
  struct AllToAllBlocks {
    std::vector<char*> in, out;
    std::vector<int64_t> sendBytes, recvBytes;
  };
  void alltoallBlocks(AllToAllBlocks blocks, c10::ScalarType dtype, const char* opName);

  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::optional<c10::Stream> comm_;
  std::shared_ptr<void> ce_;  // CeGroup (type-erased: cuda-ce headers stay out of this header)
  HostTable hosts_;
  // This rank and the ranks sharing its memory (group_'s): every rank of the group unless it
  // spans hosts. groupRankOf_: per rank of group_, its rank in this group (errors name those).
  int localRank_ = 0, localSize_ = 1;
  std::vector<int> groupRankOf_;
  std::vector<int> localIndex_;  // per rank of this group: its rank in group_, -1 on other hosts
  int localIndexOf(int rank) const { return localIndex_[rank]; }
  c10::intrusive_ptr<c10d::Store> hostStore_;  // the keys of this host's shared memory
  HocclConfig config_;
  std::unique_ptr<ShmGroup> group_;
  std::unique_ptr<Executor> executor_;
  HugePagePromoter hugePages_;  // after config_: built from it
  std::unique_ptr<P2PEngine> p2p_;
  std::mutex p2pMutex_;
  uint32_t opSeq_ = 0;  // worker thread only
  // Whether any rank saw the job's own compute (coresShared == 2) at the last op with validated
  // descriptors: then no rank yields. Worker thread only.
  bool groupOtherWork_ = false;
  std::atomic<CoreSharing> lastCoreSharing_{CoreSharing::None};
  uint64_t monitoredBarriers_ = 0;  // calls so far: keys of each call are fresh

  OpQueue queue_;
  std::atomic<uint64_t> issued_{0};  // collectives issued so far (getSequenceNumberForGroup)

  std::mutex planMutex_;
  // Keyed by (kind, root, element size, bytes, cross-memory, addresses published, every tensor
  // shared): what a plan depends on.
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t, bool, bool, bool>, std::shared_ptr<const Plan>> planCache_;
  bool hasChannels_ = false;  // VarioPath was configured (names the algorithm "varipath")
  // all_to_all schedules and plans of the most recent split matrices, most recent first, keyed
  // by the whole matrix: equal-split all_to_all and MoE layers with a fixed capacity send the
  // same matrix every step, and schedule and plan are pure functions of it (every rank gets the
  // same phases whether or not its cache holds them). Two plans per matrix: one that publishes
  // addresses at its first barrier, one that runs after a split exchange already did.
  struct CachedSchedule {
    std::vector<int64_t> matrix;
    std::shared_ptr<const std::vector<TransferPhase>> phases;
    std::shared_ptr<const Plan> plans[2];
  };
  mutable std::mutex scheduleMutex_;
  std::deque<CachedSchedule> scheduleCache_;
  uint64_t schedulesPlanned_ = 0, schedulesReused_ = 0;
  std::shared_ptr<const varipath::Scheduler> scheduler_;
  std::unique_ptr<OpProfile> profile_;  // HOCCL_DEBUG=INFO and up: printed at shutdown
  mutable std::mutex lastAlgoMutex_;
  std::string lastAlgo_;
  std::optional<HostsContext> hostsCtx_;
  std::mutex hostPlanMutex_;
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t>, std::shared_ptr<const Plan>> hostPlanCache_;
  // Runs a collective of the whole group across hosts (the caller set c.ctx.net).
  void runAcrossHosts(Collective& c);
  std::shared_ptr<const Plan> hostPlanFor(const PlanRequest& req);
  // all_to_all from own splits: the request's pairs from this rank's splits (and its host's).
  void planFromOwnSplits(Collective& c);
  std::shared_ptr<const std::vector<TransferPhase>> lastAllToAllPhases_;  // guarded by lastAlgoMutex_
  // The algorithm of the last plan this group ran (lastAlgorithm() names a spanning group's ops).
  std::string planAlgorithm() const;
  // all_gather among this host's ranks only, `outputs` in their order, on the calling thread; no
  // argument checks: the body of a single-host all_gather, and a leg of one across hosts.
  void allgatherOnHost(const std::vector<at::Tensor>& outputs, const at::Tensor& input);
  // Last: its network stops after this group's queue (shutdown) and goes before the rest.
  std::unique_ptr<HostSpan> span_;
};

}  // namespace hoccl
