#include "backend/multihost/net_costs.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/config.h"

namespace hoccl {

namespace {

using Clock = std::chrono::steady_clock;

// Far above the tags ProcessGroupGloo gives its own collectives on the group (a counter from 0),
// and used only before the group runs anything.
constexpr int kProbeTag = 1 << 29;
constexpr int kRoundTrips = 8;
constexpr int64_t kRateProbeBytes = 4 << 20;

double seconds(Clock::time_point from) { return std::chrono::duration<double>(Clock::now() - from).count(); }

void send(c10d::Backend& g, at::Tensor t, int peer) {
  std::vector<at::Tensor> v{std::move(t)};
  g.send(v, peer, kProbeTag)->wait();
}

void recv(c10d::Backend& g, at::Tensor t, int peer) {
  std::vector<at::Tensor> v{std::move(t)};
  g.recv(v, peer, kProbeTag)->wait();
}

// The per-message cost is the median round trip of an 8-byte message, not half the fastest: in
// an op a message costs the engine's work at both ends while both are busy, and ops meet the
// scheduling the slower trips did. On the 2-core VM's namespaced hosts the fastest trip took
// 114-128 us and the median 133-210 us; with the cost at the median, VarioPath picks the form
// that was fastest for skewed all_to_all at 72 KB (the relay), 1.2 MB and 14 MB per rank
// (direct, in three runs of four), where half the fastest (~50 us) picked direct at 72 KB, 1.2x
// slower.
// Then one large message and a small reply: the link's rate from what that took beyond the
// fastest round trip. The peer mirrors each step (probePeer).
std::pair<double, double> probeMeasurer(c10d::Backend& g, int peer, bool wantLink) {
  at::Tensor small = at::zeros({8}, at::kByte);
  std::vector<double> trips;
  for (int i = 0; i < kRoundTrips; ++i) {
    const auto t0 = Clock::now();
    send(g, small, peer);
    recv(g, small, peer);
    trips.push_back(seconds(t0));
  }
  std::sort(trips.begin(), trips.end());
  const double best = trips.front(), median = trips[trips.size() / 2];
  double rate = 0;
  if (wantLink) {
    at::Tensor big = at::zeros({kRateProbeBytes}, at::kByte);
    send(g, small, peer);  // warms the connection's buffers for the large message
    recv(g, small, peer);
    const auto t0 = Clock::now();
    send(g, big, peer);
    recv(g, small, peer);
    const double beyond = std::max(seconds(t0) - best, 1e-6);
    rate = kRateProbeBytes / beyond;
  }
  return {median, rate};
}

void probePeer(c10d::Backend& g, int measurer, bool wantLink) {
  at::Tensor small = at::zeros({8}, at::kByte);
  for (int i = 0; i < kRoundTrips; ++i) {
    recv(g, small, measurer);
    send(g, small, measurer);
  }
  if (!wantLink) return;
  at::Tensor big = at::zeros({kRateProbeBytes}, at::kByte);
  recv(g, small, measurer);
  send(g, small, measurer);
  recv(g, big, measurer);
  send(g, small, measurer);
}

}  // namespace

NetCosts agreeNetCosts(c10d::Backend& global, const HostLayout& layout, int rank) {
  const int64_t messageUs = config::integer("HOCCL_NET_MESSAGE_US", 0, 0);
  const int64_t linkMbit = config::integer("HOCCL_NET_LINK_MBIT", 0, 0);
  const int64_t relayMbytes = config::integer("HOCCL_NET_RELAY_MBYTES", 0, 0);
  // Rank 0 measures with the first rank of the first other host.
  int peer = -1;
  for (int h = 0; h < layout.hosts() && peer < 0; ++h)
    if (h != layout.hostOf(0)) peer = layout.table.ranksOf[h][0];
  const bool measure = peer >= 0 && (messageUs == 0 || linkMbit == 0);
  at::Tensor agreed = at::zeros({3}, at::kDouble);
  if (rank == 0) {
    double message = messageUs * 1e-6, link = linkMbit * 1e6 / 8;
    if (measure) {
      auto [m, l] = probeMeasurer(global, peer, linkMbit == 0);
      if (messageUs == 0) message = m;
      if (linkMbit == 0) link = l;
    }
    auto* v = agreed.data_ptr<double>();
    v[0] = message;
    v[1] = link;
    v[2] = relayMbytes > 0 ? relayMbytes * 1e6 : NetCosts{}.copyBytesPerSec;
  } else if (measure && rank == peer) {
    probePeer(global, 0, linkMbit == 0);
  }
  std::vector<at::Tensor> t{agreed};
  c10d::BroadcastOptions o;
  o.rootRank = 0;
  global.broadcast(t, o)->wait();
  const auto* v = agreed.data_ptr<double>();
  NetCosts c;
  c.messageSec = v[0];
  c.linkBytesPerSec = v[1];
  c.copyBytesPerSec = v[2];  // configured or the default (plan_types.h says why it is not measured)
  return c;
}

std::string describeNetCosts(const NetCosts& c) {
  const bool messageSet = config::isSet("HOCCL_NET_MESSAGE_US"), linkSet = config::isSet("HOCCL_NET_LINK_MBIT");
  const bool relaySet = config::isSet("HOCCL_NET_RELAY_MBYTES");
  char line[220];
  std::snprintf(line, sizeof line, "message %.0f us (%s), link %.3f GB/s (%s), relay copies %.2f GB/s (%s)",
                c.messageSec * 1e6, messageSet ? "HOCCL_NET_MESSAGE_US" : "measured", c.linkBytesPerSec / 1e9,
                linkSet ? "HOCCL_NET_LINK_MBIT" : "measured", c.copyBytesPerSec / 1e9,
                relaySet ? "HOCCL_NET_RELAY_MBYTES" : "default");
  return line;
}

}  // namespace hoccl
