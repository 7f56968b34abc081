// VarioPath scheduler API (see scheduler.h): setup, validation, and plan() over plan_search().
//
// plan() runs a few greedy decompositions of the demand into channel phases (families/), then
// for each considers fusing runs of consecutive phases (fewer phases pay fewer start latencies
// but let flows share links), and returns the candidate with the lowest cost-model estimate.
// Everything is integer bookkeeping plus fixed-order scans, so every rank computes
// bit-identical plans from the same matrix.
#include "varipath/scheduler.h"

#include <stdexcept>
#include <string>

#include "varipath/families/registry.h"
#include "varipath/search.h"

namespace hoccl {
namespace varipath {

Scheduler::Scheduler(int n, std::vector<std::vector<std::pair<int, int>>> channels, double phase_latency_s,
                     double bandwidth_Bps)
    : net_(n, std::move(channels), phase_latency_s, bandwidth_Bps) {}

void Scheduler::set_link_model(std::vector<double> link_bw, std::vector<std::vector<int>> pair_links) {
  net_.set_links(std::move(link_bw), std::move(pair_links));
  timeshare_ = time_share_table(net_, model_);
}

void Scheduler::set_cost_model(const CostModel& model) {
  model_.set(model, net_.n);
  timeshare_ = time_share_table(net_, model_);
}

void Scheduler::set_hosts(std::vector<int> host_of_gpu) { net_.set_hosts(std::move(host_of_gpu)); }

void Scheduler::set_candidates(int mask) {
  const int families = family_bits();
  if ((mask & families) == 0 || (mask & ~(families | kBackfill)) != 0)
    throw std::invalid_argument("varipath::Scheduler::set_candidates: mask must name at least one of "
                                "1 (catalog channels), 2 (link greedy), 4 (peer rounds), 8 (direct), "
                                "32 (time sharing), 64 (host rounds), plus optionally 128 (backfilled "
                                "link greedy), got " + std::to_string(mask));
  candidates_ = mask;
}

void Scheduler::validate_demand(const std::vector<int64_t>& demand) const {
  const size_t want = static_cast<size_t>(net_.n) * net_.n;
  if (demand.size() != want)
    throw std::invalid_argument("varipath::Scheduler::plan: demand must have n*n = " + std::to_string(want) +
                                " entries (row-major), got " + std::to_string(demand.size()));
  for (size_t p = 0; p < want; ++p) {
    const int s = net_.pair_src[p], d = net_.pair_dst[p];
    if (s == d) continue;
    if (demand[p] < 0)
      throw std::invalid_argument("varipath::Scheduler::plan: negative demand " + std::to_string(demand[p]) +
                                  " at " + pair_name(static_cast<int>(p), net_.n));
    if (demand[p] > 0 && net_.pair_chans[p].empty())
      throw std::invalid_argument("varipath::Scheduler::plan: demand at " + pair_name(static_cast<int>(p), net_.n) +
                                  " but no channel contains that pair");
  }
}

std::vector<Phase> Scheduler::plan(const std::vector<int64_t>& demand) const { return plan_info(demand, nullptr); }

std::vector<Phase> Scheduler::plan_info(const std::vector<int64_t>& demand, PlanInfo* info) const {
  validate_demand(demand);
  return plan_search(net_, model_, timeshare_.get(), candidates_, demand, info);
}

double Scheduler::estimate(const std::vector<Phase>& phases) const { return Costing(net_, model_).estimate(phases); }

}  // namespace varipath
}  // namespace hoccl
