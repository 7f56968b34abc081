// The choice among candidates: every (decomposition, merge factor 1, 2, 4, ..., all) is one.
// Their lower bounds are cheap; the event model is run only for candidates whose bound can
// still beat the best cost found, in increasing bound order (branch and bound, deterministic
// order).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "varipath/search.h"
#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

namespace {

// At most this many candidates per plan are costed with the event model (in bound order).
constexpr int kMaxSimulated = 4;
// A simulated plan within kGoodEnough of the plan floor ends the search only while that margin
// is at most kGoodEnoughAbs seconds (about one more 8-rank simulation's planning time): past
// it the plan time a later candidate might save outweighs the planning time saved.
constexpr double kGoodEnoughAbs = 25e-6;
// Past kMaxSimulatedRanks ranks at most this many fused candidates are bounded (each bound is a
// pass over the plan's transfers), best floor first; one more with copy-engine queues, where the
// one-phase plan and the runs of 8 peer rounds are both needed (see kQueueMargin).
constexpr int kFusedBoundPasses = 2;
constexpr int kFusedBoundPassesQueued = 3;
// Past kMaxSimulatedRanks ranks candidates are ranked by their bounds, and the bounds of fused
// phases are optimistic where the event model would see what they miss:
// - with copy-engine queues, fused split peer rounds queue whole pairs of unequal length per
//   source; their bound (busiest link) ignores how the queues drift out of step, which cost
//   0-37 % in one phase at 64 ranks (skewed traffic worst: every source starts on the hot
//   receivers) and up to 18 % in runs of 8 at 256 ranks, while runs of 8 peer rounds (one
//   transfer per source per round, in step) stayed within 3 % of their bound.  Fused split
//   rounds are charged kQueueMargin more, so they win only when clearly better;
// - under contention the smallest-first eta drain of a fused run was 3-10 % below the simulated
//   time (more the more phases are fused: 4 % for pairs of phases at 256 ranks, 10 % for runs
//   of 8 at 64), so a fused run that is not exact is charged kFusedMargin per doubling of its
//   merge factor (2.5 % for 2, 7.5 % for 8).
constexpr double kQueueMargin = 0.08;
constexpr double kFusedMargin = 0.025;
// Past kMaxSimulatedRanks ranks fused runs are bounded up to this many channel phases, and all
// in one (each merge factor's bound costs a pass over the plan).
constexpr int kMaxMergeManyRanks = 8;
// The unfused peer-round pass past the best bound only decides worth_fusing(): the per-round
// upper bound (peer_upper_rounds(), one walk over the transfers) is built to show it when
// peer_upper_simple() is within kPeerTableReach of the pass's stop, and the rounds' floor reaches
// kPeerTableFloor of the best bound (then, stopped at the best bound, the pass ends early).
constexpr double kPeerTableReach = 4.0;
constexpr double kPeerTableFloor = 0.9;

struct Candidate {
  double bound;
  int dec, merge;
  bool exact;
  bool reference;  // the peer-round or direct plan itself (see Candidates::offer_merges())
  int groups = -1;  // index of its per-group bounds in group_bounds_ (merged_cost()), or -1
  int tie = 0;      // order among equal bounds, before the decomposition's index (see pick())
  bool operator<(const Candidate& o) const {
    return bound != o.bound ? bound < o.bound : tie != o.tie ? tie < o.tie : dec != o.dec ? dec < o.dec : merge < o.merge;
  }
};

class Candidates {
 public:
  explicit Candidates(PlanSearch* s);
  std::vector<Phase> choose(PlanInfo* info);

 private:
  void offer_by_bounds(size_t d);
  void offer_merges(size_t d);
  void bound_fused_runs();
  double margin(const Candidate& f) const;
  std::vector<Phase> pick(PlanInfo* info);

  PlanSearch& s_;
  const Network& net_;
  const ModelTables& model_;
  const Bounds& bounds_;
  const std::vector<Decomposition>& decs_;
  std::vector<Candidate> cands_;
  // Per-group bounds of the candidates that may be simulated (several groups): merged_cost()
  // stops once the groups done plus the bounds of those left reach what it must beat.
  std::vector<std::vector<double>> group_bounds_;
  // Candidates whose fused phases are identical (the same decomposition from two passes; every
  // decomposition fused into one phase when the order does not matter) are costed once: the
  // first one generated, which is also first among equal bounds.
  std::vector<uint64_t> seen_;
  // Without copy-engine queues the order inside a phase does not matter, so any decomposition
  // fused into one phase is the direct plan: when that is a candidate, the others' are not built.
  bool skip_all_ = false;
  std::vector<Candidate> fused_;   // many ranks: fused runs to bound, by floor
  PeerLoads peer_bytes_;            // the peer rounds' bytes on the busiest links (early-stop floors)
  std::vector<double> floor_sums_;  // their per-group floors, prefix sums
  double best_bound_ = std::numeric_limits<double>::infinity();
};

Candidates::Candidates(PlanSearch* s)
    : s_(*s), net_(s->net), model_(s->model), bounds_(s->bounds), decs_(s->decs) {
  const bool have_direct =
      std::any_of(decs_.begin(), decs_.end(), [](const Decomposition& x) { return x.family == kDirect; });
  skip_all_ = have_direct && model_.copy_engines == 0;
}

std::vector<Phase> Candidates::choose(PlanInfo* info) {
  // Past kMaxSimulatedRanks ranks candidates are ranked by their bounds, so one whose cheap
  // floor (its start latencies plus the busiest link's time) already reaches the best bound
  // found cannot win and is not bounded; the direct plan goes first (usually the best at small
  // sizes, where the fused runs' latencies decide).
  const bool prune = net_.n > kMaxSimulatedRanks;
  std::vector<size_t> dec_order(decs_.size());
  for (size_t d = 0; d < decs_.size(); ++d) {
    dec_order[d] = d;
    if (decs_[d].have1) best_bound_ = std::min(best_bound_, decs_[d].bound1);
  }
  if (prune)  // already bounded (the exact link-greedy or split plan) first, then direct
    std::stable_partition(dec_order.begin(), dec_order.end(),
                          [&](size_t d) { return decs_[d].have1 || decs_[d].family == kDirect; });
  for (size_t d : dec_order) {
    if (prune)
      offer_by_bounds(d);
    else
      offer_merges(d);
  }
  if (prune) bound_fused_runs();
  return pick(info);
}

// Many ranks: the unfused plan now (left out when its floor cannot beat the best bound); its
// fused runs are queued by floor for bound_fused_runs().
void Candidates::offer_by_bounds(size_t d) {
  const Decomposition& dec = decs_[d];
  const HotLink& hot = s_.hot;
  const int count = static_cast<int>(dec.pairs.size());
  bool fusing_proven = false;  // worth_fusing() shown by peer_upper_simple() (peer rounds)
  const double floor1 = dec.have1 ? dec.bound1 : bounds_.floor_at(hot, count, best_bound_);
  double b1 = floor1;  // the unfused bound, or its floor when that cannot win
  if (dec.have1 || floor1 < best_bound_) {
    bool exact = true;
    if (!dec.have1) {
      // Stopped early (+inf) once it can neither win nor make its fused runs worth
      // bounding (worth_fusing() is false past count x latency / kFuseLatencyShare).
      double stop = model_.eta_beta > 0.0
                        ? std::max(best_bound_, static_cast<double>(count) * net_.latency_s / kFuseLatencyShare) * (1.0 + 1e-9)
                        : best_bound_;
      const std::vector<double>* fl = nullptr;
      if (dec.family == kPeerRounds) {
        bounds_.peer_loads(s_.demand, dec, s_.load, s_.bound_s, &peer_bytes_);
        bounds_.peer_floor_prefix(peer_bytes_, dec.pairs.size(), 1, &floor_sums_);
        fl = &floor_sums_;
      }
      if (dec.family == kPeerRounds && model_.eta_beta > 0.0 && stop > best_bound_ * (1.0 + 1e-9)) {
        // The pass would run on past the best bound only to tell whether the fused runs are
        // worth bounding.  When an upper bound of the unfused bound already shows they are,
        // it stops at the best bound (a plan that cannot win is not a candidate;
        // worth_fusing() holds either way).
        const double simple = bounds_.peer_upper_simple(dec);
        if (bounds_.worth_fusing(count, simple * (1.0 + 1e-6))) {
          stop = best_bound_;
          fusing_proven = true;
        } else if (simple <= kPeerTableReach * stop && floor_sums_.back() >= kPeerTableFloor * best_bound_ &&
                   bounds_.worth_fusing(count, bounds_.peer_upper_rounds(dec, &s_.ls) * (1.0 + 1e-6))) {
          // The per-round upper bound costs a walk over the transfers: built only when it
          // should pay, i.e. the simple bound is within kPeerTableReach of the threshold and
          // the pass stopped at the best bound would end early (its floor is near the best
          // bound, so the plan cannot win).
          stop = best_bound_;
          fusing_proven = true;
        }
      }
      b1 = bounds_.merged_bound(dec, 1, &s_.ls, &exact, nullptr, nullptr, &hot, stop,
                                std::numeric_limits<double>::infinity(), fl);
    }
    if (dec.have1) exact = dec.exact1;
    const bool reference = dec.family == kPeerRounds || dec.family == kDirect;
    if (!std::isinf(b1)) {
      cands_.push_back({b1, static_cast<int>(d), 1, exact, reference});
      best_bound_ = std::min(best_bound_, b1);
    }
  }
  if (count == 1 || dec.backfilled || (!fusing_proven && !bounds_.worth_fusing(count, b1))) return;
  for (int m : {count, kMaxMergeManyRanks, 4, 2}) {
    if (m >= count && (m != count || skip_all_)) continue;
    // With copy-engine queues peer rounds in one phase never beat split rounds in one phase
    // (64 ranks): the budget goes to runs of 8 instead.
    if (model_.copy_engines > 0 && m == count && dec.family == kPeerRounds) continue;
    fused_.push_back({bounds_.floor_at(hot, (count + m - 1) / m, std::numeric_limits<double>::infinity()),
                      static_cast<int>(d), m, false, false});
  }
}

// Up to kMaxSimulatedRanks ranks: the decomposition fused by 1, 2, 4, ... up to all its phases,
// each bounded (with its signature and per-group bounds, for the event model).
void Candidates::offer_merges(size_t d) {
  const Decomposition& dec = decs_[d];
  const int count = static_cast<int>(dec.pairs.size());
  for (int merge = 1;; merge *= 2) {
    const int m = std::min(merge, count);
    if (m == count && m > 1 && skip_all_) break;
    bool exact = true;
    uint64_t sig = 0;
    std::vector<double> per_group;
    const double bound = m == 1 && dec.have1 ? dec.bound1 : bounds_.merged_bound(dec, m, &s_.ls, &exact, &sig, &per_group);
    if (m == 1 && dec.have1) {
      exact = dec.exact1;
      sig = dec.sig1;
    }
    const bool reference = m == 1 && (dec.family == kPeerRounds || dec.family == kDirect || dec.family == kHostRounds);
    const size_t twin = static_cast<size_t>(std::find(seen_.begin(), seen_.end(), sig) - seen_.begin());
    if (twin < seen_.size()) {
      // Keep one copy; it is a reference if either is, and simulated if either may be.
      Candidate& kept = cands_[twin];
      kept.reference = kept.reference || reference;
      if (!bounds_.affordable(decs_[kept.dec], kept.merge) && bounds_.affordable(dec, m)) {
        kept.dec = static_cast<int>(d);
        kept.merge = m;
      }
      if (m == 1) break;  // the whole decomposition repeats an earlier one
    } else {
      seen_.push_back(sig);
      cands_.push_back({bound, static_cast<int>(d), m, exact, reference});
      if (per_group.size() > 1) {
        cands_.back().groups = static_cast<int>(group_bounds_.size());
        group_bounds_.push_back(std::move(per_group));
      }
      best_bound_ = std::min(best_bound_, bound);
    }
    // Fusing a time-sharing plan's phases would change the configurations it was solved for.
    if (m >= count || !bounds_.worth_fusing(count, bound) || dec.family == kTimeShare || dec.backfilled) break;
    // With copy-engine queues (no eta) on one host (<= 16 ranks) fused runs of a few phases
    // never won in the benchmark: the choice is between the unfused plan and one phase in that
    // order.  (With several hosts they do win.)
    if (model_.copy_engines > 0 && model_.eta_beta <= 0.0 && net_.n <= kCatalogMaxRanks)
      merge = std::max(merge, count / 2 + 1);
  }
}

// A fused run that is not exact is charged its margins (kQueueMargin, kFusedMargin).
double Candidates::margin(const Candidate& f) const {
  double x = 1.0;
  if (model_.copy_engines > 0 && decs_[f.dec].family == kSplitPeer) x *= 1.0 + kQueueMargin;
  if (model_.eta_beta > 0.0) x *= 1.0 + kFusedMargin * std::log2(static_cast<double>(f.merge));
  return x;
}

// Many ranks: fused runs in increasing order of their latency-aware floor (floor_at(), a lower
// bound on their bound); stop when the floor reaches the best bound, or when the deterministic
// budget of kFusedBoundPasses passes over the transfers is spent.  Runs of whole split peer
// rounds are never exact (first fit put each pair of a phase after a phase where one of its
// links was taken, so two fused phases share a link), so one whose charged floor reaches the
// best bound cannot win and is skipped without a pass.
void Candidates::bound_fused_runs() {
  std::sort(fused_.begin(), fused_.end());
  int passes = 0;
  const int budget = model_.copy_engines > 0 ? kFusedBoundPassesQueued : kFusedBoundPasses;
  for (const Candidate& f : fused_) {
    if (f.bound >= best_bound_ || passes >= budget) break;
    const Decomposition& dec = decs_[f.dec];
    if (dec.family == kSplitPeer && dec.unique && f.bound * margin(f) >= best_bound_) continue;
    bool ex = true;
    // Stopped early once it provably cannot reach best_bound_ (with its margins once inexact).
    const std::vector<double>* fl = nullptr;
    if (dec.family == kPeerRounds) {
      if (peer_bytes_.phases != dec.pairs.size() || peer_bytes_.links.empty())
        bounds_.peer_loads(s_.demand, dec, s_.load, s_.bound_s, &peer_bytes_);
      bounds_.peer_floor_prefix(peer_bytes_, dec.pairs.size(), f.merge, &floor_sums_);
      fl = &floor_sums_;
    }
    double bound = bounds_.merged_bound(dec, f.merge, &s_.ls, &ex, nullptr, nullptr, &s_.hot, best_bound_,
                                        best_bound_ / margin(f) * (1.0 + 1e-9), fl);
    ++passes;
    if (!ex) bound *= margin(f);
    cands_.push_back({bound, f.dec, f.merge, ex, false});
    best_bound_ = std::min(best_bound_, bound);
  }
}

// Branch and bound over the candidates in bound order: exact ones cost their bound, the others
// are simulated (up to kMaxSimulated, plus the baselines' own plans) while their bound can
// still beat the best cost.
std::vector<Phase> Candidates::pick(PlanInfo* info) {
  // With copy-engine queues (no eta) on one host the candidates simulated are one-phase orders
  // of equal bounds (the plain link load) whose event-model costs differ by a few percent; the
  // catalog's and the peer rounds' orders, the ones that most often reach the plan floor, go
  // first among equal bounds, so that the search below usually ends at the first or second
  // simulation (kGoodEnough; small sizes, see kGoodEnoughAbs).
  const double floor_s = s_.floor_s;
  const bool stop_good_enough = kGoodEnough * floor_s <= kGoodEnoughAbs;
  if (stop_good_enough && model_.copy_engines > 0 && model_.eta_beta <= 0.0 && net_.n <= kCatalogMaxRanks)
    for (Candidate& c : cands_) {
      const int fam = decs_[c.dec].family;
      c.tie = fam == kCatalogChannels ? 0 : fam == kPeerRounds ? 1 : fam == kLinkGreedy ? 2 : 3;
    }
  std::sort(cands_.begin(), cands_.end());
  double best_cost = std::numeric_limits<double>::infinity();
  const Candidate* best = nullptr;
  int simulated = 0;
  // The cheapest exact candidate (its bound is its cost, under every model) is reached by the
  // loop below unless a cheaper one wins first, so a simulation that cannot beat it is stopped
  // early; a simulated candidate must beat it by the same relative margin as any incumbent
  // (an event-model tie goes to the exact plan).
  double exact_best = std::numeric_limits<double>::infinity();
  for (const Candidate& c : cands_)
    if (c.exact) exact_best = std::min(exact_best, c.bound * (1.0 - 1e-12));
  for (const Candidate& c : cands_) {
    if (c.bound >= best_cost * (1.0 - 1e-12)) break;
    // The event model is the expensive part of planning: past kMaxSimulated candidates only
    // exact ones (no shared link) are still considered.
    // Past kMaxSimulatedRanks ranks the event model is not run at all: candidates are ranked
    // by their bounds (planning time); below, unaffordable candidates are skipped.
    const bool by_bound = c.exact || net_.n > kMaxSimulatedRanks;
    // The baselines' own plans (peer rounds, direct) are always costed, outside the budget
    // (unless a plan within kGoodEnough of the floor ended the search), so the choice never
    // trails them by more than kGoodEnough plus the event model's error.
    if (!by_bound && ((simulated >= kMaxSimulated && !c.reference) || !bounds_.affordable(decs_[c.dec], c.merge)))
      continue;
    simulated += by_bound ? 0 : 1;
    const double cost = by_bound ? c.bound
                                 : s_.costing.merged_cost(decs_[c.dec].pairs, decs_[c.dec].bytes, c.merge, &s_.ls,
                                                          std::min(best_cost, exact_best),
                                                          c.groups >= 0 ? &group_bounds_[c.groups] : nullptr);
    if (cost < best_cost * (1.0 - 1e-12)) {
      best_cost = cost;
      best = &c;
      // No plan costs less than the plan floor: one within kGoodEnough of it ends the search, as
      // an exact link-greedy plan does (the plan taken is then at most kGoodEnough, and at most
      // kGoodEnoughAbs seconds, above the best candidate's cost).
      if (stop_good_enough && best_cost <= (1.0 + kGoodEnough) * floor_s) break;
    }
  }
  const Decomposition& dec = decs_[best->dec];
  if (info)
    *info = PlanInfo{best_cost, static_cast<int>(dec.pairs.size()), best->merge, static_cast<double>(dec.quantum),
                     dec.family == kPeerRounds ? 1 : 0, dec.family, static_cast<int>(cands_.size()), simulated,
                     dec.backfilled};
  return materialize(net_, dec.pairs, dec.bytes, best->merge);
}

}  // namespace

std::vector<Phase> choose_plan(PlanSearch* s, PlanInfo* info) { return Candidates(s).choose(info); }

}  // namespace varipath
}  // namespace hoccl
