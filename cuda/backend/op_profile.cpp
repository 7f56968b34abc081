#include "backend/op_profile.h"

#include <cstdio>

namespace hoccl {

void OpProfile::record(const std::string& op, const std::string& algo, int64_t bytes, double totalUs,
                       const PhaseTimes& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  Sum& s = sums_[std::make_tuple(op, algo, bytes)];
  ++s.count;
  s.totalUs += totalUs;
  s.phases.barrierUs += t.barrierUs;
  s.phases.barriers += t.barriers;
  s.phases.copyUs += t.copyUs;
  s.phases.readUs += t.readUs;
  s.phases.reduceUs += t.reduceUs;
}

std::string OpProfile::report(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  char line[512];
  for (const auto& [key, s] : sums_) {
    const double n = static_cast<double>(s.count);
    const PhaseTimes& p = s.phases;
    const double other = (s.totalUs - p.barrierUs - p.copyUs - p.readUs - p.reduceUs) / n;
    std::snprintf(line, sizeof line,
                  "[hoccl rank %d] %s %s bytes=%lld ops=%llu mean %.1f us: barriers %.1f (%.1f per op), "
                  "copies %.1f, peer reads %.1f, reductions %.1f, other %.1f\n",
                  rank, std::get<0>(key).c_str(), std::get<1>(key).c_str(), static_cast<long long>(std::get<2>(key)),
                  static_cast<unsigned long long>(s.count), s.totalUs / n, p.barrierUs / n, p.barriers / n,
                  p.copyUs / n, p.readUs / n, p.reduceUs / n, other);
    out += line;
  }
  return out;
}

}  // namespace hoccl
