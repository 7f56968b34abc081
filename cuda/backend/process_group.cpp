#include "backend/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend/config.h"
#include "backend/cuda_staging.h"
#include "backend/multihost/host_span.h"
#include "common/config.h"
#include "transport/shm/futex_wait.h"

namespace hoccl {

// A group spans hosts only when the Python creator says so (it also builds the network groups
// such a group needs). Say so before any shared memory is touched: ranks on another host could
// not open this host's segment.
static void checkSingleHost(const HostTable& hosts, int rank) {
  if (hosts.hosts() == 1) return;
  int other = hosts.ranksOf[hosts.hostOf[rank] == 0 ? 1 : 0][0];
  throw std::runtime_error("hoccl: rank " + std::to_string(rank) + " is on host '" + hosts.names[hosts.hostOf[rank]] +
                           "' but rank " + std::to_string(other) + " is on '" + hosts.names[hosts.hostOf[other]] +
                           "'; a ProcessGroupHOCCL spans one host (init_process_group builds groups across hosts)");
}

ProcessGroupHOCCL::ProcessGroupHOCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout, bool spansHosts)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      store_(store),
      config_(HocclConfig::forGroupCreation(rank, size)),
      hugePages_(config_.hugePageMinBytes),
      queue_(rank) {
  hosts_ = HostTable::exchange(store, rank, size, timeout);
  if (config_.debug >= 1 && rank == 0)
    std::fprintf(stderr, "[hoccl rank 0] group of %d ranks on %d host(s); configuration:\n%s", size,
                 hosts_.hosts(), config::describe().c_str());
  if (!spansHosts) checkSingleHost(hosts_, rank);
  const int host = hosts_.hostOf[rank];
  groupRankOf_ = hosts_.ranksOf[host];
  localSize_ = static_cast<int>(groupRankOf_.size());
  localIndex_.assign(size, -1);
  for (int l = 0; l < static_cast<int>(groupRankOf_.size()); ++l) localIndex_[groupRankOf_[l]] = l;
  localRank_ = localIndex_[rank];
  noteJobRanksOnHost(localSize_);
  hostStore_ = store;
  if (hosts_.hosts() > 1) {
    // Sized by the ranks that share the memory (rings, thresholds), as on a host of its own.
    config_ = HocclConfig::forGroupCreation(rank, localSize_);
    hostStore_ = c10::make_intrusive<c10d::PrefixStore>("hoccl/local/" + std::to_string(host), store);
    config_.shm.blocksPerSide = size;  // plans across hosts name blocks of every rank
  }
  group_ = std::make_unique<ShmGroup>(hostStore_, localRank_, localSize_, config_.shm, timeout);
  executor_ = std::make_unique<Executor>(*group_);
  if (config_.debug >= 1) profile_ = std::make_unique<OpProfile>();
  queue_.start();
}

ProcessGroupHOCCL::~ProcessGroupHOCCL() { shutdown(); }

void ProcessGroupHOCCL::spanHosts(InterHostGroups groups, int64_t leaderMaxBytes, bool checkAcrossHosts) {
  TORCH_CHECK(hosts_.hosts() > 1 && group_->blocksPerSide() >= static_cast<size_t>(size_) && !span_,
              "hoccl process group creation on rank ", rank_,
              ": spanHosts needs a group created with spansHosts whose ranks sit on several hosts, once");
  span_ = std::make_unique<HostSpan>(*this, std::move(groups), leaderMaxBytes, checkAcrossHosts);
}

NetCosts ProcessGroupHOCCL::netCosts() const {
  TORCH_CHECK(span_, "hoccl: rank ", rank_, ": this group spans one host; nothing crosses a network");
  return span_->netCosts();
}

void ProcessGroupHOCCL::setTimeout(std::chrono::milliseconds timeout) {
  if (span_) return span_->setTimeout(timeout);  // sets this group's own, with its grace
  timeout_ = timeout;
}

void ProcessGroupHOCCL::shutdown() {
  if (!queue_.stop()) return;
  if (span_) span_->stopNetwork();
  if (profile_) std::fputs(profile_->report(rank_).c_str(), stderr);
  std::lock_guard<std::mutex> lock(p2pMutex_);
  p2p_.reset();
}

void ProcessGroupHOCCL::abort() {
  if (span_) span_->abort();  // breaks this host's group too
  else abortWith("hoccl: rank " + std::to_string(rank_) + " called abort()");
  shutdown();
}

void ProcessGroupHOCCL::abortWith(const std::string& reason) { group_->abort(reason); }

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::submit(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                         Body body, int64_t bytes, bool callerWaits) {
  if (span_) return span_->enqueue(type, std::move(outputs), std::move(body), callerWaits);
  return enqueue(type, std::move(outputs), std::move(body), bytes, callerWaits);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                          Body body, int64_t bytes, bool callerWaits) {
  // A caller that blocks in wait() right after gains nothing from the worker thread and pays two
  // cross-core wake-ups (tens of microseconds each on a virtual machine). CUDA tensors keep the
  // worker: their wait() must not block the host.
  callerWaits = callerWaits && std::all_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) {
    return t.device().is_cpu();
  });
  auto work = c10::make_intrusive<WorkHOCCL>(rank_, type, std::move(outputs));
  // Host mirrors of a CUDA op: the body goes to the op's staged run (cuda_staging.h), which
  // counts the op.
  if (staging::captured(this, body)) return work;
  issued_.fetch_add(1);
  // A small op with nothing ahead of it runs right here: two thread hand-offs cost more than the
  // op itself.
  const bool mayRunHere = bytes <= config_.inlineMaxBytes || callerWaits;
  const std::chrono::microseconds spinFloor = callerWaits ? callerSpin() : std::chrono::microseconds(0);
  queue_.submit(work, std::move(body), mayRunHere, [spinFloor](const std::function<void()>& run) {
    SpinAtLeast spin{spinFloor};
    run();
  });
  return work;
}

std::chrono::microseconds ProcessGroupHOCCL::callerSpin() const {
  return std::chrono::microseconds(coresShared() ? config_.sharedCallerSpinMicros : config_.callerSpinMicros);
}

void ProcessGroupHOCCL::startCoalescing() { queue_.startCoalescing(); }

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::endCoalescing() { return queue_.endCoalescing(); }

std::string ProcessGroupHOCCL::planAlgorithm() const {
  std::lock_guard<std::mutex> lock(lastAlgoMutex_);
  return lastAlgo_;
}

std::string ProcessGroupHOCCL::lastAlgorithm() const { return span_ ? span_->lastAlgorithm() : planAlgorithm(); }

std::vector<TransferPhase> ProcessGroupHOCCL::lastAllToAllPhases() const {
  if (span_) return span_->lastAllToAllPhases();
  std::lock_guard<std::mutex> lock(lastAlgoMutex_);
  return lastAllToAllPhases_ ? *lastAllToAllPhases_ : std::vector<TransferPhase>{};
}

}  // namespace hoccl
