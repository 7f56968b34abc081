// Lower bounds of the cost model (see bounds.h); merged_bound() is in merged_bound.cpp.
#include "varipath/bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

namespace {

// Event-model budget per candidate, see Bounds::affordable().
constexpr std::size_t kMaxSimulatedPhaseFlows = 1024;
constexpr std::size_t kMaxSimulatedFlows = 4096;
// Peer rounds' early-stop floors: at most this many of the most loaded links (see peer_loads()).
constexpr int kPeerFloorLinks = 64;

}  // namespace

std::vector<double> pair_urgency(const Network& net, const std::vector<int64_t>& demand, double* bound_s,
                                 std::vector<double>* load_out) {
  std::vector<double>& load = *load_out;
  load.assign(net.link_bw.size(), 0.0);
  // Each link's bytes.  When the whole demand is under 2^53 bytes every partial sum is an exact
  // integer in double precision, so the sums are taken in int64 (one-cycle adds, no chain of
  // dependent floating-point adds through memory): the same values.
  uint64_t total = 0;
  bool small = true;
  for (size_t p = 0; p < demand.size(); ++p)
    if (net.pair_src[p] != net.pair_dst[p] && demand[p] > 0) {
      total += static_cast<uint64_t>(demand[p]);
      small = small && total < (uint64_t{1} << 53);
    }
  if (small) {
    std::vector<int64_t> sum(net.link_bw.size(), 0);
    for (size_t p = 0; p < demand.size(); ++p)
      if (net.pair_src[p] != net.pair_dst[p] && demand[p] > 0)
        for (int l : net.links_of(p)) sum[l] += demand[p];
    for (size_t l = 0; l < load.size(); ++l) load[l] = static_cast<double>(sum[l]);
  } else {
    for (size_t p = 0; p < demand.size(); ++p)
      if (net.pair_src[p] != net.pair_dst[p] && demand[p] > 0)
        for (int l : net.links_of(p)) load[l] += static_cast<double>(demand[p]);
  }
  double top = 0.0;
  for (size_t l = 0; l < load.size(); ++l) top = std::max(top, load[l] / net.link_bw[l]);
  *bound_s = top;
  std::vector<double> w(demand.size(), 0.0);
  if (top <= 0.0) return w;
  std::vector<double> busy(load.size() + 1, 0.0);  // each link's time, divided once (0 past the end)
  for (size_t l = 0; l < load.size(); ++l) busy[l] = load[l] / net.link_bw[l];
  if (!net.pair_path8.empty()) {
    // Paths padded to 8 links with the index past the end (busy 0): a max tree, no loop.
    const int* path = net.pair_path8.data();
    const double* b = busy.data();
    for (size_t p = 0; p < demand.size(); ++p, path += 8) {
      const double u = std::max(std::max(std::max(b[path[0]], b[path[1]]), std::max(b[path[2]], b[path[3]])),
                                std::max(std::max(b[path[4]], b[path[5]]), std::max(b[path[6]], b[path[7]])));
      w[p] = kMinWeight + std::max(u, 0.0) / top;
    }
    return w;
  }
  for (size_t p = 0; p < demand.size(); ++p) {
    double u = 0.0;
    for (int l : net.links_of(p)) u = std::max(u, busy[l]);
    w[p] = kMinWeight + u / top;
  }
  return w;
}

// A lower bound on the cost-model cost of any plan, from the most loaded link l (m pairs cross
// it, the largest with b bytes): with P phases using l, each pays the start latency, and in each
// phase the t-th largest transfer on l is delivered while at least t share it, at bandwidth *
// eta(t) at most; rank t holds at most P * b bytes over the plan.  Minimised over P.  Without
// eta (fluid, copy engines) this is one start latency plus l's time, the plain bound.
double Bounds::plan_floor(const std::vector<int64_t>& demand, const std::vector<double>& load, double bound_s,
                          HotLink* hot_link) const {
  int hot = 0;
  for (size_t l = 1; l < load.size(); ++l)
    if (load[l] / net_.link_bw[l] > load[hot] / net_.link_bw[hot]) hot = static_cast<int>(l);
  HotLink h;
  h.link = hot;
  h.loads = &load;
  h.load = load[hot];
  h.bw = net_.link_bw[hot];
  h.bound_s = bound_s;
  // The pairs crossing the hot link (the topology's link -> pairs index; no scan of all pairs).
  for (int k = net_.lp_off[hot]; k < net_.lp_off[hot + 1]; ++k) {
    const int p = net_.lp[k];
    if (demand[p] <= 0) continue;
    ++h.pairs;
    h.biggest = std::max(h.biggest, static_cast<double>(demand[p]));
  }
  if (hot_link) *hot_link = h;
  if (model_.eta_beta <= 0.0 || h.pairs == 0) return net_.latency_s + bound_s;
  double best = std::numeric_limits<double>::infinity();
  for (int phases = 1; phases <= h.pairs; ++phases) best = std::min(best, floor_at(h, phases, best));
  return std::max(best, net_.latency_s + bound_s);
}

// The plan floor for plans of exactly `phases` phases (see plan_floor(); a plan with fewer
// phases on the hot link pays at least as much).  Stops adding once `stop` is reached.
double Bounds::floor_at(const HotLink& h, int phases, double stop) const {
  const double plain = phases * net_.latency_s + h.bound_s;
  if (model_.eta_beta <= 0.0 || h.pairs == 0) return plain;
  double left = h.load, cost = phases * net_.latency_s;
  for (int rank = 1; left > 0.0 && cost < stop; ++rank) {
    const double take = std::min(left, phases * h.biggest);
    cost += take / (h.bw * model_.eta(rank));
    left -= take;
  }
  return std::max(cost, plain);
}

// The peer-round decomposition's bytes per round on the links loaded to at least a quarter of
// the busiest link's time (at most kPeerFloorLinks of them, the most loaded), from the
// topology's link -> pairs index (link-major: each link's rounds are adjacent).
void Bounds::peer_loads(const std::vector<int64_t>& demand, const Decomposition& dec, const std::vector<double>& load,
                        double bound_s, PeerLoads* out) const {
  out->links.clear();
  std::vector<std::pair<double, int>> hot;
  for (size_t l = 0; l < load.size(); ++l) {
    const double busy = load[l] / net_.link_bw[l];
    if (busy > 0.0 && busy >= 0.25 * bound_s) hot.push_back({-busy, static_cast<int>(l)});
  }
  if (hot.size() > static_cast<size_t>(kPeerFloorLinks)) {
    std::nth_element(hot.begin(), hot.begin() + kPeerFloorLinks, hot.end());
    hot.resize(kPeerFloorLinks);
  }
  for (const auto& h : hot) out->links.push_back(h.second);
  // Round k (destination - source mod n) -> phase index (rounds without demand have none).
  std::vector<int> phase_of(static_cast<size_t>(net_.n), -1);
  for (size_t i = 0; i < dec.pairs.size(); ++i) {
    const int p = dec.pairs[i].front();
    const int k = net_.pair_dst[p] - net_.pair_src[p];
    phase_of[k < 0 ? k + net_.n : k] = static_cast<int>(i);
  }
  const size_t P = dec.pairs.size(), K = out->links.size();
  out->phases = P;
  out->bytes.assign(K * P, 0.0);
  for (size_t c = 0; c < K; ++c) {
    const int l = out->links[c];
    double* const by = out->bytes.data() + c * P;
    for (int k = net_.lp_off[l]; k < net_.lp_off[l + 1]; ++k) {
      const int p = net_.lp[k];
      if (demand[p] <= 0 || net_.pair_src[p] == net_.pair_dst[p]) continue;
      const int r = net_.pair_dst[p] - net_.pair_src[p];
      by[phase_of[r < 0 ? r + net_.n : r]] += static_cast<double>(demand[p]);
    }
  }
}

// An upper bound on the unfused peer-round bound: per round, its start latency plus, over the
// links, flows / (bandwidth x eta(flows)) times the round's largest transfer (a link's
// smallest-first drain is at most its bytes / (bandwidth x eta(flows)), and a link carries at
// most round_flows_ pairs of one round), summed over the rounds.
double Bounds::peer_upper_simple(const Decomposition& dec) const {
  double f = 0.0;  // max over links of flows / (bandwidth x eta(flows))
  for (size_t l = 0; l < net_.round_flows.size(); ++l)
    if (net_.round_flows[l] > 0) f = std::max(f, net_.round_flows[l] * net_.inv_bw[l] * model_.inv_eta(net_.round_flows[l]));
  double total = 0.0;
  for (const auto& b : dec.bytes) {
    int64_t most = 0;
    for (int64_t x : b) most = std::max(most, x);
    total += net_.latency_s + static_cast<double>(most) * f;
  }
  return total;
}

// A tighter upper bound on the unfused peer-round bound than peer_upper_simple(), at the cost of
// one walk over the rounds' transfers: per round, its start latency plus the most, over the
// links, of the round's bytes on the link / (bandwidth x eta(round_flows_)) (a link's
// smallest-first drain is at most its bytes / (bandwidth x eta(its flows)), eta does not grow
// with the flows, and a round puts at most round_flows_ pairs on a link).  Uses ls->load
// (zeros on entry and on return).
double Bounds::peer_upper_rounds(const Decomposition& dec, LinkScratch* ls) const {
  const size_t L = net_.link_bw.size();
  std::vector<double> w(L);
  for (size_t l = 0; l < L; ++l) w[l] = net_.round_flows[l] > 0 ? net_.inv_bw[l] * model_.inv_eta(net_.round_flows[l]) : 0.0;
  const double* const wl = w.data();
  double* const load = ls->load.data();
  const int* const pl = net_.pl.data();
  const int* const off = net_.pl_off.data();
  double total = 0.0;
  for (size_t i = 0; i < dec.pairs.size(); ++i) {
    const int* const pi = dec.pairs[i].data();
    const int64_t* const bi = dec.bytes[i].data();
    const size_t count = dec.pairs[i].size();
    for (size_t k = 0; k < count; ++k) {
      const double b = static_cast<double>(bi[k]);
      for (int j = off[pi[k]], e = off[pi[k] + 1]; j < e; ++j) load[pl[j]] += b;
    }
    double m0 = 0.0, m1 = 0.0;
    size_t l = 0;
    for (; l + 2 <= L; l += 2) {
      m0 = std::max(m0, load[l] * wl[l]);
      m1 = std::max(m1, load[l + 1] * wl[l + 1]);
    }
    for (; l < L; ++l) m0 = std::max(m0, load[l] * wl[l]);
    std::fill(load, load + L, 0.0);
    total += net_.latency_s + std::max(m0, m1);
  }
  return total;
}

// Prefix sums of per-group floors of the peer rounds fused by `merge`: a group's bound is at least
// its start latency plus, for each kept link, the group's bytes on it over its bandwidth (the
// same division as in merged_bound(); byte sums are exact integers).
void Bounds::peer_floor_prefix(const PeerLoads& pl, size_t phases, int merge, std::vector<double>* prefix) const {
  const size_t K = pl.links.size(), P = pl.phases;
  const size_t groups = (phases + merge - 1) / merge;
  std::vector<double> worst(groups, 0.0);
  for (size_t c = 0; c < K; ++c) {
    const double* const by = pl.bytes.data() + c * P;
    const double bw = net_.link_bw[pl.links[c]];
    for (size_t g = 0; g < groups; ++g) {
      double sum = 0.0;
      for (size_t i = g * merge; i < std::min(phases, (g + 1) * static_cast<size_t>(merge)); ++i) sum += by[i];
      worst[g] = std::max(worst[g], sum / bw);
    }
  }
  prefix->assign(groups + 1, 0.0);
  for (size_t g = 0; g < groups; ++g) (*prefix)[g + 1] = (*prefix)[g] + net_.latency_s + worst[g];
}

// Whether the event model may cost `dec` fused by `merge`: its work grows with the flows of a
// phase times their completions, so fused phases over kMaxSimulatedPhaseFlows transfers, or
// plans over kMaxSimulatedFlows transfers in all, are not simulated (nor chosen; the unfused
// link-greedy plan is always exact).  Transfers repeated inside a run count once per channel
// phase: an upper bound, enough for a cap.
bool Bounds::affordable(const Decomposition& dec, int merge) const {
  std::size_t total = 0, largest = 0;
  for (size_t start = 0; start < dec.pairs.size(); start += merge) {
    std::size_t flows = 0;
    for (size_t i = start; i < std::min(dec.pairs.size(), start + static_cast<size_t>(merge)); ++i)
      flows += dec.pairs[i].size();
    largest = std::max(largest, flows);
    total += flows;
  }
  return largest <= kMaxSimulatedPhaseFlows && total <= kMaxSimulatedFlows;
}

// Under contention, fusing phases saves start latency but derates shared links; when the
// unfused plan's start latency is under kFuseLatencyShare of its cost, the saving cannot pay
// for the derating in practice, so fused variants are not even bounded (planning time).
// Under `fluid` and copy-engine queues fusing can also overlap the phases' tails, so it is
// always tried there.
bool Bounds::worth_fusing(int phases, double unfused_bound) const {
  if (model_.eta_beta <= 0.0) return true;
  return static_cast<double>(phases) * net_.latency_s >= kFuseLatencyShare * unfused_bound;
}

}  // namespace varipath
}  // namespace hoccl
