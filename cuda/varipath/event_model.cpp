// The event model of one phase (Costing::event_time(), see cost_model.h).
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "varipath/cost_model.h"

namespace hoccl {
namespace varipath {

// Event model of one phase under the contention / copy-engine model, as the simulator runs it:
// max-min-fair rates by progressive filling (each link's bandwidth derated by eta(flows on it)
// under contention), re-solved at each completion, when the flow counts drop (and, with copy
// engines, the source's next queued transfer starts, in phase order).  Unlike a per-link load
// bound it sees a flow stuck behind a busy link or queued behind its source's other transfers.
// The phase's link tables are built once; a solve then costs O(running flows x path +
// bottleneck iterations x links still open).  The bytes left on each link are tracked too: no
// link moves more than its bandwidth, so the time so far plus the busiest link's bytes left
// over its bandwidth is a lower bound on the phase; once it reaches `limit` the phase cannot
// fit (the caller then discards the candidate) and the simulation stops there.
double Costing::event_time(LinkScratch* ls, double limit) const {
  const size_t nf = ls->flow_pair.size();
  const size_t nl = ls->touched.size();
  const int engines = model_.copy_engines;
  // Link tables: local link ids in first-touch order, flow -> local links, link -> flows.
  ls->act.assign(nl, 0);
  ls->rem.resize(nl);
  ls->lbw.resize(nl);
  for (size_t i = 0; i < nl; ++i) {
    ls->link_id[ls->touched[i]] = static_cast<int>(i);
    ls->rem[i] = ls->load[ls->touched[i]];
    ls->lbw[i] = net_.link_bw[ls->touched[i]];
  }
  const double* lbw = ls->lbw.data();
  // Flow and link tables in flat buffers written by index (no push_back in the event loop).
  size_t nfl = 0;
  for (size_t f = 0; f < nf; ++f) nfl += static_cast<size_t>(net_.pl_off[ls->flow_pair[f] + 1] - net_.pl_off[ls->flow_pair[f]]);
  ls->flow_off.resize(nf + 1);
  ls->flow_links.resize(nfl);
  ls->link_off.assign(nl + 1, 0);
  {
    int* flw = ls->flow_links.data();
    int* loff = ls->link_off.data();
    const int* lid = ls->link_id.data();
    int at = 0;
    for (size_t f = 0; f < nf; ++f) {
      ls->flow_off[f] = at;
      for (int l : net_.links_of(ls->flow_pair[f])) {
        const int i = lid[l];
        flw[at++] = i;
        loff[i + 1] += 1;
      }
    }
    ls->flow_off[nf] = at;
    for (size_t i = 0; i < nl; ++i) loff[i + 1] += loff[i];
  }
  ls->link_flows.resize(nfl);
  ls->open.assign(ls->link_off.begin(), ls->link_off.end() - 1);  // fill cursors
  for (size_t f = 0; f < nf; ++f)
    for (int k = ls->flow_off[f]; k < ls->flow_off[f + 1]; ++k) ls->link_flows[ls->open[ls->flow_links[k]]++] = static_cast<int>(f);
  const int* fl = ls->flow_links.data();
  const int* foff = ls->flow_off.data();
  ls->cap0.resize(nl);
  ls->cap_left.resize(nl);
  ls->unfrozen.resize(nl);
  ls->open.resize(nl);
  ls->left.assign(ls->flow_bytes.begin(), ls->flow_bytes.end());
  ls->rate.assign(nf, 0.0);
  ls->state.assign(nf, 0);
  ls->running.resize(nf);
  ls->next_run.resize(nf);
  // Local views of the scratch (stores through the char state table would otherwise make the
  // compiler reload every table's address).
  int* act = ls->act.data();
  double* rem = ls->rem.data();
  double* cap0 = ls->cap0.data();
  double* cap_left = ls->cap_left.data();
  int* unfrozen = ls->unfrozen.data();
  int* openl = ls->open.data();
  double* left = ls->left.data();
  double* rate = ls->rate.data();
  char* state = ls->state.data();
  int* running = ls->running.data();
  int* next_run = ls->next_run.data();
  int* per_source = ls->per_source.data();
  int* src_head = ls->src_head.data();
  const int* flow_pair = ls->flow_pair.data();
  const int* loff = ls->link_off.data();
  const int* lflows = ls->link_flows.data();
  const int* psrc = net_.pair_src.data();
  size_t nrun = 0;
  // With copy engines flows start in list order per source: each source's queued flows are
  // chained (src_next, built back to front) from its first queued one (src_head).
  if (engines > 0) {
    ls->src_next.resize(nf);
    for (size_t f = nf; f-- > 0;) {
      const int src = psrc[flow_pair[f]];
      ls->src_next[f] = src_head[src];
      src_head[src] = static_cast<int>(f);
    }
  }
  const int* src_next = engines > 0 ? ls->src_next.data() : nullptr;
  for (size_t f = 0; f < nf; ++f) {
    const int src = psrc[flow_pair[f]];
    if (engines > 0 && per_source[src] >= engines) continue;
    if (engines > 0) src_head[src] = src_next[f];  // started: the chain moves on
    per_source[src] += 1;
    running[nrun++] = static_cast<int>(f);
    state[f] = 1;
    for (int k = foff[f]; k < foff[f + 1]; ++k) act[fl[k]] += 1;
  }
  constexpr double kDone = std::numeric_limits<double>::infinity();
  double t = 0.0;
  while (nrun > 0 && t < limit) {
    // Max-min-fair rates of the running flows (classic bottleneck iteration: the link with the
    // smallest fair share of its remaining capacity fixes the rate of its unfrozen flows; their
    // rates come off their other links).
    size_t nopen = 0;
    for (size_t i = 0; i < nl; ++i) {
      const int a = act[i];
      if (a == 0) continue;
      cap0[i] = lbw[i] * (a > 1 ? model_.eta(a) : 1.0);
      cap_left[i] = cap0[i];
      unfrozen[i] = a;
      openl[nopen++] = static_cast<int>(i);
    }
    for (size_t r = 0; r < nrun; ++r) rate[running[r]] = -1.0;
    size_t open = nrun;
    while (open > 0) {
      // The first open link (local order) with the smallest share; links with no unfrozen flow
      // left are dropped from the open list on the way (order kept).
      // (A link's share, what is left of its capacity over its unfrozen flows, only changes
      // when one of its flows is frozen; computing it here is the same value.)
      // Shares are compared by cross-multiplication (no division per link; the counts are
      // positive): cap_i / u_i < cap_n / u_n  <=>  cap_i * u_n < cap_n * u_i.
      size_t kept = 0;
      int neck = -1;
      double neck_cap = 0.0, neck_u = 1.0;
      for (size_t o = 0; o < nopen; ++o) {
        const int i = openl[o];
        const int u = unfrozen[i];
        if (u == 0) continue;
        openl[kept++] = i;
        const double c = cap_left[i], du = static_cast<double>(u);
        if (neck < 0 || c * neck_u < neck_cap * du) {
          neck = i;
          neck_cap = c;
          neck_u = du;
        }
      }
      nopen = kept;
      const double low = neck_cap / neck_u;
      const double level = std::max(low, 0.0);
      for (int k = loff[neck]; k < loff[neck + 1]; ++k) {
        const int f = lflows[k];
        if (state[f] != 1 || rate[f] >= 0.0) continue;
        rate[f] = level;
        --open;
        for (int j = foff[f]; j < foff[f + 1]; ++j) {
          const int i = fl[j];
          cap_left[i] -= level;
          unfrozen[i] -= 1;
        }
      }
    }
    // The step: the smallest left / rate (compared by cross-multiplication, one division).
    double dt_left = 0.0, dt_rate = 0.0;
    bool first = true;
    for (size_t r = 0; r < nrun; ++r) {
      const int f = running[r];
      const double l = left[f], rt = rate[f];
      if (first || l * dt_rate < dt_left * rt) {
        dt_left = l;
        dt_rate = rt;
        first = false;
      }
    }
    const double dt = first ? kDone : dt_left / dt_rate;
    t += dt;
    // Bytes moved on each link in this step (what its flows used of its capacity).
    for (size_t i = 0; i < nl; ++i)
      if (act[i] > 0) rem[i] -= (cap0[i] - cap_left[i]) * dt;
    size_t nnext = 0;
    for (size_t r = 0; r < nrun; ++r) {
      const int f = running[r];
      left[f] -= rate[f] * dt;
      // Flows within 0.1 % of the step finish together (as the simulator's RTOL does).
      if (left[f] > rate[f] * dt * 1e-3) {
        next_run[nnext++] = f;
        continue;
      }
      state[f] = 2;
      for (int k = foff[f]; k < foff[f + 1]; ++k) {
        act[fl[k]] -= 1;
        rem[fl[k]] -= left[f];
      }
      if (engines > 0) {  // the freed copy engine takes this source's next queued transfer
        const int src = psrc[flow_pair[f]];
        per_source[src] -= 1;
        const int g = src_head[src];
        if (g >= 0) {
          next_run[nnext++] = g;
          state[g] = 1;
          for (int k = foff[g]; k < foff[g + 1]; ++k) act[fl[k]] += 1;
          per_source[src] += 1;
          src_head[src] = src_next[g];
        }
      }
    }
    std::swap(running, next_run);
    nrun = nnext;
    if (limit < kDone && nrun > 0) {
      // Lower bound on what is left: the busiest link's bytes over its bandwidth or, under
      // contention, that link's flows drained smallest first at bandwidth * eta(flows left), as
      // merged_bound() does; less 0.2 % (flows within 0.1 % of a step finish early, rounding).
      double rest = 0.0;
      int hot = -1;
      for (size_t i = 0; i < nl; ++i) {
        const double x = rem[i] * net_.inv_bw[ls->touched[i]];
        if (x > rest) {
          rest = x;
          hot = static_cast<int>(i);
        }
      }
      if (hot >= 0 && model_.eta_beta > 0.0 && t + rest * (1.0 - 2e-3) < limit) {
        std::vector<double>& sz = ls->sizes_on[0];
        sz.clear();
        for (int k = loff[hot]; k < loff[hot + 1]; ++k) {
          const int f = lflows[k];
          if (state[f] != 2) sz.push_back(state[f] == 1 ? left[f] : ls->flow_bytes[f]);
        }
        std::sort(sz.begin(), sz.end());
        const double bw = net_.link_bw[ls->touched[hot]];
        double drain = 0.0;
        for (size_t i = 0; i < sz.size(); ++i) drain += sz[i] / (bw * model_.eta(static_cast<int>(sz.size() - i)));
        sz.clear();
        rest = std::max(rest, drain);
      }
      if (t + rest * (1.0 - 2e-3) >= limit) {
        t = std::max(limit, t);
        break;
      }
    }
  }
  for (size_t f = 0; f < nf; ++f) {
    ls->per_source[net_.pair_src[ls->flow_pair[f]]] = 0;
    if (engines > 0) ls->src_head[net_.pair_src[ls->flow_pair[f]]] = -1;
  }
  return t;
}

}  // namespace varipath
}  // namespace hoccl
