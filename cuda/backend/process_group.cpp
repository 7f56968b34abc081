#include "backend/process_group.h"

#include <unistd.h>

#include <cstdio>

#include "backend/config.h"
#include "common/config.h"

namespace hoccl {

// This group is the shared-memory one: it spans one host (a group across hosts is a
// MultiHostGroup, which the Python creator builds over one of these per host). Say so before any
// shared memory is touched: ranks on another host could not open this host's segment.
static void checkSingleHost(const HostTable& hosts, int rank) {
  if (hosts.hosts() == 1) return;
  int other = hosts.ranksOf[hosts.hostOf[rank] == 0 ? 1 : 0][0];
  throw std::runtime_error("hoccl: rank " + std::to_string(rank) + " is on host '" + hosts.names[hosts.hostOf[rank]] +
                           "' but rank " + std::to_string(other) + " is on '" + hosts.names[hosts.hostOf[other]] +
                           "'; a ProcessGroupHOCCL spans one host (init_process_group builds groups across hosts)");
}

ProcessGroupHOCCL::ProcessGroupHOCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout, int hostsWorld)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      store_(store),
      config_(HocclConfig::forGroupCreation(rank, size)),
      hugePages_(config_.hugePageMinBytes) {
  hosts_ = HostTable::exchange(store, rank, size, timeout);
  if (config_.debug >= 1 && rank == 0)
    std::fprintf(stderr, "[hoccl rank 0] group of %d ranks on %d host(s); configuration:\n%s", size,
                 hosts_.hosts(), config::describe().c_str());
  checkSingleHost(hosts_, rank);
  noteJobRanksOnHost(static_cast<int>(hosts_.ranksOf[hosts_.hostOf[rank]].size()));
  config_.shm.blocksPerSide = hostsWorld;
  group_ = std::make_unique<ShmGroup>(store, rank, size, config_.shm, timeout);
  executor_ = std::make_unique<Executor>(*group_);
  if (config_.debug >= 1) profile_ = std::make_unique<OpProfile>();
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupHOCCL::~ProcessGroupHOCCL() { shutdown(); }

void ProcessGroupHOCCL::shutdown() {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  queueCv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (profile_) std::fputs(profile_->report(rank_).c_str(), stderr);
  std::lock_guard<std::mutex> lock(p2pMutex_);
  p2p_.reset();
}

void ProcessGroupHOCCL::abort() {
  abortWith("hoccl: rank " + std::to_string(rank_) + " called abort()");
  shutdown();
}

void ProcessGroupHOCCL::abortWith(const std::string& reason) { group_->abort(reason); }

std::string ProcessGroupHOCCL::lastAlgorithm() const {
  std::lock_guard<std::mutex> lock(lastAlgoMutex_);
  return lastAlgo_;
}

std::vector<TransferPhase> ProcessGroupHOCCL::lastAllToAllPhases() const {
  std::lock_guard<std::mutex> lock(lastAlgoMutex_);
  return lastAllToAllPhases_ ? *lastAllToAllPhases_ : std::vector<TransferPhase>{};
}

}  // namespace hoccl
