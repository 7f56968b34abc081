// Lower bounds of the cost model's costs (cost_model.h): per plan (the plan floor), per
// candidate (merged_bound(), exact where no link is shared), and the peer rounds' early-stop
// floors.  The scheduler ranks candidates by these bounds and runs the event model only for
// those whose bound can still beat the best cost found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "varipath/cost_model.h"
#include "varipath/decomposition.h"
#include "varipath/network.h"

namespace hoccl {
namespace varipath {

// Pairs crossing the most loaded links (relative to capacity) are served first: they decide
// the completion time, so every phase should keep those links busy.  Returns each pair's
// weight; *load gets every link's bytes and *bound_s the busiest link's time.
std::vector<double> pair_urgency(const Network& net, const std::vector<int64_t>& demand, double* bound_s,
                                 std::vector<double>* load);

// The most loaded link, for plan_floor(), floor_at() and merged_bound()'s early stop.
struct HotLink {
  double load = 0.0, biggest = 0.0, bw = 1.0, bound_s = 0.0;
  int pairs = 0;
  int link = -1;
  const std::vector<double>* loads = nullptr;  // every link's bytes (the whole demand)
};

// Per-round bytes of the peer-round decomposition on the most loaded links (see peer_loads()),
// for merged_bound()'s early stop.
struct PeerLoads {
  std::vector<int> links;      // the links kept
  size_t phases = 0;
  std::vector<double> bytes;   // link-major: bytes[c * phases + phase]
};

class Bounds {
 public:
  Bounds(const Network& net, const ModelTables& model) : net_(net), model_(model) {}

  // Lower bound of Costing::merged_cost() (merged_bound.cpp).  stop / stop_inexact: once the
  // bound provably passes stop (stop_inexact once a group is known inexact), +inf is returned.
  double merged_bound(const Decomposition& dec, int merge, LinkScratch* ls, bool* exact, uint64_t* signature,
                      std::vector<double>* group_bounds = nullptr, const HotLink* hot = nullptr,
                      double stop = std::numeric_limits<double>::infinity(),
                      double stop_inexact = std::numeric_limits<double>::infinity(),
                      const std::vector<double>* floor_prefix = nullptr) const;
  double plan_floor(const std::vector<int64_t>& demand, const std::vector<double>& load, double bound_s,
                    HotLink* hot) const;
  double floor_at(const HotLink& hot, int phases, double stop) const;
  void peer_loads(const std::vector<int64_t>& demand, const Decomposition& dec, const std::vector<double>& load,
                  double bound_s, PeerLoads* out) const;
  // Upper bounds of the unfused peer-round bound: a cheap one, and a tighter one that walks
  // the transfers.
  double peer_upper_simple(const Decomposition& dec) const;
  double peer_upper_rounds(const Decomposition& dec, LinkScratch* ls) const;
  void peer_floor_prefix(const PeerLoads& pl, size_t phases, int merge, std::vector<double>* prefix) const;
  bool worth_fusing(int phases, double unfused_bound) const;
  bool affordable(const Decomposition& dec, int merge) const;

 private:
  const Network& net_;
  const ModelTables& model_;
};

}  // namespace varipath
}  // namespace hoccl
