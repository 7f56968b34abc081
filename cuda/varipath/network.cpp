// The network a scheduler plans over (see network.h): validation and the link indexes.
#include "varipath/network.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace hoccl {
namespace varipath {

std::string pair_name(int p, int n) {
  return "(" + std::to_string(p / n) + ", " + std::to_string(p % n) + ")";
}

Network::Network(int gpus, std::vector<std::vector<std::pair<int, int>>> channels, double phase_latency_s,
                 double bandwidth_Bps)
    : n(gpus), latency_s(phase_latency_s), rate_Bps(bandwidth_Bps) {
  if (n < 1) throw std::invalid_argument("varipath::Scheduler: n must be >= 1, got " + std::to_string(n));
  if (!(phase_latency_s >= 0.0) || !(bandwidth_Bps > 0.0))
    throw std::invalid_argument("varipath::Scheduler: need phase_latency_s >= 0 and bandwidth_Bps > 0");
  pair_chans.assign(static_cast<size_t>(n) * n, {});
  pair_src.resize(static_cast<size_t>(n) * n);  // pair id p = s * n + d -> s, d (no division per use)
  pair_dst.resize(static_cast<size_t>(n) * n);
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      pair_src[static_cast<size_t>(s) * n + d] = s;
      pair_dst[static_cast<size_t>(s) * n + d] = d;
    }
  for (size_t c = 0; c < channels.size(); ++c) {
    std::vector<int> ids;
    for (const auto& sd : channels[c]) {
      if (sd.first < 0 || sd.first >= n || sd.second < 0 || sd.second >= n || sd.first == sd.second)
        throw std::invalid_argument("varipath::Scheduler: channel " + std::to_string(c) +
                                    " has invalid pair (" + std::to_string(sd.first) + ", " +
                                    std::to_string(sd.second) + ") for n=" + std::to_string(n));
      ids.push_back(sd.first * n + sd.second);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int p : ids) pair_chans[p].push_back(static_cast<int>(chan_pairs.size()));
    chan_pairs.push_back(std::move(ids));
  }
  // Default link model: one send and one receive port per GPU at the per-pair rate.
  std::vector<double> bw(2 * static_cast<size_t>(n), bandwidth_Bps);
  std::vector<std::vector<int>> paths(static_cast<size_t>(n) * n);
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d)
      if (s != d) paths[s * n + d] = {s, n + d};
  link_bw = std::move(bw);
  pair_links = std::move(paths);
  index_links();
}

void Network::set_links(std::vector<double> bw, std::vector<std::vector<int>> paths) {
  if (paths.size() != static_cast<size_t>(n) * n)
    throw std::invalid_argument("varipath::Scheduler::set_link_model: need n*n pair paths, got " +
                                std::to_string(paths.size()));
  for (double b : bw)
    if (!(b > 0.0)) throw std::invalid_argument("varipath::Scheduler::set_link_model: link bandwidth must be > 0");
  for (size_t p = 0; p < paths.size(); ++p)
    for (int l : paths[p])
      if (l < 0 || static_cast<size_t>(l) >= bw.size())
        throw std::invalid_argument("varipath::Scheduler::set_link_model: pair " +
                                    pair_name(static_cast<int>(p), n) + " names link " + std::to_string(l) +
                                    " out of range");
  link_bw = std::move(bw);
  pair_links = std::move(paths);
  index_links();
}

void Network::set_hosts(std::vector<int> host_of_gpu) {
  if (host_of_gpu.size() != static_cast<size_t>(n))
    throw std::invalid_argument("varipath::Scheduler::set_hosts: need one host per GPU (" + std::to_string(n) +
                                "), got " + std::to_string(host_of_gpu.size()));
  int count = 0;
  for (int h : host_of_gpu) {
    if (h < 0 || h >= n) throw std::invalid_argument("varipath::Scheduler::set_hosts: host index out of range");
    count = std::max(count, h + 1);
  }
  host_size.assign(count, 0);
  local_index.assign(n, 0);
  for (int g = 0; g < n; ++g) local_index[g] = host_size[host_of_gpu[g]]++;
  for (int h = 0; h < count; ++h)
    if (host_size[h] == 0) throw std::invalid_argument("varipath::Scheduler::set_hosts: host " + std::to_string(h) + " has no GPU");
  host_of = std::move(host_of_gpu);
  hosts = count;
}

// Full rate of each pair running alone: the narrowest link on its path (capped by the per-pair rate).
void Network::index_links() {
  pl_off.assign(pair_links.size() + 1, 0);
  pl.clear();
  pair_rate.assign(pair_links.size(), rate_Bps);
  pair_min_bw.assign(pair_links.size(), std::numeric_limits<double>::infinity());
  inv_bw.resize(link_bw.size());
  for (size_t l = 0; l < link_bw.size(); ++l) inv_bw[l] = 1.0 / link_bw[l];
  const bool masks = link_bw.size() <= 64;
  pair_mask.assign(masks ? pair_links.size() : 0, 0);
  for (size_t p = 0; p < pair_links.size(); ++p) {
    for (int l : pair_links[p]) {
      pl.push_back(l);
      pair_rate[p] = std::min(pair_rate[p], link_bw[l]);
      pair_min_bw[p] = std::min(pair_min_bw[p], link_bw[l]);
      if (masks) pair_mask[p] |= uint64_t{1} << l;
    }
    pl_off[p + 1] = static_cast<int>(pl.size());
  }
  // Link -> pairs crossing it (in pair order, a pair once per occurrence on its path).
  lp_off.assign(link_bw.size() + 1, 0);
  for (int l : pl) lp_off[l + 1] += 1;
  for (size_t l = 0; l < link_bw.size(); ++l) lp_off[l + 1] += lp_off[l];
  lp.assign(pl.size(), 0);
  std::vector<int> fill(lp_off.begin(), lp_off.end() - 1);
  for (size_t p = 0; p < pair_links.size(); ++p)
    for (int l : pair_links[p]) lp[fill[l]++] = static_cast<int>(p);
  // Per link, the most pairs one peer round puts on it (for peer_upper_simple()).
  round_flows.assign(link_bw.size(), 0);
  {
    std::vector<int> cnt(link_bw.size(), 0);
    for (int k = 1; k < n; ++k) {
      std::fill(cnt.begin(), cnt.end(), 0);
      for (int s = 0; s < n; ++s)
        for (int l : links_of(s * n + (s + k) % n)) cnt[l] += 1;
      for (size_t l = 0; l < cnt.size(); ++l) round_flows[l] = std::max(round_flows[l], cnt[l]);
    }
  }
  // Paths padded to 8 links with link index L (one past the last), when none is longer.
  size_t longest = 0;
  for (const auto& path : pair_links) longest = std::max(longest, path.size());
  pair_path8.assign(longest <= 8 ? pair_links.size() * 8 : 0, static_cast<int>(link_bw.size()));
  if (longest <= 8)
    for (size_t p = 0; p < pair_links.size(); ++p)
      for (size_t k = 0; k < pair_links[p].size(); ++k) pair_path8[p * 8 + k] = pair_links[p][k];
}

}  // namespace varipath
}  // namespace hoccl
