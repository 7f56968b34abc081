// The plan families' table (see registry.h).
#include "varipath/families/registry.h"

#include "varipath/scheduler.h"

namespace hoccl {
namespace varipath {

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      // name          code              candidate bit     bounded first  builder
      {"link_greedy", kLinkGreedy, kLinkGreedy, true, build_link_greedy},
      {"peer_split", kSplitPeer, kLinkGreedy, true, build_split_peer},
      {"channels", kCatalogChannels, kCatalogChannels, false, build_catalog_channels},
      {"peer_rounds", kPeerRounds, kPeerRounds, false, build_peer_rounds},
      {"direct", kDirect, kDirect, false, build_direct},
      {"host_rounds", kHostRounds, kHostRounds, false, build_host_rounds},
      {"time_share", kTimeShare, kTimeShare, false, build_time_share},
  };
  return table;
}

const char* family_name(int code) {
  for (const Family& f : families())
    if (f.code == code) return f.name;
  return "none";
}

int family_bits() {
  int bits = 0;
  for (const Family& f : families()) bits |= f.candidate_bit;
  return bits;
}

}  // namespace varipath
}  // namespace hoccl
