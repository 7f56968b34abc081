// Decompositions into plans (see decomposition.h).
#include "varipath/decomposition.h"

#include <algorithm>

namespace hoccl {
namespace varipath {

std::vector<Phase> materialize(const Network& net, const std::vector<std::vector<int>>& chans,
                               const std::vector<std::vector<int64_t>>& bytes, int merge) {
  std::vector<Phase> out;
  out.reserve((chans.size() + merge - 1) / merge);
  if (merge == 1) {  // every decomposition names a pair at most once per channel phase
    for (size_t i = 0; i < chans.size(); ++i) {
      Phase ph;
      ph.reserve(chans[i].size());
      for (size_t k = 0; k < chans[i].size(); ++k) {
        const int p = chans[i][k];
        ph.push_back(Transfer{static_cast<int32_t>(net.pair_src[p]), static_cast<int32_t>(net.pair_dst[p]), bytes[i][k]});
      }
      out.push_back(std::move(ph));
    }
    return out;
  }
  std::vector<int> slot(static_cast<size_t>(net.n) * net.n, -1);
  for (size_t start = 0; start < chans.size(); start += merge) {
    Phase ph;
    const size_t stop = std::min(chans.size(), start + static_cast<size_t>(merge));
    size_t most = 0;  // transfers before merging repeated pairs: enough room
    for (size_t i = start; i < stop; ++i) most += chans[i].size();
    ph.reserve(most);
    for (size_t i = start; i < stop; ++i)
      for (size_t k = 0; k < chans[i].size(); ++k) {
        const int p = chans[i][k];
        if (slot[p] < 0) {
          slot[p] = static_cast<int>(ph.size());
          ph.push_back(Transfer{static_cast<int32_t>(net.pair_src[p]), static_cast<int32_t>(net.pair_dst[p]), 0});
        }
        ph[slot[p]].bytes += bytes[i][k];
      }
    for (const Transfer& t : ph) slot[t.src * net.n + t.dst] = -1;
    out.push_back(std::move(ph));
  }
  return out;
}

}  // namespace varipath
}  // namespace hoccl
