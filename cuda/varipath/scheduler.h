// VarioPath online scheduler: decomposes an alltoallv demand matrix into a short sequence of
// phases, each a subset of one contention-free channel from the offline catalog.
//
// Pure C++17 (standard library only): the core backend compiles this file into its own
// extension, and varipath_bindings.cpp exposes it to Python as varipath._scheduler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "varipath/timeshare.h"

namespace hoccl {
namespace varipath {

struct Transfer {
  int32_t src;
  int32_t dst;
  int64_t bytes;
};
using Phase = std::vector<Transfer>;

// Cost model used to choose among candidate plans.  Defaults: "fluid" sharing on two virtual
// links per GPU (send, receive) at the per-pair rate; set_link_model() installs the real
// directed links of a topology.
struct CostModel {
  double eta_beta = 0.0;   // contention: k flows on a link deliver bw*max(eta_min, 1-beta*log2 k)
  double eta_min = 1.0;
  int copy_engines = 0;    // >0: at most this many concurrent transfers per source GPU
};

// Summary of the plan chosen by the last plan_info() call.
struct PlanInfo {
  double est_cost_s = 0.0;     // cost-model estimate of the chosen plan
  int channel_phases = 0;      // phases before merging
  int merge_factor = 1;        // consecutive channel phases fused per output phase
  double quantum_bytes = 0.0;  // per-pair byte quantum of the chosen greedy pass
  int peer_rounds = 0;         // 1: the pairwise peer-round candidate won
  int family = 0;              // Scheduler::k* bit of the winning candidate family
  int candidates = 0;          // (decomposition, merge factor) pairs bounded
  int simulated = 0;           // of those, costed with the event model
  bool backfilled = false;     // a link-greedy plan with backfilled phases (Scheduler::backfill())
};

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
  // Candidate families plan() chooses from (bit mask; all by default).  Restricting them is
  // for tests and experiments: every family alone covers the demand.
  static constexpr int kCatalogChannels = 1, kLinkGreedy = 2, kPeerRounds = 4, kDirect = 8;
  // Reported family of split peer rounds (link-disjoint peer-round phases), which stand in for
  // link-greedy past 32 ranks when its work budget is exceeded; not a set_candidates() bit.
  static constexpr int kSplitPeer = 16;
  // Time-sharing plans (varipath_timeshare.h): the LP-optimal split of the demand over every set
  // of concurrent transfers, on groups of at most 4 GPUs under the contention model, at
  // bandwidth-bound sizes.
  static constexpr int kTimeShare = 32;
  // Host rounds (several hosts, copy-engine queues): one phase in which every source queues its
  // transfers to the other hosts in host-rotation order, spread within each host by local index,
  // with its same-host transfers interleaved evenly (see host_rounds_decomposition()).
  static constexpr int kHostRounds = 64;
  // Backfilled link-greedy plans (backfill()); a variant of kLinkGreedy, built only with it.
  static constexpr int kBackfill = 128;
  void set_candidates(int mask);
  // Optional: the host of every GPU (0-based, n entries).  Enables host rounds.
  void set_hosts(std::vector<int> host_of_gpu);

  // demand: n*n row-major bytes (diagonal ignored, must be >= 0). Deterministic; covers demand
  // exactly: for each (s,d), sum of bytes over all phases == demand[s*n+d]. No 0-byte Transfer.
  std::vector<Phase> plan(const std::vector<int64_t>& demand) const;
  std::vector<Phase> plan_info(const std::vector<int64_t>& demand, PlanInfo* info) const;

  // Cost-model estimate (seconds) of an arbitrary plan, with the installed links and model.
  double estimate(const std::vector<Phase>& phases) const;

  int num_gpus() const { return n_; }
  int num_channels() const { return static_cast<int>(chan_pairs_.size()); }

 private:
  void validate_demand(const std::vector<int64_t>& demand) const;
  std::vector<double> pair_urgency(const std::vector<int64_t>& demand, double* bound_s, std::vector<double>* load) const;
  std::vector<std::vector<int>> decompose(const std::vector<int64_t>& demand,
                                          const std::vector<double>& weight, int64_t quantum, bool scale_by_rate,
                                          std::vector<std::vector<int64_t>>* bytes) const;
  struct LinkScratch;
  void add_transfer(LinkScratch* ls, int pair, int64_t bytes, bool new_flow) const;
  double drain_cost(LinkScratch* ls, double limit) const;
  double event_time(LinkScratch* ls, double limit) const;
  double eta(int k) const;
  std::vector<double> eta_upto(int flows) const;
  double inv_eta(int k) const;
  double merged_cost(const std::vector<std::vector<int>>& chans, const std::vector<std::vector<int64_t>>& bytes,
                     int merge, LinkScratch* ls, double limit, const std::vector<double>* group_bounds = nullptr) const;
  double phase_cost(const Phase& phase) const;
  double phase_span(const std::vector<int>& chan, const std::vector<int64_t>& left, const std::vector<int64_t>& cap,
                    const std::vector<double>& rate, const std::vector<double>& weight) const;
  std::vector<std::vector<int>> link_greedy(const std::vector<int64_t>& demand, int64_t quantum,
                                            std::vector<std::vector<int64_t>>* bytes) const;
  // Channel phases of one candidate family, in order, with bytes per pair.
  struct Decomposition {
    std::vector<std::vector<int>> pairs;
    std::vector<std::vector<int64_t>> bytes;
    int64_t quantum = 0;
    int family = 0;
    bool unique = false;                 // every pair in at most one phase (peer, split, direct)
    // Each phase lasts exactly its longest transfer alone at its path rate (without copy-engine
    // queues): at most one transfer per link (link-greedy, split), or shared links that provably
    // delay no transfer past it (backfill()).
    bool disjoint = false;
    bool backfilled = false;             // by backfill(): offered unfused only
    bool have1 = false, exact1 = false;  // merged_bound(merge 1), when already computed
    double bound1 = 0.0;
    uint64_t sig1 = 0;
  };
  std::vector<int64_t> quanta(int64_t top, double bound_s) const;
  std::vector<int64_t> link_passes(const std::vector<int64_t>& quanta, int64_t top) const;
  bool backfill(Decomposition* dec) const;
  Decomposition link_decomposition(const std::vector<int64_t>& demand, int64_t quantum, int64_t top) const;
  void other_decompositions(const std::vector<int64_t>& demand, const std::vector<double>& weight, int64_t top,
                            bool with_catalog, std::vector<Decomposition>* out) const;
  Decomposition peer_decomposition(const std::vector<int64_t>& demand) const;
  Decomposition direct_decomposition(const std::vector<int64_t>& demand) const;
  Decomposition time_share_decomposition(const std::vector<int64_t>& demand) const;
  Decomposition time_share_search_decomposition(const std::vector<int64_t>& demand, const Decomposition& start,
                                                int rounds) const;
  Decomposition time_share_plan(const std::vector<int>& ids, const std::vector<int64_t>& demand,
                                const std::vector<TimeShareColumn>& used) const;
  Decomposition host_rounds_decomposition(const std::vector<int64_t>& demand) const;
  void build_time_share();
  Decomposition split_peer_decomposition(const std::vector<int64_t>& demand, const std::vector<double>& weight,
                                         bool sliced) const;
  // The most loaded link, for plan_floor(), floor_at() and merged_bound()'s early stop.
  struct HotLink {
    double load = 0.0, biggest = 0.0, bw = 1.0, bound_s = 0.0;
    int pairs = 0;
    int link = -1;
    const std::vector<double>* loads = nullptr;  // every link's bytes (the whole demand)
  };
  // stop / stop_inexact: once the bound provably passes stop (stop_inexact once a group is
  // known inexact), +inf is returned (see the definition).
  double merged_bound(const Decomposition& dec, int merge, LinkScratch* ls, bool* exact, uint64_t* signature,
                      std::vector<double>* group_bounds = nullptr, const HotLink* hot = nullptr,
                      double stop = std::numeric_limits<double>::infinity(),
                      double stop_inexact = std::numeric_limits<double>::infinity(),
                      const std::vector<double>* floor_prefix = nullptr) const;
  // Per-round bytes of the peer-round decomposition on the most loaded links (see peer_loads()),
  // for merged_bound()'s early stop; peer_upper_simple(): an upper bound of its unfused bound.
  struct PeerLoads {
    std::vector<int> links;      // the links kept
    size_t phases = 0;
    std::vector<double> bytes;   // link-major: bytes[c * phases + phase]
  };
  void peer_loads(const std::vector<int64_t>& demand, const Decomposition& dec, const std::vector<double>& load,
                  double bound_s, PeerLoads* out) const;
  double peer_upper_simple(const Decomposition& dec) const;
  double peer_upper_rounds(const Decomposition& dec, LinkScratch* ls) const;
  void peer_floor_prefix(const PeerLoads& pl, size_t phases, int merge, std::vector<double>* prefix) const;
  void reset_scratch(LinkScratch* ls) const;
  bool worth_fusing(int phases, double unfused_bound) const;
  bool affordable(const Decomposition& dec, int merge) const;
  double plan_floor(const std::vector<int64_t>& demand, const std::vector<double>& load, double bound_s, HotLink* hot) const;
  double floor_at(const HotLink& hot, int phases, double stop) const;
  void index_links();
  struct LinkSpan {
    const int* b;
    const int* e;
    const int* begin() const { return b; }
    const int* end() const { return e; }
  };
  LinkSpan links_of(int p) const { return {pl_.data() + pl_off_[p], pl_.data() + pl_off_[p + 1]}; }
  std::vector<Phase> materialize(const std::vector<std::vector<int>>& chans,
                                 const std::vector<std::vector<int64_t>>& bytes, int merge) const;

  int n_;
  double latency_s_;
  double rate_Bps_;
  std::vector<std::vector<int>> chan_pairs_;   // channel -> pair ids (s*n+d), sorted
  std::vector<std::vector<int>> pair_chans_;   // pair id -> channels containing it
  std::vector<double> link_bw_;                // directed link capacities
  std::vector<std::vector<int>> pair_links_;   // pair id -> link indices
  std::vector<int> pl_off_, pl_;               // the same, flattened (pair p: pl_[pl_off_[p]..pl_off_[p+1]))
  std::vector<int> lp_off_, lp_;               // link l -> pairs crossing it: lp_[lp_off_[l]..lp_off_[l+1])
  std::vector<int> pair_src_, pair_dst_;       // pair id -> source, destination
  std::vector<double> pair_rate_;              // full rate of each pair running alone
  std::vector<double> pair_min_bw_;            // narrowest link on each pair's path
  std::vector<int> pair_path8_;                // pair id -> its links padded to 8 (link count as pad), when <= 8
  std::vector<uint64_t> pair_mask_;            // pair id -> bit set of its links (when there are <= 64)
  CostModel model_;
  int candidates_ = kCatalogChannels | kLinkGreedy | kPeerRounds | kDirect | kTimeShare | kHostRounds | kBackfill;
  std::vector<int> host_of_, host_size_, local_index_;  // set_hosts(): host, its GPU count, index in it
  int hosts_ = 1;
  std::shared_ptr<const TimeShareTable> timeshare_;  // built for n <= 4 under eta (build_time_share())
  std::vector<double> eta_table_;  // eta(k) for small k under model_
  std::vector<double> inv_eta_table_;  // 1 / eta(k)
  bool eta_floored_ = false;           // eta(k) is eta_min for every k past the table
  std::vector<int> round_flows_;       // link -> most pairs of one peer round (s -> s+k mod n) crossing it
  std::vector<double> inv_bw_;         // 1 / link bandwidth
};

}  // namespace varipath
}  // namespace hoccl
