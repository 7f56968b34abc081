// Collectives of a group whose ranks sit on several hosts, run by the group of each host's ranks
// as one plan across hosts: the plan's steps inside the host use this group's shared memory and
// barriers, its Send/Recv steps the network transport the multi-host group handed in.
#include "backend/collective.h"
#include "backend/tensor_args.h"
#include "transport/shm/futex_wait.h"

namespace hoccl {

void ProcessGroupHOCCL::joinHosts(HostsContext hosts) {
  TORCH_CHECK(hosts.net, "hoccl: rank ", rank_, ": an incomplete host context");
  hostsCtx_ = std::move(hosts);
}

std::shared_ptr<const Plan> ProcessGroupHOCCL::hostPlanFor(const PlanRequest& req) {
  // all_to_all's plan follows its split matrix, which the key does not hold.
  if (!req.phases.empty()) return std::make_shared<const Plan>(buildPlan(req));
  // The host layout and thresholds are fixed per group: the rest of the request is the key.
  const auto key = std::make_tuple(int(req.kind), req.root, int64_t(req.elemSize), req.bytes, req.slotBytes);
  std::lock_guard<std::mutex> lock(hostPlanMutex_);
  auto it = hostPlanCache_.find(key);
  if (it != hostPlanCache_.end()) return it->second;
  auto plan = std::make_shared<const Plan>(buildPlan(req));
  if (hostPlanCache_.size() > 256) hostPlanCache_.clear();
  hostPlanCache_[key] = plan;
  return plan;
}

void ProcessGroupHOCCL::runAcrossHosts(Collective& c) {
  const HostsContext& hosts = *hostsCtx_;
  c.req.rank = rank_;
  c.req.world = size_;
  c.req.hostOf = hosts_.hostOf;
  c.req.leaderMaxBytes = hosts.leaderMaxBytes;
  c.req.netChunkBytes = hosts.netChunkBytes;
  c.req.netCosts = hosts.netCosts;
  // The single-host choice of direct-read plans does not apply across hosts: a builder there
  // reads peers only where it says so (all_reduce's rails, hostReadsPeers).
  c.req.crossMemory = false;
  c.req.hostReadsPeers = group_->crossMemory();
  // Every input of the plan must be the same on every host: the staging rounds of one host's
  // ranks follow their view of the cores, which other hosts do not share, so plans across hosts
  // take the whole slot (the message sizes follow from it).
  c.req.slotBytes = static_cast<int64_t>(group_->slotBytes());
  c.ctx.localIndex = &localIndex_;
  c.ctx.checkNet = [&](int) {
    if (group_->aborted())
      throw std::runtime_error(std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) +
                               ": the group was aborted: " + group_->abortMessage());
  };
  c.ctx.validate = [&](uint32_t p) { validateDescriptors(c, p); };
  const bool ownSplits = c.req.kind == OpKind::AllToAll && c.req.phases.empty();
  if (ownSplits) planFromOwnSplits(c);  // promotes before any barrier publishes the addresses
  std::shared_ptr<const Plan> plan = hostPlanFor(c.req);
  if (!ownSplits) promoteReusedBuffers(c, plan->readsPeers());
  runPlan(c, plan);
}

// all_to_all that gathers no split matrix across hosts (HOCCL_CHECK_ACROSS_HOSTS=0), in the
// direct form: a cross-host block needs only its sender's and its receiver's own sizes. Inside
// the host, where the ranks read each other's memory, each receiver pulls its blocks by its own
// receive sizes, so the whole plan follows from this rank's splits: its network transfers go out
// before its first barrier, which publishes the addresses and checks the host's splits against
// each other. Otherwise the host's blocks move through staging slots, whose rounds every rank of
// the host must plan alike: the ranks first trade their splits at a host barrier (as on one host;
// the network waits for it). Either way no message round precedes the data.
void ProcessGroupHOCCL::planFromOwnSplits(Collective& c) {
  const std::vector<int>& globalOf = groupRankOf_;
  std::vector<int64_t> send(localSize_), recv(localSize_);
  int64_t sentInHost = 0;
  for (int l = 0; l < localSize_; ++l) {
    send[l] = c.sendBytes[globalOf[l]];
    recv[l] = c.recvBytes[globalOf[l]];
    if (l != localRank_) sentInHost += send[l];
  }
  const bool readsPeers = c.req.hostReadsPeers;
  promoteReusedBuffers(c, readsPeers && sentInHost >= c.req.crossMemoryMinBytes);
  const uint32_t parity = executor_->nextBarrier() & 1;
  group_->publishSplits(parity, send, recv);
  // The host's splits are checked in its shared table, for free; the cross-host blocks go
  // unchecked, as HOCCL_CHECK_ACROSS_HOSTS=0 says.
  c.ctx.validate = [this, &c](uint32_t p) {
    validateDescriptors(c, p);
    validateSplits(c, p);
  };
  c.req.allToAllForm = AllToAllHostsForm::Direct;
  const int me = rank_;
  TransferPhase pairs;
  if (readsPeers) {
    pairs.push_back({me, me, c.sendBytes[me]});
    c.req.crossMemoryMinBytes = 0;  // read in place at every size: the host's ranks agree without a word
    c.req.bytes = sentInHost;
  } else {
    Plan exchange;
    exchange.algo = "alltoall/host-splits";
    exchange.steps.push_back(Step::barrier(Scope::Host));
    executor_->run(exchange, c.ctx);
    c.ctx.validate = nullptr;
    int64_t hostBytes = 0;
    for (int s = 0; s < localSize_; ++s)
      for (int d = 0; d < localSize_; ++d) {
        const int64_t b = group_->splits(s, parity)[d];
        pairs.push_back({globalOf[s], globalOf[d], b});
        hostBytes += b;
      }
    // The staging rounds follow from these: the same on every rank of the host.
    c.req.bytes = hostBytes / localSize_;
  }
  // This rank's row and column: every other rank's where it reads same-host peers in place, else
  // the other hosts' (its host's pairs are listed above).
  for (int g = 0; g < size_; ++g) {
    if (g == me || (!readsPeers && localIndex_[g] >= 0)) continue;
    pairs.push_back({me, g, c.sendBytes[g]});
    pairs.push_back({g, me, c.recvBytes[g]});
  }
  c.req.phases = {std::move(pairs)};
}

void ProcessGroupHOCCL::runAcrossHosts(const HostsOp& op, int64_t netTag) {
  TORCH_CHECK(hostsCtx_, "hoccl ", op.opName, " on rank ", rank_, ": this group was not joined to its hosts");
  // On the thread running the op from this group's queue (HostSpan::enqueue chose it). While the
  // ranks spin, that thread waits as a caller about to block would: at least the caller's spin
  // (none while cores are shared, unless HOCCL_CALLER_SPIN_US asks for it, as on one host).
  SpinAtLeast spin{callerSpin()};
  Collective c{op.opName};
  c.req.kind = op.kind;
  c.req.root = op.root;
  c.req.elemSize = op.elemSize;
  c.req.bytes = op.bytes;
  c.req.phases = op.phases;
  c.req.allToAllForm = op.allToAllForm;
  c.sendBytes = op.sendBytes;
  c.recvBytes = op.recvBytes;
  c.ctx.in = op.in;
  c.ctx.out = op.out;
  c.ctx.dtype = op.dtype;
  c.ctx.op = op.op;
  c.ctx.factor = op.factor;
  c.ctx.desc.numel = op.numel;
  c.ctx.net = hostsCtx_->net;
  c.ctx.netTag = netTag;
  runCollective(c);
}

void ProcessGroupHOCCL::allreduceAcrossHosts(const at::Tensor& t, RedOp op, double factor, int64_t netTag) {
  const at::Tensor tensor = reducible(t);
  HostsOp o{"all_reduce", OpKind::AllReduce};
  o.elemSize = tensor.element_size();
  o.bytes = nbytes(tensor);
  o.in = o.out = {ptr(tensor)};
  o.dtype = tensor.scalar_type();
  o.op = op;
  o.factor = factor;
  o.numel = tensor.numel();
  runAcrossHosts(o, netTag);
}

}  // namespace hoccl
