// VarioPath online scheduler: decomposes an alltoallv demand matrix into a short sequence of
// phases, each a subset of one contention-free channel from the offline catalog.
//
// Pure C++17 (standard library only), compiled once into hoccl_backend._C: the backend plans
// its all_to_all with it, and python/varipath_bindings.cpp exposes it as
// hoccl_backend._C.varipath (what varipath.schedule() runs).
//
// The pieces: network.h (GPUs, links, paths, hosts), cost_model.h (what a phase costs),
// bounds.h (lower bounds), families/ (one file per candidate family, registry.h's table),
// search.h (one plan() call), candidates.cpp (the choice among candidates), timeshare.h (the
// time-sharing LP).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "varipath/cost_model.h"
#include "varipath/network.h"
#include "varipath/phase.h"
#include "varipath/timeshare.h"

namespace hoccl {
namespace varipath {

// Candidate families (set_candidates() bits) and the codes PlanInfo::family reports; the
// families' table is families/registry.cpp.
constexpr int kCatalogChannels = 1, kLinkGreedy = 2, kPeerRounds = 4, kDirect = 8;
// Split peer rounds (link-disjoint peer-round phases), which stand in for link-greedy past 32
// ranks when its work budget is exceeded; enabled by kLinkGreedy.
constexpr int kSplitPeer = 16;
// Time-sharing plans (timeshare.h): the LP-optimal split of the demand over every set of
// concurrent transfers, on groups of at most 4 GPUs under the contention model (column
// generation up to 8), at bandwidth-bound sizes.
constexpr int kTimeShare = 32;
// Host rounds (several hosts, copy-engine queues): one phase in which every source queues its
// transfers to the other hosts in host-rotation order, spread within each host by local index,
// with its same-host transfers interleaved evenly.
constexpr int kHostRounds = 64;
// Backfilled link-greedy plans (families/backfill.cpp): a variant of kLinkGreedy, built only
// with it; reported as link-greedy with PlanInfo::backfilled.
constexpr int kBackfill = 128;

// Summary of the plan chosen by the last plan_info() call.
struct PlanInfo {
  double est_cost_s = 0.0;     // cost-model estimate of the chosen plan
  int channel_phases = 0;      // phases before merging
  int merge_factor = 1;        // consecutive channel phases fused per output phase
  double quantum_bytes = 0.0;  // per-pair byte quantum of the chosen greedy pass
  int peer_rounds = 0;         // 1: the pairwise peer-round candidate won
  int family = 0;              // code of the winning candidate family (0: empty plan)
  int candidates = 0;          // (decomposition, merge factor) pairs bounded
  int simulated = 0;           // of those, costed with the event model
  bool backfilled = false;     // a link-greedy plan with backfilled phases
};

// The name plan_info() reports for a family code ("link_greedy", ...; "none" for 0).
const char* family_name(int code);

class Scheduler {
 public:
  // n GPUs; channels: contention-free sets of (src,dst) pairs over 0..n-1, fully expanded.
  // phase_latency_s: fixed start cost of one phase; bandwidth_Bps: per-pair rate used for costing.
  Scheduler(int n, std::vector<std::vector<std::pair<int, int>>> channels, double phase_latency_s,
            double bandwidth_Bps);

  // Optional: real directed links (bandwidth in bytes/s) and, for each pair p = s*n+d, the link
  // indices on its path (empty for s == d).  Improves the cost model; never changes coverage.
  void set_link_model(std::vector<double> link_bw, std::vector<std::vector<int>> pair_links);
  void set_cost_model(const CostModel& model);
  // Candidate families plan() chooses from (bit mask of the k* above; all by default).
  // Restricting them is for tests and experiments: every family alone covers the demand.
  void set_candidates(int mask);
  // Optional: the host of every GPU (0-based, n entries).  Enables host rounds.
  void set_hosts(std::vector<int> host_of_gpu);

  // demand: n*n row-major bytes (diagonal ignored, must be >= 0). Deterministic; covers demand
  // exactly: for each (s,d), sum of bytes over all phases == demand[s*n+d]. No 0-byte Transfer.
  // Thread-safe between setter calls (planning reads the scheduler only).
  std::vector<Phase> plan(const std::vector<int64_t>& demand) const;
  std::vector<Phase> plan_info(const std::vector<int64_t>& demand, PlanInfo* info) const;

  // Cost-model estimate (seconds) of an arbitrary plan, with the installed links and model.
  double estimate(const std::vector<Phase>& phases) const;

  int num_gpus() const { return net_.n; }
  int num_channels() const { return static_cast<int>(net_.chan_pairs.size()); }

 private:
  void validate_demand(const std::vector<int64_t>& demand) const;

  Network net_;
  ModelTables model_;
  int candidates_ = kCatalogChannels | kLinkGreedy | kPeerRounds | kDirect | kTimeShare | kHostRounds | kBackfill;
  std::shared_ptr<const TimeShareTable> timeshare_;  // families/time_share.cpp's table, when one applies
};

}  // namespace varipath
}  // namespace hoccl
