// The network a VarioPath scheduler plans over: the GPUs, the offline catalog's channels, the
// directed links with their bandwidths, each pair's path, and the hosts.  Set up by the
// Scheduler's constructor and setters, read-only while planning.  Pair ids: p = src * n + dst.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hoccl {
namespace varipath {

// "(src, dst)" of pair p, for error messages.
std::string pair_name(int p, int n);

struct LinkSpan {
  const int* b;
  const int* e;
  const int* begin() const { return b; }
  const int* end() const { return e; }
};

struct Network {
  // n GPUs; channels: contention-free sets of (src,dst) pairs over 0..n-1, fully expanded.
  // The link model starts as one send and one receive port per GPU at the per-pair rate.
  Network(int n, std::vector<std::vector<std::pair<int, int>>> channels, double phase_latency_s,
          double bandwidth_Bps);
  // Real directed links (bandwidth in bytes/s) and each pair's link indices (empty for s == d).
  void set_links(std::vector<double> bw, std::vector<std::vector<int>> paths);
  // The host of every GPU (0-based, n entries).
  void set_hosts(std::vector<int> host_of_gpu);

  LinkSpan links_of(int p) const { return {pl.data() + pl_off[p], pl.data() + pl_off[p + 1]}; }

  int n;
  double latency_s;   // fixed start cost of one phase
  double rate_Bps;    // per-pair rate the catalog's channels assume
  std::vector<std::vector<int>> chan_pairs;   // channel -> pair ids (s*n+d), sorted
  std::vector<std::vector<int>> pair_chans;   // pair id -> channels containing it
  std::vector<double> link_bw;                // directed link capacities
  std::vector<std::vector<int>> pair_links;   // pair id -> link indices
  std::vector<int> pl_off, pl;                // the same, flattened (pair p: pl[pl_off[p]..pl_off[p+1]))
  std::vector<int> lp_off, lp;                // link l -> pairs crossing it: lp[lp_off[l]..lp_off[l+1])
  std::vector<int> pair_src, pair_dst;        // pair id -> source, destination
  std::vector<double> pair_rate;              // full rate of each pair running alone
  std::vector<double> pair_min_bw;            // narrowest link on each pair's path
  std::vector<int> pair_path8;                // pair id -> its links padded to 8 (link count as pad), when <= 8
  std::vector<uint64_t> pair_mask;            // pair id -> bit set of its links (when there are <= 64)
  std::vector<int> round_flows;               // link -> most pairs of one peer round (s -> s+k mod n) crossing it
  std::vector<double> inv_bw;                 // 1 / link bandwidth
  std::vector<int> host_of, host_size, local_index;  // set_hosts(): host, its GPU count, index in it
  int hosts = 1;

 private:
  void index_links();
};

}  // namespace varipath
}  // namespace hoccl
