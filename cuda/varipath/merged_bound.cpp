// Bounds::merged_bound(): the lower bound every candidate is ranked by (see bounds.h).
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "varipath/bounds.h"

namespace hoccl {
namespace varipath {

namespace {

// splitmix64 finaliser: candidate signatures (identical fused phases are costed once).
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Relative margin of screening tests done with multiplications by reciprocals (a few ulps
// off the exact divisions); values inside it are decided by the exact division.
constexpr double kScreen = 1e-9;
// Flow sizes kept per link while adding a group's transfers, up to this many flows per link
// (else they are gathered from the flows afterwards).
constexpr int kOnLink = 8;
// A group touching at least 1 / kDenseShare of the links scans all of them.
constexpr size_t kDenseShare = 4;

}  // namespace

// Lower bound of merged_cost(): per group, the start latency plus, for every link, the time to
// drain its flows if they left smallest first (each step at bandwidth * eta(flows still on the
// link)), which no sharing can beat.  Exact when no link carries two flows (and no source
// queues): then every flow runs alone.  *exact reports whether every group was exact.
//
// Early stop (fused runs, hot given): the groups still to come cost at least their start
// latencies plus the time to drain the hot link's bytes left in them (a group's bound is at
// least that link's smallest-first eta drain, see floor_at()); once the groups done plus that exceed `stop`, or
// `stop_inexact` after a group that is not exact (the candidate then pays its margins), the
// candidate cannot win and +inf is returned (*exact false).
double Bounds::merged_bound(const Decomposition& dec, int merge, LinkScratch* ls, bool* exact,
                            uint64_t* signature, std::vector<double>* group_bounds, const HotLink* hot,
                            double stop, double stop_inexact, const std::vector<double>* floor_prefix) const {
  if (group_bounds) group_bounds->clear();
  double total = 0.0;
  *exact = true;
  uint64_t sig = 0;
  const bool sharing_costs = model_.eta_beta > 0.0 || model_.copy_engines > 0;
  if (dec.disjoint && merge == 1) {
    // Every phase carries at most one transfer per link (so each pair at most once): the
    // busiest link's time is the largest transfer over its path's narrowest link (the same
    // division as below), and no link is shared; only copy-engine queues can make it inexact.
    for (size_t i = 0; i < dec.pairs.size(); ++i) {
      double worst = 0.0;
      uint64_t group = 0;
      bool queued = false;
      for (size_t k = 0; k < dec.pairs[i].size(); ++k) {
        const int p = dec.pairs[i][k];
        const double b = static_cast<double>(dec.bytes[i][k]);
        if (net_.links_of(p).begin() != net_.links_of(p).end()) worst = std::max(worst, b / net_.pair_min_bw[p]);
        if (signature) {
          const uint64_t h = mix64((static_cast<uint64_t>(p) << 40) ^ static_cast<uint64_t>(b));
          group = model_.copy_engines > 0 ? mix64(group ^ h) : group + h;
        }
        if (model_.copy_engines > 0) queued = queued || ++ls->per_source[net_.pair_src[p]] > model_.copy_engines;
      }
      if (model_.copy_engines > 0)
        for (int p : dec.pairs[i]) ls->per_source[net_.pair_src[p]] = 0;
      if (signature) sig = mix64(sig ^ group);
      *exact = *exact && !(queued && sharing_costs);
      total += net_.latency_s + worst;
      if (group_bounds) group_bounds->push_back(net_.latency_s + worst);
    }
    if (signature) *signature = sig;
    return total;
  }
  const bool stoppable = hot && hot->link >= 0 && (stop < std::numeric_limits<double>::infinity() ||
                                                   stop_inexact < std::numeric_limits<double>::infinity());
  double hot_left = stoppable ? hot->load : 0.0;  // bytes on the hot link in the groups to come
  const bool all_links = stoppable && hot->loads && hot->loads->size() == net_.link_bw.size();
  if (all_links) ls->left_load.assign(hot->loads->begin(), hot->loads->end());  // every link's bytes to come
  // With an early stop the groups are bounded last first: the hot pairs, placed first, are then
  // in the groups to come, where the hot link's drain bounds them closely.  Their bounds are
  // summed in plan order at the end (the same total).
  const size_t groups = (dec.pairs.size() + merge - 1) / merge;
  const bool backwards = stoppable && !signature && !group_bounds;
  if (backwards) ls->group_bound.assign(groups, 0.0);
  // The busiest link's bytes to come take a scan of every link: done every `scan_every` groups,
  // so that the scans cost about an eighth of adding the transfers (about 6 links each).
  size_t scan_every = 1;
  if (all_links) {
    size_t transfers = 0;
    for (const auto& ph : dec.pairs) transfers += ph.size();
    scan_every = std::max<size_t>(1, (8 * net_.link_bw.size() * groups) / std::max<size_t>(1, 6 * transfers));
  }
  double done = 0.0;  // bounds of the groups done so far
  // The group's flows and touched links in flat buffers written by index (no push_back per
  // transfer); the link tables through local pointers.
  if (ls->mb_pair.size() < net_.pair_links.size()) {
    ls->mb_pair.resize(net_.pair_links.size());
    ls->mb_bytes.resize(net_.pair_links.size());
  }
  if (ls->mb_touched.size() < net_.link_bw.size()) ls->mb_touched.resize(net_.link_bw.size());
  // Under contention each link's flow sizes are also written to its kOnLink slots as the
  // transfers are added (a repeated pair adds to its slot: paths of at most 8 links), so the
  // shared links' sizes need no second pass over the flows unless a link has more flows.
  const bool keep_sizes = model_.eta_beta > 0.0 && (dec.unique || !net_.pair_path8.empty());
  if (ls->on_link.size() < net_.link_bw.size() * kOnLink) ls->on_link.resize(net_.link_bw.size() * kOnLink);  // written by unique decompositions always
  if (keep_sizes && !dec.unique && ls->flow_rank.size() < net_.pair_links.size() * 8) ls->flow_rank.resize(net_.pair_links.size() * 8);
  double* const onl = ls->on_link.data();
  int* const frank = ls->flow_rank.data();
  int* const fp = ls->mb_pair.data();
  double* const fb = ls->mb_bytes.data();
  int* const tl = ls->mb_touched.data();
  double* const load = ls->load.data();
  int* const flows = ls->flows.data();
  int* const slot = ls->slot.data();
  const double* const ibw = net_.inv_bw.data();
  const double* const bw = net_.link_bw.data();
  const size_t nlinks = net_.link_bw.size();
  for (size_t g = 0; g < groups; ++g) {
    const size_t start = (backwards ? groups - 1 - g : g) * static_cast<size_t>(merge);
    const size_t end = std::min(dec.pairs.size(), start + static_cast<size_t>(merge));
    int nf = 0, nt = 0;
    bool spilled = !keep_sizes;  // some link has more than kOnLink flows
    for (size_t i = start; i < end; ++i) {
      const int* const pi = dec.pairs[i].data();
      const int64_t* const bi = dec.bytes[i].data();
      const size_t count = dec.pairs[i].size();
      for (size_t k = 0; k < count; ++k) {
        const int p = pi[k];
        const double b = static_cast<double>(bi[k]);
        const int* const lb = net_.pl.data() + net_.pl_off[p];
        const int* const le = net_.pl.data() + net_.pl_off[p + 1];
        if (dec.unique) {  // every pair appears once in the decomposition: a new flow
          fp[nf] = p;
          fb[nf] = b;
          ++nf;
          for (const int* it = lb; it != le; ++it) {
            const int l = *it;
            load[l] += b;
            const int r = flows[l]++;
            if (r == 0) tl[nt++] = l;
            if (r < kOnLink)
              onl[l * kOnLink + r] = b;
            else
              spilled = true;
          }
          continue;
        }
        // A pair repeated inside the group is one flow (as materialize() merges it).
        int& at = slot[p];
        if (at < 0) {
          at = nf;
          fp[nf] = p;
          fb[nf] = b;
          ++nf;
          int* const rk = frank + static_cast<size_t>(at) * 8;
          for (const int* it = lb; it != le; ++it) {
            const int l = *it;
            load[l] += b;
            const int r = flows[l]++;
            if (r == 0) tl[nt++] = l;
            if (!keep_sizes) continue;
            rk[it - lb] = r;
            if (r < kOnLink)
              onl[l * kOnLink + r] = b;
            else
              spilled = true;
          }
        } else {
          fb[at] += b;
          const int* const rk = frank + static_cast<size_t>(at) * 8;
          for (const int* it = lb; it != le; ++it) {
            const int l = *it;
            load[l] += b;
            if (keep_sizes && rk[it - lb] < kOnLink) onl[l * kOnLink + rk[it - lb]] += b;
          }
        }
      }
    }
    // The busiest link's plain time: screened with reciprocals, then the exact division for the
    // links within kScreen of the screened maximum (the same value as dividing every link).
    // When the group touches a good share of the links, the per-link loops run over all of them
    // in index order (untouched links hold zeros): no gather through the touched list.
    const bool dense = static_cast<size_t>(nt) * kDenseShare >= nlinks;
    double wu = 0.0;
    bool shared = false;
    if (dense) {
      double m0 = 0.0, m1 = 0.0;
      int most = 0;
      size_t l = 0;
      for (; l + 2 <= nlinks; l += 2) {
        m0 = std::max(m0, load[l] * ibw[l]);
        m1 = std::max(m1, load[l + 1] * ibw[l + 1]);
        most = std::max(most, std::max(flows[l], flows[l + 1]));
      }
      for (; l < nlinks; ++l) {
        m0 = std::max(m0, load[l] * ibw[l]);
        most = std::max(most, flows[l]);
      }
      wu = std::max(m0, m1);
      shared = most > 1;
    } else {
      for (int j = 0; j < nt; ++j) {
        const int l = tl[j];
        shared = shared || flows[l] > 1;
        wu = std::max(wu, load[l] * ibw[l]);
      }
    }
    double worst = 0.0;
    const double cut = wu * (1.0 - kScreen);
    // Dense groups under contention with eta at its floor past the table: the same scan also
    // lists the shared links whose upper end reaches cut x (1 - kScreen), a superset of those
    // the needed-link test below can take (its threshold is worst x (1 - kScreen), worst being
    // wu within a few ulps), so that test runs over this list instead of every link.
    const bool list_near = dense && model_.eta_floored && model_.eta_beta > 0.0;
    if (list_near) {
      const double* const ie = model_.inv_eta_table.data();
      const int last = static_cast<int>(model_.inv_eta_table.size()) - 1;
      const double lower = cut * (1.0 - kScreen);
      std::vector<int>& nt_list = ls->near_top;
      nt_list.clear();
      for (size_t l = 0; l < nlinks; ++l) {
        const double m = load[l] * ibw[l];
        if (m >= cut) worst = std::max(worst, load[l] / bw[l]);
        const int k = flows[l];
        if ((k > 1) & (m * ie[std::min(k, last)] >= lower)) nt_list.push_back(static_cast<int>(l));
      }
    } else if (dense) {
      for (size_t l = 0; l < nlinks; ++l)
        if (load[l] * ibw[l] >= cut) worst = std::max(worst, load[l] / bw[l]);
    } else {
      for (int j = 0; j < nt; ++j) {
        const int l = tl[j];
        if (load[l] * ibw[l] >= cut) worst = std::max(worst, load[l] / bw[l]);
      }
    }
    // Signature of the fused phases as the cost model sees them: the flows and their bytes,
    // in order when copy-engine queues make the order matter.
    if (signature) {
      uint64_t group = 0;
      for (int f = 0; f < nf; ++f) {
        const uint64_t h = mix64((static_cast<uint64_t>(fp[f]) << 40) ^ static_cast<uint64_t>(fb[f]));
        group = model_.copy_engines > 0 ? mix64(group ^ h) : group + h;
      }
      sig = mix64(sig ^ group);
    }
    if (shared && model_.eta_beta > 0.0) {
      // A shared link drains in at least load / bw and at most load / (bw * eta(k)); only the
      // links whose upper end passes the busiest plain time can decide the maximum, so only
      // their flow sizes are gathered and sorted.
      // (The test is screened with multiplications by reciprocals; only values within kScreen
      // of the threshold take the exact division.)  The sizes go into one buffer, each needed
      // link's segment as long as its flow count.
      std::vector<int>& needed = ls->needed;
      std::vector<double>& needed_u = ls->needed_u;
      needed.clear();
      needed_u.clear();
      int total_flows = 0;
      const double over = worst * (1.0 + kScreen), near = worst * (1.0 - kScreen);
      size_t top = 0;  // the needed link with the largest upper end: drained first
      auto consider = [&](int l, int k) {
        const double u = load[l] * ibw[l] * model_.inv_eta(k);
        if (!(u > over || (u >= near && load[l] / (bw[l] * model_.eta(k)) > worst))) return;
        ls->need[l] = 1;
        ls->bucket_at[l] = total_flows;
        total_flows += k;
        if (!needed.empty() && u > needed_u[top]) top = needed.size();
        needed.push_back(l);
        needed_u.push_back(u);
      };
      if (list_near) {
        // The listed links in index order (the dense scan's order): the upper end through the eta
        // table clamped at its last entry (every larger count is at the floor too, so the value
        // is consider()'s own), then consider().
        const double* const ie = model_.inv_eta_table.data();
        const int last = static_cast<int>(model_.inv_eta_table.size()) - 1;
        for (int l : ls->near_top) {
          const int k = flows[l];
          const double u = load[l] * ibw[l] * ie[std::min(k, last)];
          if (u >= near) consider(l, k);
        }
      } else if (dense) {
        for (size_t l = 0; l < nlinks; ++l)
          if (flows[l] > 1) consider(static_cast<int>(l), flows[l]);
      } else {
        for (int j = 0; j < nt; ++j)
          if (flows[tl[j]] > 1) consider(tl[j], flows[tl[j]]);
      }
      // A link's drain is at most its upper end (a few ulps: u carries a 1e-6 margin), so once
      // the largest upper end's link is drained the links whose upper end stays under the
      // maximum found cannot change it and are skipped (the same maximum).
      if (!needed.empty()) {
        std::swap(needed[0], needed[top]);
        std::swap(needed_u[0], needed_u[top]);
      }
      // Drains needed link j from its k flow sizes at sz (sorted by `sort`, smallest first: the
      // i-th from the end is delivered while k - i flows share the link), unless its upper end
      // cannot raise `worst`.
      auto drain = [&](size_t j, double* sz, auto sort) {
        const int l = needed[j];
        ls->need[l] = 0;
        if (needed_u[j] * (1.0 + 1e-6) < worst) return;
        const int k = flows[l];
        sort(sz, k);
        double t = 0.0;
        for (int i = 0; i < k; ++i) t += sz[i] / (bw[l] * model_.eta(k - i));
        worst = std::max(worst, t);
      };
      if (!needed.empty() && !spilled) {
        auto insertion_sort = [](double* sz, int k) {  // at most kOnLink sizes
          for (int i = 1; i < k; ++i) {
            const double x = sz[i];
            int j = i;
            for (; j > 0 && sz[j - 1] > x; --j) sz[j] = sz[j - 1];
            sz[j] = x;
          }
        };
        for (size_t j = 0; j < needed.size(); ++j) drain(j, onl + needed[j] * kOnLink, insertion_sort);
      } else if (!needed.empty()) {
        // Every flow writes its size at each of its links' next slot; the links not needed all
        // point at one spare slot (bucket[0]) and do not advance (no branch per link).
        ls->bucket.resize(static_cast<size_t>(total_flows) + 1);
        double* buf = ls->bucket.data() + 1;
        const char* const nd = ls->need.data();
        int* const at = ls->bucket_at.data();
        for (int j = 0; j < nt; ++j)
          if (!nd[tl[j]]) at[tl[j]] = -1;
        for (int f = 0; f < nf; ++f) {
          const int p = fp[f];
          const double x = fb[f];
          for (const int* it = net_.pl.data() + net_.pl_off[p], *e = net_.pl.data() + net_.pl_off[p + 1]; it != e; ++it) {
            const int l = *it;
            buf[at[l]] = x;
            at[l] += nd[l];
          }
        }
        for (size_t j = 0; j < needed.size(); ++j)
          drain(j, buf + (at[needed[j]] - flows[needed[j]]), [](double* sz, int k) { std::sort(sz, sz + k); });
      }
    }
    if (model_.copy_engines > 0 && !shared) {
      for (int f = 0; f < nf; ++f) shared = shared || ++ls->per_source[net_.pair_src[fp[f]]] > model_.copy_engines;
      for (int f = 0; f < nf; ++f) ls->per_source[net_.pair_src[fp[f]]] = 0;
    }
    *exact = *exact && !(shared && sharing_costs);
    if (stoppable) hot_left -= load[hot->link];
    double* const left_load = all_links ? ls->left_load.data() : nullptr;
    if (dense) {
      if (left_load)
        for (size_t l = 0; l < nlinks; ++l) left_load[l] -= load[l];
      std::fill(load, load + nlinks, 0.0);
      std::fill(flows, flows + nlinks, 0);
    } else {
      for (int j = 0; j < nt; ++j) {
        const int l = tl[j];
        if (left_load) left_load[l] -= load[l];
        load[l] = 0.0;
        flows[l] = 0;
      }
    }
    if (!dec.unique)
      for (int f = 0; f < nf; ++f) slot[fp[f]] = -1;
    if (backwards)
      ls->group_bound[start / merge] = net_.latency_s + worst;
    else
      total += net_.latency_s + worst;
    done += net_.latency_s + worst;
    if (group_bounds) group_bounds->push_back(net_.latency_s + worst);
    if (stoppable && g + 1 < groups) {
      // The hot link's bytes left, drained as in floor_at(): in each group its t-th largest flow
      // moves at bandwidth * eta(t) at most, and rank t holds at most groups x biggest bytes.
      const double groups_left = static_cast<double>(groups - g - 1);
      double left = std::max(hot_left, 0.0) * (1.0 - 1e-9), rest = groups_left * net_.latency_s;
      for (int rank = 1; left > 0.0; ++rank) {
        const double take = std::min(left, groups_left * hot->biggest);
        rest += take / (hot->bw * model_.eta(rank));
        left -= take;
      }
      const double limit = *exact ? stop : std::min(stop, stop_inexact);
      if (floor_prefix && done + rest <= limit) {
        // The groups to come's floors (the most loaded links' bytes in each, see peer_floor_prefix()).
        const std::vector<double>& fp_sum = *floor_prefix;
        const double floors = backwards ? fp_sum[groups - g - 1] : fp_sum[groups] - fp_sum[g + 1];
        rest = std::max(rest, floors * (1.0 - 1e-9));
      }
      if (done + rest <= limit && all_links && (g + 1) % scan_every == 0) {
        // Else the busiest link's bytes to come.
        double busiest = 0.0;
        for (size_t l = 0; l < net_.link_bw.size(); ++l) busiest = std::max(busiest, ls->left_load[l] * net_.inv_bw[l]);
        rest = std::max(rest, groups_left * net_.latency_s + busiest * (1.0 - 1e-9));
      }
      if (done + rest > limit) {
        *exact = false;
        if (signature) *signature = 0;
        return std::numeric_limits<double>::infinity();
      }
    }
  }
  if (backwards)
    for (double b : ls->group_bound) total += b;
  if (signature) *signature = sig;
  return total;
}

}  // namespace varipath
}  // namespace hoccl
