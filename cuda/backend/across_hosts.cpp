// Collectives of a group whose ranks sit on several hosts, run by the group of each host's ranks
// as one plan across hosts: the plan's steps inside the host use this group's shared memory and
// barriers, its Send/Recv steps the network transport the multi-host group handed in.
#include "backend/collective.h"
#include "backend/tensor_args.h"

namespace hoccl {

void ProcessGroupHOCCL::joinHosts(HostsContext hosts) {
  TORCH_CHECK(hosts.net && static_cast<int>(hosts.hostOf.size()) == hosts.world &&
                  static_cast<int>(hosts.localIndex.size()) == hosts.world,
              "hoccl: rank ", hosts.rank, ": an incomplete host context");
  hostsCtx_ = std::move(hosts);
}

std::shared_ptr<const Plan> ProcessGroupHOCCL::hostPlanFor(const PlanRequest& req) {
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
  c.req.rank = hosts.rank;
  c.req.world = hosts.world;
  c.req.hostOf = hosts.hostOf;
  c.req.leaderMaxBytes = hosts.leaderMaxBytes;
  c.req.netChunkBytes = hosts.netChunkBytes;
  // Peer reads stay inside a host; the builders across hosts stage through slots.
  c.req.crossMemory = false;
  c.ctx.localIndex = &hosts.localIndex;
  c.ctx.checkNet = [&](int) {
    if (group_->aborted())
      throw std::runtime_error(std::string("hoccl ") + c.opName + " on rank " + std::to_string(hosts.rank) +
                               ": the group was aborted: " + group_->abortMessage());
  };
  c.ctx.validate = [&](uint32_t p) { validateDescriptors(c, p); };
  runPlan(c, hostPlanFor(c.req));
}

void ProcessGroupHOCCL::allreduceAcrossHosts(const at::Tensor& t, RedOp op, double factor, int64_t netTag) {
  TORCH_CHECK(hostsCtx_, "hoccl all_reduce on rank ", rank_, ": this group was not joined to its hosts");
  auto work = enqueue(c10d::OpType::ALLREDUCE, {t}, [this, t, op, factor, netTag] {
    const at::Tensor tensor = reducible(t);
    Collective c{"all_reduce"};
    c.req.kind = OpKind::AllReduce;
    c.req.elemSize = tensor.element_size();
    c.req.bytes = nbytes(tensor);
    c.ctx.in = {ptr(tensor)};
    c.ctx.out = {ptr(tensor)};
    c.ctx.dtype = tensor.scalar_type();
    c.ctx.op = op;
    c.ctx.factor = factor;
    c.ctx.desc.numel = tensor.numel();
    c.ctx.net = hostsCtx_->net;
    c.ctx.netTag = netTag;
    runCollective(c);
  }, INT64_MAX, true);
  work->wait();
}

}  // namespace hoccl
