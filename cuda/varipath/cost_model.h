// The cost model VarioPath chooses plans by: what a phase costs given its transfers, exact where
// no link is shared (and no source queues), else by an event model that replays the
// simulator's rules (event_model.cpp).  Lower bounds of the same costs are in bounds.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "varipath/network.h"
#include "varipath/phase.h"

namespace hoccl {
namespace varipath {

// Defaults: "fluid" sharing on the installed links.
struct CostModel {
  double eta_beta = 0.0;   // contention: k flows on a link deliver bw*max(eta_min, 1-beta*log2 k)
  double eta_min = 1.0;
  int copy_engines = 0;    // >0: at most this many concurrent transfers per source GPU
};

// The installed cost model with eta(k) tabulated (log2 per link and phase showed up in profiles).
struct ModelTables : CostModel {
  // Validates `model` (std::invalid_argument) and tabulates eta for a group of n GPUs.
  void set(const CostModel& model, int n);

  double eta(int k) const {
    if (eta_beta <= 0.0) return 1.0;
    if (static_cast<size_t>(k) < eta_table.size()) return eta_table[k];
    if (eta_floored) return eta_min;
    return slow_eta(k);
  }
  // 1 / eta(k), for screening (see Bounds::merged_bound()).
  double inv_eta(int k) const {
    if (static_cast<size_t>(k) < inv_eta_table.size()) return inv_eta_table[k];
    return 1.0 / eta(k);
  }
  // eta(0..flows) as a table (time sharing: a link carries at most every transfer at once).
  std::vector<double> eta_upto(int flows) const;

  std::vector<double> eta_table;      // eta(k) for small k
  std::vector<double> inv_eta_table;  // 1 / eta(k)
  bool eta_floored = false;           // eta(k) is eta_min for every k past the table

 private:
  double slow_eta(int k) const;
};

// Scratch tables reused across phases; only touched entries are reset, so costing a phase is
// O(transfers * path length), not O(links).  A phase's transfers are also kept as flows (one
// per pair, in first-appearance order, as materialize() emits them) for the event model.
struct LinkScratch {
  std::vector<double> load;
  std::vector<int> flows;
  std::vector<int> touched;
  std::vector<int> flow_pair;      // the phase's flows
  std::vector<double> flow_bytes;
  std::vector<int> slot;           // pair -> index in flow_pair, -1 when absent
  std::vector<int> per_source;     // event model: flows started per source GPU
  std::vector<std::vector<double>> sizes_on;  // event model: the hot link's flow sizes (one buffer)
  // Event model, links by local index (position in `touched`): each flow's local links and
  // each local link's flows (built once per phase), running flows per link, and per solve the
  // capacity left, unfrozen flows and fair share of the links that carry running flows.
  std::vector<int> link_id;
  std::vector<int> flow_off, flow_links, link_off, link_flows;
  std::vector<int> act, unfrozen, open;
  std::vector<double> cap0, cap_left, rem;
  std::vector<double> rate, left;
  std::vector<char> state;         // per flow: 0 queued, 1 running, 2 done
  std::vector<int> running, next_run;
  std::vector<int> src_next, src_head;  // copy engines: next flow of the same source; each source's first queued flow
  std::vector<double> lbw;              // bandwidth of each local link
  std::vector<char> need;  // bound: shared links whose flow sizes are gathered
  std::vector<int> needed, bucket_at;  // bound: those links; where each one's next size goes
  std::vector<double> needed_u;        // bound: each needed link's upper end (load / (bw x eta(flows)))
  std::vector<int> near_top;           // bound: shared links whose upper end is near the busiest plain time
  std::vector<double> bucket;          // bound: their flow sizes, one segment per link
  std::vector<double> left_load;       // bound, early stop: each link's bytes in the groups to come
  std::vector<double> group_bound;     // bound, early stop: each group's bound (summed in plan order)
  std::vector<int> mb_pair, mb_touched;  // bound: the group's flows (pair, bytes) and touched links
  std::vector<double> mb_bytes;
  std::vector<double> on_link;         // bound: each link's flow sizes, kOnLink slots per link
  std::vector<int> flow_rank;          // bound: each flow's slot on each of its links (8 per flow)
  explicit LinkScratch(size_t links, size_t pairs, size_t gpus)
      : load(links, 0.0), flows(links, 0), slot(pairs, -1), per_source(gpus, 0), sizes_on(1),
        link_id(links, 0), src_head(gpus, -1), need(links, 0), bucket_at(links, 0) {}
};

// Costs phases and plans on `net` under `model` (both outlive it).
class Costing {
 public:
  Costing(const Network& net, const ModelTables& model) : net_(net), model_(model) {}

  // Scratch sized for the network.
  LinkScratch scratch() const;
  // Cost-model estimate (seconds) of an arbitrary plan.
  double estimate(const std::vector<Phase>& phases) const;
  // Cost of fusing runs of `merge` channel phases, without building the phases.  A pair repeated
  // inside a run counts as one flow (as materialize() merges it).  Once the cost provably reaches
  // `limit` (what the candidate must beat) the rest is not simulated and +inf is returned.
  // group_bounds: each fused phase's lower bound (Bounds::merged_bound()), or null.
  double merged_cost(const std::vector<std::vector<int>>& chans, const std::vector<std::vector<int64_t>>& bytes,
                     int merge, LinkScratch* ls, double limit, const std::vector<double>* group_bounds = nullptr) const;

 private:
  void add_transfer(LinkScratch* ls, int pair, int64_t bytes) const;
  double drain_cost(LinkScratch* ls, double limit) const;
  double event_time(LinkScratch* ls, double limit) const;
  void reset_scratch(LinkScratch* ls) const;
  double phase_cost(const Phase& phase) const;

  const Network& net_;
  const ModelTables& model_;
};

}  // namespace varipath
}  // namespace hoccl
