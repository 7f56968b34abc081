#include "varipath/across_hosts.h"

#include <algorithm>
#include <stdexcept>

namespace hoccl {
namespace varipath {
namespace {

struct Hosts {
  std::vector<int> hostOf, localIndex;
  std::vector<std::vector<int>> ranksOf;

  explicit Hosts(const std::vector<int>& of) : hostOf(of), localIndex(of.size()) {
    for (size_t r = 0; r < of.size(); ++r) {
      if (of[r] < 0) throw std::invalid_argument("varipath: a negative host index");
      if (static_cast<size_t>(of[r]) >= ranksOf.size()) ranksOf.resize(of[r] + 1);
      localIndex[r] = static_cast<int>(ranksOf[of[r]].size());
      ranksOf[of[r]].push_back(static_cast<int>(r));
    }
  }
  int count() const { return static_cast<int>(ranksOf.size()); }
  bool crosses(int s, int d) const { return hostOf[s] != hostOf[d]; }
  int relay(int srcHost, int dst) const {
    const auto& ranks = ranksOf[srcHost];
    return ranks[localIndex[dst] % ranks.size()];
  }
};

// What one form asks of each rank and each host link.
struct Load {
  std::vector<int> messages;       // per rank: cross-host messages sent plus received
  std::vector<int64_t> copied;     // per rank: bytes copied inside the host beyond the direct form
  std::vector<int64_t> linkBytes;  // per host: the larger of the bytes leaving and entering it
};

class Counter {
 public:
  Counter(const Hosts& hosts, const std::vector<int64_t>& matrix)
      : h_(hosts), m_(matrix), W_(static_cast<int>(hosts.hostOf.size())) {
    if (matrix.size() != static_cast<size_t>(W_) * W_)
      throw std::invalid_argument("varipath: the split matrix is not world x world");
    load_ = {std::vector<int>(W_, 0), std::vector<int64_t>(W_, 0), std::vector<int64_t>(h_.count(), 0)};
  }
  int64_t at(int s, int d) const { return m_[static_cast<size_t>(s) * W_ + d]; }

  void links() {
    std::vector<int64_t> out(h_.count(), 0), in(h_.count(), 0);
    for (int s = 0; s < W_; ++s)
      for (int d = 0; d < W_; ++d)
        if (h_.crosses(s, d)) {
          out[h_.hostOf[s]] += at(s, d);
          in[h_.hostOf[d]] += at(s, d);
        }
    for (int h = 0; h < h_.count(); ++h) load_.linkBytes[h] = std::max(out[h], in[h]);
  }

  void direct() {
    for (int s = 0; s < W_; ++s)
      for (int d = 0; d < W_; ++d)
        if (h_.crosses(s, d) && at(s, d) > 0) {
          ++load_.messages[s];
          ++load_.messages[d];
        }
  }

  // Every aggregated message of host h to rank d: its relay sends, d receives; the senders pack
  // their blocks, the relay receives them in the host leg and packs the message, d scatters it.
  // Same-host blocks ride the packed host leg too.
  void relay() {
    for (int h = 0; h < h_.count(); ++h)
      for (int d = 0; d < W_; ++d) {
        if (h_.hostOf[d] == h) continue;
        int64_t aggregated = 0;
        for (int s : h_.ranksOf[h]) {
          aggregated += at(s, d);
          load_.copied[s] += at(s, d);
        }
        if (aggregated == 0) continue;
        const int r = h_.relay(h, d);
        ++load_.messages[r];
        ++load_.messages[d];
        load_.copied[r] += 2 * aggregated;
        load_.copied[d] += aggregated;
      }
    for (int s = 0; s < W_; ++s)
      for (int d = 0; d < W_; ++d)
        if (!h_.crosses(s, d)) {
          load_.copied[s] += at(s, d);
          load_.copied[d] += at(s, d);
        }
  }

  double seconds(const NetCosts& c) const {
    const int messages = *std::max_element(load_.messages.begin(), load_.messages.end());
    const int64_t copied = *std::max_element(load_.copied.begin(), load_.copied.end());
    const int64_t link = *std::max_element(load_.linkBytes.begin(), load_.linkBytes.end());
    return messages * c.messageSec + static_cast<double>(link) / c.linkBytesPerSec +
           static_cast<double>(copied) / c.copyBytesPerSec;
  }

 private:
  const Hosts& h_;
  const std::vector<int64_t>& m_;
  const int W_;
  Load load_;
};

}  // namespace

int relayAcrossHosts(const std::vector<int>& hostOf, int srcHost, int dst) {
  return Hosts(hostOf).relay(srcHost, dst);
}

double estimateAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                           AllToAllHostsForm form, const NetCosts& costs) {
  if (costs.messageSec < 0 || costs.linkBytesPerSec <= 0 || costs.copyBytesPerSec <= 0)
    throw std::invalid_argument("varipath: network costs must be positive");
  const Hosts hosts(hostOf);
  Counter c(hosts, matrix);
  c.links();
  if (form == AllToAllHostsForm::Relay) c.relay();
  else c.direct();
  return c.seconds(costs);
}

AllToAllHostsForm chooseAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                                    const NetCosts& costs) {
  const double direct = estimateAcrossHosts(hostOf, matrix, AllToAllHostsForm::Direct, costs);
  const double relay = estimateAcrossHosts(hostOf, matrix, AllToAllHostsForm::Relay, costs);
  return relay < direct ? AllToAllHostsForm::Relay : AllToAllHostsForm::Direct;
}

}  // namespace varipath
}  // namespace hoccl
