// The part of a ProcessGroupHOCCL whose ranks sit on more than one host: its collectives' argument
// agreement across hosts, network tags and failures naming the lost host. The collectives' entry
// points and argument checks are the group's, for every layout; their bodies call in here. Every
// collective runs as one plan across hosts, which the group executes (planned.cpp,
// backend/across_hosts.cpp): steps inside the host on its shared memory, network steps on the
// network engine. The gloo engine runs over torch's ProcessGroupGloo groups that the Python
// creator made and this object owns: one per rail (the ranks with the same local index on each
// host; the argument check runs over it), one over every rank, one for the plans' transfers and
// send/recv across hosts (framed with a size check, see transport/net/gloo/framed_p2p.h; a pair
// on one host uses the group's shared memory). Ops run in the group's issue order (its OpQueue),
// so every gloo group sees its ops in the same order on every member. The algorithms and their
// choice rule are in docs/multihost.md.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/multihost/alltoall_forms.h"
#include "transport/net/engines.h"
#include "transport/net/gloo/framed_p2p.h"
#include "backend/multihost/host_layout.h"
#include "backend/process_group.h"
#include "backend/work.h"
#include "common/config.h"
#include "common/reduce_kernels.h"

namespace hoccl {

// What one rank's arguments to a collective say about it; every member of a rail must pass the
// same. dtype -1: a byte count; root and redOp -1: not part of the op.
struct OpSignature {
  int64_t kind;  // c10d::OpType
  int64_t dtype;
  int64_t count;
  int64_t root = -1;
  int64_t redOp = -1;
};

const char* collectiveName(int64_t kind);

struct InterHostGroups {
  c10::intrusive_ptr<c10d::Backend> rail;       // this rank's rail (gloo)
  c10::intrusive_ptr<c10d::Backend> global;     // every rank (gloo)
  c10::intrusive_ptr<c10d::Backend> p2p;        // every rank: send/recv across hosts, plans' transfers (gloo)
  std::vector<std::string> addressOf;           // per rank: the address its gloo groups use
};

class HostSpan {
 public:
  // Over the group's host table, rank, size and timeout.
  HostSpan(ProcessGroupHOCCL& group, InterHostGroups groups, int64_t leaderMaxBytes, bool checkAcrossHosts);
  ~HostSpan();

  void setTimeout(std::chrono::milliseconds timeout);
  // After the group's queue has stopped: no network transfer is left to wait for.
  void stopNetwork();
  void abort();
  std::string lastAlgorithm() const;
  // The phases of this rank's last all_to_all (varipath::phasesAcrossHosts of the form it ran);
  // none when no split matrix was gathered (all_to_all without the cross-host check).
  std::vector<TransferPhase> lastAllToAllPhases() const;
  const HostLayout& layout() const { return layout_; }
  // The costs plans across hosts and all_to_all's form are chosen by, agreed at creation.
  const NetCosts& netCosts() const { return netCosts_; }
  // The network engine for plans across hosts: gloo, on the framed engine user send/recv use.
  NetTransport* net() const { return net_.get(); }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag);
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag);
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag);
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks);

  // For the group's entry points, which serve every host layout (every collective; send/recv
  // and monitored_barrier stay HostSpan's): they check the arguments, then queue, stage and run
  // through these.
  using Body = std::function<void()>;
  // On the group's queue. callerWaits: the caller blocks in wait() right after (a synchronous
  // op): with nothing queued or running, and while the ranks spin, the body runs on the caller's
  // thread.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, Body body,
                                         bool callerWaits = false);
  // CUDA tensors (cuda_staging.cpp): D2H into pinned host mirrors on the comm stream, the CPU op
  // (`call`, given the mirrors in the order of `inputs` and `outputs`) over them, H2D back.
  // None when no tensor is on a GPU; the op's own checks raise on the caller's thread.
  using HostCall = ProcessGroupHOCCL::HostCall;
  std::optional<c10::intrusive_ptr<c10d::Work>> viaHost(const char* op, c10d::OpType type,
                                                        const std::vector<at::Tensor>& inputs,
                                                        const std::vector<at::Tensor>& outputs, HostCall call);
  // Worker thread, arguments agreed across hosts first: a contiguous tensor broadcast; `in`
  // gathered into `outputs` (one per rank, any layout).
  void broadcastTensor(const at::Tensor& t, int root);
  void allgatherTensors(const char* op, const at::Tensor& in, const std::vector<at::Tensor>& outputs);
  // Rooted data movement over contiguous blocks (the root's list; empty elsewhere), and the
  // barrier, each one plan across hosts.
  void gatherBlocks(const at::Tensor& in, const std::vector<at::Tensor>& outs, int root);
  void scatterBlocks(const std::vector<at::Tensor>& ins, const at::Tensor& out, int root);
  void barrierAcrossHosts();
  // Reductions, worker thread, arguments agreed across hosts first (span_reductions.cpp): one
  // contiguous tensor all-reduced, or reduced to `root` (the others' tensors keep their values);
  // contiguous blocks, one per rank, reduce-scattered into `out`.
  void allreduceTensor(const char* op, c10d::OpType kind, const at::Tensor& t, RedOp redOp, double factor);
  void reduceTensor(const at::Tensor& t, int root, RedOp redOp, double factor);
  void reduceScatterBlocks(const std::vector<at::Tensor>& inputs, const at::Tensor& out, RedOp redOp, double factor);
  // Sparse COO, checked by the caller: the same steps as on one host over this group's all_gather.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(const at::Tensor& t, RedOp op);
  // all_to_all of these blocks as one plan across hosts (worker thread).
  void alltoallBlocks(const ProcessGroupHOCCL::AllToAllBlocks& blocks, const char* op);

 private:
  // A recv from any source, on the host's shared memory and the network at once (span_send_recv.cpp).
  c10::intrusive_ptr<c10d::Work> anySource(const at::Tensor& t, int tag);
  // send/recv of a CUDA tensor through a pinned host mirror; none for a CPU tensor.
  std::optional<c10::intrusive_ptr<c10d::Work>> p2pViaHost(bool isSend, const at::Tensor& t, int peer, int tag);
  void setAlgorithm(const char* name);
  void setAllToAllPhases(const SplitMatrix& m, AllToAllHostsForm form);
  // A send/recv work joins the coalesced group while coalescing (batch_isend_irecv waits that).
  c10::intrusive_ptr<c10d::Work> tracked(c10::intrusive_ptr<c10d::Work> work);

  // One collective of the whole group as a plan across hosts (planned.cpp), run by the group
  // with a fresh network tag; a network failure becomes interHostFailed's error.
  void joinHostGroup();
  void planned(const char* op, const std::function<void(ProcessGroupHOCCL&, int64_t netTag)>& run);
  [[noreturn]] void interHostFailed(const char* op, const std::vector<int>& members, const std::exception& e);
  void checkUsable(const char* op) const;

  // Cross-host agreement (agreement.cpp): raise on every member of a rail whose arguments differ.
  void agreeOnRail(const char* op, const OpSignature& mine);
  // `bytes` of this rank's to every member of its rail, `all` in rail order (this rank's too).
  void exchangeOnRail(const char* op, const void* mine, void* all, int64_t bytes);
  // all_to_all: raises where a sender and its receiver disagree on a block's bytes.
  void checkSplits(const char* op, const SplitMatrix& m);
  [[noreturn]] void mismatchAcrossHosts(const char* op, const std::string& what);

  // Algorithms (worker thread). `flat` tensors are contiguous and one-dimensional.
  void allreduceFlat(const char* op, const at::Tensor& flat, RedOp redOp, double factor);
  void broadcastFlat(const char* op, const at::Tensor& bytes, int root);
  void allgatherFlat(const char* op, const at::Tensor& inBytes, const std::vector<at::Tensor>& outBytes);
  void reduceScatterFlat(const char* op, const std::vector<at::Tensor>& inputs, const at::Tensor& out,
                         RedOp redOp, double factor);
  // all_to_all by the gathered split matrix; the split exchange is a plan too.
  void alltoallPlanned(const ProcessGroupHOCCL::AllToAllBlocks& blocks, const char* op);
  SplitMatrix exchangeSplitsPlanned(const char* op, const std::vector<int64_t>& sendBytes,
                                    const std::vector<int64_t>& recvBytes);
  // The network tag of one op's plan (worker thread only).
  int crossTag() { return (1 << 30) | static_cast<int>(crossTags_++ & ((1u << 30) - 1)); }

  ProcessGroupHOCCL& pg_;  // the group whose ranks this spans (it owns this object)
  const int rank_, size_;  // the group's
  HostLayout layout_;
  InterHostGroups groups_;
  int host_;                 // this rank's host
  std::vector<int> myRail_;  // ranks of this rank's rail (its index on the host picks the rail)
  std::vector<int> allRanks_;
  int64_t leaderMaxBytes_;
  bool checkAcrossHosts_;
  AllToAllHostsForm alltoallChoice_ = alltoallChoice(config::text("HOCCL_MULTIHOST_ALLTOALL"));
  NetCosts netCosts_;
  std::chrono::milliseconds timeout_;

  mutable std::mutex stateMutex_;
  std::string broken_;  // the first inter-host failure; later ops fail with it at once
  std::string lastAlgo_;
  std::vector<TransferPhase> lastPhases_;
  uint32_t crossTags_ = 0;
  std::shared_ptr<FramedP2P> framed_;  // send/recv over groups_.p2p
  std::unique_ptr<NetTransport> net_;  // plans' network transfers (transport/net/engines.h)
  std::shared_ptr<FramedP2P> railFramed_;  // ordered messages over groups_.rail
  std::unique_ptr<NetTransport> railNet_;   // the argument check's (agreement.cpp), peers by rail index
  const char* netEngine_ = "";         // its row's name
  std::optional<c10::Stream> comm_;    // CUDA tensors' comm stream (caller's thread only)
};

}  // namespace hoccl
