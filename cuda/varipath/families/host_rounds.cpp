// Host rounds: one queue-ordered phase for several hosts under copy-engine queues.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "varipath/families/registry.h"
#include "varipath/scheduler.h"
#include "varipath/tuning.h"

namespace hoccl {
namespace varipath {

namespace {

// Host rounds: one phase; source s queues its transfers to the other hosts first by host offset
// (host(s) + 1, + 2, ...), within a host by local-index offset (so the sources of one host start
// on different GPUs of the target host), with its same-host transfers (by local-index offset)
// spread evenly among them (Bresenham: one after every R / L remote ones).  With copy-engine
// queues this keeps every source on one remote and one local transfer most of the time, and the
// hosts' NIC pairs evenly loaded.
Decomposition host_rounds_decomposition(const Network& net, const std::vector<int64_t>& demand) {
  Decomposition dec;
  dec.family = kHostRounds;
  dec.unique = true;
  std::vector<int> phase;
  std::vector<int64_t> bytes;
  std::vector<std::pair<int64_t, int>> remote, local;  // (sort key, destination)
  for (int s = 0; s < net.n; ++s) {
    remote.clear();
    local.clear();
    const int hs = net.host_of[s];
    for (int d = 0; d < net.n; ++d) {
      if (d == s || demand[static_cast<size_t>(s) * net.n + d] <= 0) continue;
      const int hd = net.host_of[d];
      const int64_t within = (net.local_index[d] - net.local_index[s] + 2 * net.host_size[hd]) % net.host_size[hd];
      if (hd == hs)
        local.emplace_back(within, d);
      else
        remote.emplace_back(static_cast<int64_t>((hd - hs + net.hosts) % net.hosts) * net.n + within, d);
    }
    std::sort(remote.begin(), remote.end());
    std::sort(local.begin(), local.end());
    const int64_t r = static_cast<int64_t>(remote.size()), l = static_cast<int64_t>(local.size());
    int64_t acc = 0;
    size_t next_local = 0;
    auto emit = [&](int d) {
      phase.push_back(s * net.n + d);
      bytes.push_back(demand[static_cast<size_t>(s) * net.n + d]);
    };
    for (const auto& rd : remote) {
      emit(rd.second);
      acc += l;
      while (acc >= r && next_local < local.size()) {
        emit(local[next_local++].second);
        acc -= r;
      }
    }
    for (; next_local < local.size(); ++next_local) emit(local[next_local].second);
  }
  dec.pairs.push_back(std::move(phase));
  dec.bytes.push_back(std::move(bytes));
  return dec;
}

}  // namespace

// Host rounds are one phase whose worth lies in its queue order, which only the event model
// sees: offered on several hosts under copy-engine queues up to kMaxSimulatedRanks ranks, and
// always simulated (like the baselines' own plans).
bool build_host_rounds(PlanSearch* s) {
  if (s->net.hosts > 1 && s->model.copy_engines > 0 && s->net.n <= kMaxSimulatedRanks)
    s->decs.push_back(host_rounds_decomposition(s->net, s->demand));
  return false;
}

}  // namespace varipath
}  // namespace hoccl
