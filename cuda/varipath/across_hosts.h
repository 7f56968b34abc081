// VarioPath's forms of all_to_all across hosts and the cost model that picks one per call.
//
// direct: every cross-host block goes point to point from its sender's input to its receiver's
//   output, one network message per non-empty cross-host pair.
// relay:  inside each host, every rank first hands the blocks for remote rank d to its host's
//   relay for d (d's rail peer there: the rank whose local index is d's, modulo the host's size);
//   each relay sends one aggregated message per destination, which scatters it into its output.
//   One message per remote host instead of one per remote rank, for copies inside the hosts.
//
// A form's estimate: the network engine's per-message cost times the most messages any rank
// sends plus receives, the busiest host link's bytes over the link rate, and the most bytes any
// rank copies inside its host over the copy rate. Both the estimate and the choice are functions
// of the host layout, the split matrix and the costs, which every rank holds alike after the
// split exchange, so every rank picks the same form.
#pragma once
#include <cstdint>
#include <vector>

#include "common/plan_types.h"

namespace hoccl {
namespace varipath {

// Estimated seconds of `form` (Direct or Relay) for matrix[s * W + d] (bytes s sends to d).
double estimateAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                           AllToAllHostsForm form, const NetCosts& costs);

// The cheaper form; Direct on a tie (fewer copies).
AllToAllHostsForm chooseAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                                    const NetCosts& costs);

// The transfers `form` makes, as phases of (src, dst, bytes): every rank's own block first (as on
// one host), then direct: every other non-empty pair; relay: the host legs (same-host pairs, and
// each cross-host block from its sender to its relay when they differ), then one aggregated
// message per (relay, destination).
std::vector<TransferPhase> phasesAcrossHosts(const std::vector<int>& hostOf, const std::vector<int64_t>& matrix,
                                             AllToAllHostsForm form);

}  // namespace varipath
}  // namespace hoccl
