#include "backend/multihost/host_layout.h"

#include <algorithm>

namespace hoccl {

HostLayout::HostLayout(HostTable t) : table(std::move(t)) {
  localIndex.assign(table.hostOf.size(), 0);
  size_t widest = 0;
  for (const auto& ranks : table.ranksOf) widest = std::max(widest, ranks.size());
  railRanks.resize(widest);
  for (const auto& ranks : table.ranksOf) {
    even = even && ranks.size() == widest;
    for (size_t l = 0; l < ranks.size(); ++l) {
      localIndex[ranks[l]] = static_cast<int>(l);
      railRanks[l].push_back(ranks[l]);
    }
  }
}

int HostLayout::railRank(int rank) const {
  const auto& rail = railRanks[localIndex[rank]];
  return static_cast<int>(std::find(rail.begin(), rail.end(), rank) - rail.begin());
}

std::string HostLayout::hostName(int host) const {
  const std::string& id = table.names[host];
  return id.substr(0, id.find("/boot="));
}

std::string HostLayout::describeHost(int host) const {
  std::string s = "host '" + hostName(host) + "' (rank" + (localSize(host) > 1 ? "s " : " ");
  for (size_t i = 0; i < table.ranksOf[host].size(); ++i)
    s += (i ? ", " : "") + std::to_string(table.ranksOf[host][i]);
  return s + ")";
}

}  // namespace hoccl
