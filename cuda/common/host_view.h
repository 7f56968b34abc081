// The host layout of a PlanRequest as builders across hosts (plan/) and VarioPath's cost model
// across hosts (varipath/across_hosts.cpp) use it: which ranks share a host, each rank's index on
// its host, and the rails (rail k: the ranks with local index k on every host that has more than
// k ranks, in host order; rail 0 is the host leaders). Derived from PlanRequest::hostOf alone, so
// every rank derives the same view.
#pragma once
#include <algorithm>
#include <vector>

#include "common/plan_types.h"

namespace hoccl {

struct HostView {
  std::vector<int> hostOf;                  // per rank
  std::vector<std::vector<int>> ranksOf;    // per host: its ranks, ascending
  std::vector<int> localIndex;              // per rank: position among its host's ranks
  std::vector<std::vector<int>> rails;      // per rail: its ranks, in host order
  bool even = true;                         // every host has the same number of ranks

  explicit HostView(const PlanRequest& req) : HostView(req.hostOf, req.world) {}

  // hostOf: per rank, its host (0..hosts-1); empty: all `world` ranks on one host.
  HostView(const std::vector<int>& of, int world) {
    hostOf = of.empty() ? std::vector<int>(world, 0) : of;
    const int hostCount = hostOf.empty() ? 1 : *std::max_element(hostOf.begin(), hostOf.end()) + 1;
    ranksOf.resize(hostCount);
    localIndex.resize(world);
    for (int r = 0; r < world; ++r) {
      localIndex[r] = static_cast<int>(ranksOf[hostOf[r]].size());
      ranksOf[hostOf[r]].push_back(r);
    }
    size_t most = 0;
    for (const auto& h : ranksOf) {
      most = std::max(most, h.size());
      even = even && h.size() == ranksOf[0].size();
    }
    rails.resize(most);
    for (const auto& h : ranksOf)
      for (size_t l = 0; l < h.size(); ++l) rails[l].push_back(h[l]);
  }
  int hosts() const { return static_cast<int>(ranksOf.size()); }
  int host(int rank) const { return hostOf[rank]; }
  int localSize(int host) const { return static_cast<int>(ranksOf[host].size()); }
  int leader(int host) const { return ranksOf[host][0]; }
  // The rank of `host` that stands for local index `l` of another host: its rail peer where the
  // host has one, else local index l modulo the host's size (uneven hosts).
  int railPeer(int host, int l) const { return ranksOf[host][l % localSize(host)]; }
};

}  // namespace hoccl
