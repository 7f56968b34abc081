#include "backend/multihost/alltoall_forms.h"

#include <stdexcept>

#include "varipath/across_hosts.h"

namespace hoccl {

AllToAllHostsForm alltoallChoice(const std::string& setting) {
  if (setting == "direct") return AllToAllHostsForm::Direct;
  if (setting == "rail") return AllToAllHostsForm::Relay;
  if (setting == "auto") return AllToAllHostsForm::Auto;
  throw std::invalid_argument("HOCCL_MULTIHOST_ALLTOALL=" + setting + ": expected auto, direct or rail");
}

int relayFor(const HostLayout& layout, int srcHost, int dst) {
  const auto& ranks = layout.table.ranksOf[srcHost];
  return ranks[layout.localIndex[dst] % ranks.size()];
}

AllToAllHostsForm chooseForm(AllToAllHostsForm forced, const HostLayout& layout, const SplitMatrix& m,
                             const NetCosts& costs) {
  if (forced != AllToAllHostsForm::Auto) return forced;
  return varipath::chooseAcrossHosts(layout.table.hostOf, m.bytes, costs);
}

}  // namespace hoccl
