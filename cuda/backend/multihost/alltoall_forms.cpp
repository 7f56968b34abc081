#include "backend/multihost/alltoall_forms.h"

#include <algorithm>
#include <stdexcept>

namespace hoccl {

AlltoallChoice alltoallChoice(const std::string& setting) {
  if (setting == "direct") return AlltoallChoice::Direct;
  if (setting == "rail") return AlltoallChoice::Rail;
  if (setting == "auto") return AlltoallChoice::Auto;
  throw std::invalid_argument("HOCCL_MULTIHOST_ALLTOALL=" + setting + ": expected auto, direct or rail");
}

int relayFor(const HostLayout& layout, int srcHost, int dst) {
  const auto& ranks = layout.table.ranksOf[srcHost];
  return ranks[layout.localIndex[dst] % ranks.size()];
}

namespace {

// What one form asks of each rank and each host link.
struct Load {
  std::vector<int> messages;        // per rank: cross-host messages sent plus received
  std::vector<int64_t> copied;      // per rank: bytes copied inside the host beyond the direct form
  std::vector<int64_t> linkBytes;   // per host: the larger of the bytes leaving and entering it
};

bool crosses(const HostLayout& layout, int s, int d) { return layout.hostOf(s) != layout.hostOf(d); }

void countLinks(const HostLayout& layout, const SplitMatrix& m, Load& load) {
  std::vector<int64_t> out(layout.hosts(), 0), in(layout.hosts(), 0);
  for (int s = 0; s < m.world; ++s)
    for (int d = 0; d < m.world; ++d)
      if (crosses(layout, s, d)) {
        out[layout.hostOf(s)] += m.at(s, d);
        in[layout.hostOf(d)] += m.at(s, d);
      }
  for (int h = 0; h < layout.hosts(); ++h) load.linkBytes[h] = std::max(out[h], in[h]);
}

void countDirect(const HostLayout& layout, const SplitMatrix& m, Load& load) {
  for (int s = 0; s < m.world; ++s)
    for (int d = 0; d < m.world; ++d)
      if (crosses(layout, s, d) && m.at(s, d) > 0) {
        ++load.messages[s];
        ++load.messages[d];
      }
}

// Every aggregated message of host h to rank d: its relay sends, d receives; the relay packs
// it from what it gathered, the senders packed it first, d scatters it.
void countRail(const HostLayout& layout, const SplitMatrix& m, Load& load) {
  for (int h = 0; h < layout.hosts(); ++h)
    for (int d = 0; d < m.world; ++d) {
      if (layout.hostOf(d) == h) continue;
      int64_t aggregated = 0;
      for (int s : layout.table.ranksOf[h]) {
        aggregated += m.at(s, d);
        load.copied[s] += m.at(s, d);  // the sender's pack
      }
      if (aggregated == 0) continue;
      const int relay = relayFor(layout, h, d);
      ++load.messages[relay];
      ++load.messages[d];
      load.copied[relay] += 2 * aggregated;  // received in the host leg, packed into the message
      load.copied[d] += aggregated;          // scattered into the output
    }
  // Same-host blocks ride the packed host leg too: packed by the sender, unpacked by the receiver.
  for (int s = 0; s < m.world; ++s)
    for (int d = 0; d < m.world; ++d)
      if (!crosses(layout, s, d)) {
        load.copied[s] += m.at(s, d);
        load.copied[d] += m.at(s, d);
      }
}

}  // namespace

double estimateSeconds(const HostLayout& layout, const SplitMatrix& m, AlltoallForm form,
                       const AlltoallCosts& costs) {
  Load load{std::vector<int>(m.world, 0), std::vector<int64_t>(m.world, 0),
            std::vector<int64_t>(layout.hosts(), 0)};
  countLinks(layout, m, load);
  if (form == AlltoallForm::Direct)
    countDirect(layout, m, load);
  else
    countRail(layout, m, load);
  const int messages = *std::max_element(load.messages.begin(), load.messages.end());
  const int64_t copied = *std::max_element(load.copied.begin(), load.copied.end());
  const int64_t link = *std::max_element(load.linkBytes.begin(), load.linkBytes.end());
  return messages * costs.messageSec + static_cast<double>(link) / costs.linkBytesPerSec +
         static_cast<double>(copied) / costs.copyBytesPerSec;
}

AlltoallForm chooseForm(const HostLayout& layout, const SplitMatrix& m, const AlltoallCosts& costs) {
  const double direct = estimateSeconds(layout, m, AlltoallForm::Direct, costs);
  const double rail = estimateSeconds(layout, m, AlltoallForm::Rail, costs);
  return rail < direct ? AlltoallForm::Rail : AlltoallForm::Direct;
}

}  // namespace hoccl
