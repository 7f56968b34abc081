// What VarioPath's cost model across hosts (varipath/across_hosts.h) takes the network and the
// host to cost: measured once when a group spanning hosts is created, unless configured.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "backend/multihost/host_layout.h"
#include "common/plan_types.h"

namespace hoccl {

// Every rank of the group returns the same bytes: rank 0 measures (with the first rank of
// another host, over `global`) and broadcasts on `global`; every rank calls it at the same point
// of group creation. HOCCL_NET_MESSAGE_US and HOCCL_NET_LINK_MBIT, when set, replace the
// corresponding measurement (both set: nothing crosses but the broadcast); the relay's copy rate
// is HOCCL_NET_RELAY_MBYTES or the default, as rank 0 sees it. Costs ~25 ms on a
// 4 Gbit/s link: eight small round trips and one 4 MiB transfer.
NetCosts agreeNetCosts(c10d::Backend& global, const HostLayout& layout, int rank);

// "message 310 us (measured), link 0.480 GB/s (measured), relay copies 1.00 GB/s (default)",
// for HOCCL_DEBUG=INFO.
std::string describeNetCosts(const NetCosts& costs);

}  // namespace hoccl
