#include "backend/multihost/host_span.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "backend/cuda_staging.h"
#include "backend/multihost/net_costs.h"
#include "transport/shm/futex_wait.h"
#include "common/config.h"
#include "plan/plan.h"
#include "varipath/across_hosts.h"

namespace hoccl {

namespace {

// How long a plan's steps inside the host (its barriers and peer waits) wait. A rank waiting at
// a host barrier may be waiting for a host peer that is still in a network transfer with a lost
// host, and that transfer reports the loss (naming the host) only when the network engine's own
// timeout ends it, counted from when the peer posted it. The peer can post it after this rank
// began waiting (it finishes its previous step later under load), so with equal timeouts this
// rank's wait could expire first and report a timeout "waiting for rank 1" instead of the lost
// host. Steps inside the host therefore wait a grace longer: a peer's network failure always
// breaks the host group before this rank gives up on it.
std::chrono::milliseconds hostStepTimeout(std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  return timeout + std::min(std::max(timeout / 4, milliseconds(2000)), milliseconds(60000));
}

}  // namespace

HostSpan::HostSpan(ProcessGroupHOCCL& group, InterHostGroups groups, int64_t leaderMaxBytes, bool checkAcrossHosts)
    : pg_(group),
      rank_(group.rank_),
      size_(group.size_),
      layout_(group.hosts_),
      groups_(std::move(groups)),
      host_(layout_.hostOf(rank_)),
      myRail_(layout_.railRanks[group.localRank_]),
      leaderMaxBytes_(leaderMaxBytes),
      checkAcrossHosts_(checkAcrossHosts),
      timeout_(group.timeout_) {
  TORCH_CHECK(groups_.rail && groups_.global && groups_.p2p, "hoccl process group creation on rank ", rank_,
              ": a group spanning hosts needs its rail, global and p2p groups");
  TORCH_CHECK(groups_.rail->getSize() == (int)myRail_.size() && groups_.global->getSize() == size_ &&
                  groups_.p2p->getSize() == size_,
              "hoccl process group creation on rank ", rank_, ": the groups handed in do not match the host table");
  for (int r = 0; r < size_; ++r) allRanks_.push_back(r);
  pg_.timeout_ = hostStepTimeout(timeout_);
  framed_ = std::make_shared<FramedP2P>(groups_.p2p, rank_, timeout_);
  NetEngineContext engine;
  engine.rank = rank_;
  engine.world = size_;
  engine.framed = framed_;
  engine.peerName = [this](int peer) {
    return "rank " + std::to_string(peer) + " on " + layout_.describeHost(layout_.hostOf(peer));
  };
  NetEngine chosen = createNetEngine(engine);
  net_ = std::move(chosen.transport);
  netEngine_ = chosen.name;
  // The argument check's engine (agreement.cpp): the rail group's own connections.
  NetEngineContext rail;
  rail.rank = layout_.railRank(rank_);
  rail.callerRank = rank_;
  rail.world = static_cast<int>(myRail_.size());
  railFramed_ = std::make_shared<FramedP2P>(groups_.rail, rail.rank, timeout_);
  rail.framed = railFramed_;
  rail.peerName = [this, name = engine.peerName](int member) { return name(myRail_[member]); };
  railNet_ = createNetEngine(rail).transport;
  netCosts_ = agreeNetCosts(*groups_.global, layout_, rank_);
  if (config::text("HOCCL_DEBUG") != "off")
    std::fprintf(stderr, "[hoccl rank %d] network engine across hosts: %s\n[hoccl rank %d] costs across hosts: %s\n",
                 rank_, netEngine_, rank_, describeNetCosts(netCosts_).c_str());
  joinHostGroup();
}

// The group runs its collectives as plans across hosts: it learns the network engine for their
// transfers and what crossing costs.
void HostSpan::joinHostGroup() {
  ProcessGroupHOCCL::HostsContext hosts;
  hosts.net = net_.get();
  hosts.leaderMaxBytes = leaderMaxBytes_;
  // Messages of at most 1 MiB: large enough that gloo's per-message cost (~1 ms here) stays
  // small against a 4 Gbit/s link's 2 ms per MiB, small enough that the host stages the next
  // chunk while one crosses (the legs' pipelines used the same floor).
  hosts.netChunkBytes = 1 << 20;
  hosts.netCosts = netCosts_;
  hosts.pointToPointTimeout = timeout_;
  pg_.joinHosts(std::move(hosts));
}

HostSpan::~HostSpan() { stopNetwork(); }

void HostSpan::stopNetwork() {
  net_->abort("the process group was shut down");
  railNet_->abort("the process group was shut down");
  framed_->stop("the process group was shut down");  // user send/recv between hosts
}

// The group shuts down after this (ProcessGroupHOCCL::abort).
void HostSpan::abort() {
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (broken_.empty()) broken_ = "hoccl: rank " + std::to_string(rank_) + " called abort()";
  }
  for (auto* g : {groups_.rail.get(), groups_.global.get(), groups_.p2p.get()}) g->abort();
  pg_.abortWith("hoccl: rank " + std::to_string(rank_) + " called abort()");
  net_->abort("rank " + std::to_string(rank_) + " called abort()");
  railNet_->abort("rank " + std::to_string(rank_) + " called abort()");
  framed_->stop("rank " + std::to_string(rank_) + " called abort()");
}

void HostSpan::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  framed_->setTimeout(timeout);
  railFramed_->setTimeout(timeout);
  pg_.timeout_ = hostStepTimeout(timeout);
  for (auto* g : {groups_.rail.get(), groups_.global.get(), groups_.p2p.get()}) g->setTimeout(timeout);
}

std::string HostSpan::lastAlgorithm() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return lastAlgo_;
}

std::vector<TransferPhase> HostSpan::lastAllToAllPhases() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return lastPhases_;
}

void HostSpan::setAllToAllPhases(const SplitMatrix& m, AllToAllHostsForm form) {
  std::vector<TransferPhase> phases = varipath::phasesAcrossHosts(layout_.table.hostOf, m.bytes, form);
  std::lock_guard<std::mutex> lock(stateMutex_);
  lastPhases_ = std::move(phases);
}

void HostSpan::setAlgorithm(const char* name) {
  std::lock_guard<std::mutex> lock(stateMutex_);
  lastAlgo_ = name;
}

c10::intrusive_ptr<c10d::Work> HostSpan::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, Body body,
                                                 bool callerWaits) {
  if (staging::captured(this, body)) return c10::make_intrusive<WorkHOCCL>(rank_, type, std::move(outputs));
  // While cores are shared (no spinning) a plan across hosts runs on the worker thread with the
  // caller asleep in wait(): on the namespaced 2x2 hosts that ran every plan measured 1.2-2.2x
  // faster (docs/multihost.md, "Which thread runs a plan across hosts"); while the ranks spin,
  // on the caller's thread (4-18 % faster there).
  return pg_.enqueue(type, std::move(outputs), std::move(body), INT64_MAX, callerWaits && !coresShared());
}

c10::intrusive_ptr<c10d::Work> HostSpan::tracked(c10::intrusive_ptr<c10d::Work> work) {
  pg_.queue_.track(work);
  return work;
}

void HostSpan::checkUsable(const char* op) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  TORCH_CHECK(broken_.empty(), "hoccl ", op, " on rank ", rank_, ": the group is broken: ", broken_);
}

// gloo reports a dead peer as an I/O error naming its address, a cut link as a timeout: find
// the host behind the address, else name every other host of the leg.
void HostSpan::interHostFailed(const char* op, const std::vector<int>& members, const std::exception& e) {
  std::string what = e.what();
  std::string first = what.substr(0, what.find('\n'));
  std::vector<int> suspects;
  for (int r : members) {
    int h = layout_.hostOf(r);
    const std::string& addr = groups_.addressOf[r];
    bool named = h != host_ && !addr.empty() && what.find("[" + addr + "]") != std::string::npos;
    if (named && std::find(suspects.begin(), suspects.end(), h) == suspects.end()) suspects.push_back(h);
  }
  bool byAddress = !suspects.empty();
  if (!byAddress)
    for (int r : members) {
      int h = layout_.hostOf(r);
      if (h != host_ && std::find(suspects.begin(), suspects.end(), h) == suspects.end()) suspects.push_back(h);
    }
  std::ostringstream msg;
  msg << "hoccl " << op << " on rank " << rank_ << " (" << layout_.describeHost(host_) << "): "
      << (byAddress ? "lost the connection to " : "no answer within the timeout from ");
  for (size_t i = 0; i < suspects.size(); ++i) msg << (i ? " or " : "") << layout_.describeHost(suspects[i]);
  msg << " on the inter-host leg (gloo: " << first << ")";
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (broken_.empty()) broken_ = msg.str();
  }
  pg_.abortWith(msg.str());
  TORCH_CHECK_WITH(DistBackendError, false, msg.str());
}

}  // namespace hoccl
