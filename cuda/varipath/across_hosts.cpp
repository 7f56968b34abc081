#include "varipath/across_hosts.h"

#include <algorithm>
#include <stdexcept>

#include "common/host_view.h"

namespace hoccl {
namespace varipath {
namespace {

// What one form asks of each rank and each host link.
struct Load {
  std::vector<int> messages;       // per rank: cross-host messages sent plus received
  std::vector<int64_t> copied;     // per rank: bytes copied inside the host beyond the direct form
  std::vector<int64_t> linkBytes;  // per host: the larger of the bytes leaving and entering it
};

class Counter {
 public:
  Counter(const HostView& hosts, const std::vector<int64_t>& matrix)
      : h_(hosts), m_(matrix), W_(static_cast<int>(hosts.hostOf.size())) {
    load_ = {std::vector<int>(W_, 0), std::vector<int64_t>(W_, 0), std::vector<int64_t>(h_.hosts(), 0)};
  }
  int64_t at(int s, int d) const { return m_[static_cast<size_t>(s) * W_ + d]; }

  void links() {
    std::vector<int64_t> out(h_.hosts(), 0), in(h_.hosts(), 0);
    for (int s = 0; s < W_; ++s)
      for (int d = 0; d < W_; ++d)
        if (crosses(s, d)) {
          out[h_.hostOf[s]] += at(s, d);
          in[h_.hostOf[d]] += at(s, d);
        }
    for (int h = 0; h < h_.hosts(); ++h) load_.linkBytes[h] = std::max(out[h], in[h]);
  }

  void direct() {
    for (int s = 0; s < W_; ++s)
      for (int d = 0; d < W_; ++d)
        if (crosses(s, d) && at(s, d) > 0) {
          ++load_.messages[s];
          ++load_.messages[d];
        }
  }

  // Every aggregated message of host h to rank d: its relay sends, d receives; the senders pack
  // their blocks, the relay receives them in the host leg and packs the message, d scatters it.
  // Same-host blocks ride the packed host leg too.
  void relay() {
    for (int h = 0; h < h_.hosts(); ++h)
      for (int d = 0; d < W_; ++d) {
        if (h_.hostOf[d] == h) continue;
        int64_t aggregated = 0;
        for (int s : h_.ranksOf[h]) {
          aggregated += at(s, d);
          load_.copied[s] += at(s, d);
        }
        if (aggregated == 0) continue;
        const int r = h_.railPeer(h, h_.localIndex[d]);
        ++load_.messages[r];
        ++load_.messages[d];
        load_.copied[r] += 2 * aggregated;
        load_.copied[d] += aggregated;
      }
    for (int s = 0; s < W_; ++s)
      for (int d = 0; d < W_; ++d)
        if (!crosses(s, d)) {
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
  bool crosses(int s, int d) const { return h_.hostOf[s] != h_.hostOf[d]; }

  const HostView& h_;
  const std::vector<int64_t>& m_;
  const int W_;
  Load load_;
};

}  // namespace

namespace {

HostView checkedView(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix, const NetCosts& costs) {
  if (costs.messageSec < 0 || costs.linkBytesPerSec <= 0 || costs.copyBytesPerSec <= 0)
    throw std::invalid_argument("varipath: network costs must be positive");
  for (int h : hostOf)
    if (h < 0) throw std::invalid_argument("varipath: a negative host index");
  if (matrix.size() != hostOf.size() * hostOf.size())
    throw std::invalid_argument("varipath: the split matrix is not world x world");
  return HostView(hostOf, static_cast<int>(hostOf.size()));
}

double estimate(const HostView& hosts, const std::vector<int64_t>& matrix, AllToAllHostsForm form,
                const NetCosts& costs) {
  Counter c(hosts, matrix);
  c.links();
  if (form == AllToAllHostsForm::Relay) c.relay();
  else c.direct();
  return c.seconds(costs);
}

}  // namespace

double estimateAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                           AllToAllHostsForm form, const NetCosts& costs) {
  return estimate(checkedView(hostOf, matrix, costs), matrix, form, costs);
}

AllToAllHostsForm chooseAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                                    const NetCosts& costs) {
  const HostView hosts = checkedView(hostOf, matrix, costs);
  const double direct = estimate(hosts, matrix, AllToAllHostsForm::Direct, costs);
  const double relay = estimate(hosts, matrix, AllToAllHostsForm::Relay, costs);
  return relay < direct ? AllToAllHostsForm::Relay : AllToAllHostsForm::Direct;
}

std::vector<TransferPhase> phasesAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                                             AllToAllHostsForm form) {
  const HostView hv = checkedView(hostOf, matrix, NetCosts{});
  const int W = static_cast<int>(hostOf.size());
  const bool relay = form == AllToAllHostsForm::Relay;
  auto at = [&](int s, int d) { return matrix[static_cast<size_t>(s) * W + d]; };
  TransferPhase own, legs, crossing;
  for (int r = 0; r < W; ++r)
    if (at(r, r) > 0) own.push_back({r, r, at(r, r)});
  for (int s = 0; s < W; ++s)
    for (int d = 0; d < W; ++d) {
      if (s == d || at(s, d) == 0) continue;
      const int to = relay && hv.host(s) != hv.host(d) ? hv.railPeer(hv.host(s), hv.localIndex[d]) : d;
      if (to != s) legs.push_back({s, to, at(s, d)});
    }
  if (relay)
    for (int d = 0; d < W; ++d)
      for (int h = 0; h < hv.hosts(); ++h) {
        if (h == hv.host(d)) continue;
        int64_t bytes = 0;
        for (int s : hv.ranksOf[h]) bytes += at(s, d);
        if (bytes > 0) crossing.push_back({hv.railPeer(h, hv.localIndex[d]), d, bytes});
      }
  std::vector<TransferPhase> phases{std::move(own), std::move(legs)};
  if (relay) phases.push_back(std::move(crossing));
  return phases;
}

}  // namespace varipath
}  // namespace hoccl
