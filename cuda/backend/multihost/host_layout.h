// Where each rank of a multi-host group sits, derived from the published host table (never from
// rank // ranks-per-host): its host, its index on that host, and the rail it belongs to. Rail k
// is the ranks with local index k on every host that has more than k ranks; rail 0 is the host
// leaders. Every rank computes the same layout from the same table.
#pragma once
#include <string>
#include <vector>

#include "backend/host_table.h"

namespace hoccl {

struct HostLayout {
  HostTable table;
  std::vector<int> localIndex;            // per rank: position among its host's ranks
  std::vector<std::vector<int>> railRanks;  // per rail: its ranks, in host order
  bool even = true;                       // every host has the same number of ranks

  explicit HostLayout(HostTable t);
  int hosts() const { return table.hosts(); }
  int hostOf(int rank) const { return table.hostOf[rank]; }
  int localSize(int host) const { return static_cast<int>(table.ranksOf[host].size()); }
  // Position of `rank` within its rail's group.
  int railRank(int rank) const;
  // The short name users know a host by (its hostname, or HOCCL_HOSTNAME).
  std::string hostName(int host) const;
  // "host 'b' (ranks 2, 3)".
  std::string describeHost(int host) const;
};

}  // namespace hoccl
