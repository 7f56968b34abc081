// Rooted reduce across hosts: all_reduce's pipeline (plan/allreduce_hosts.cpp) where only the
// root's host finishes. Every host reduces each share of every chunk into a partial as for
// all_reduce; the owners on the other hosts send their partials to the share's owner on the
// root's host (the root itself in the leaders form), which reduces them in host order with
// finalize, straight into the root's output (rails: into its slot, and the root copies the
// other shares out). Non-roots never write their outputs. Each remote host sends the payload
// once: (H-1) x bytes cross hosts, the minimum for a rooted reduce.
#include "plan/plan.h"

namespace hoccl {

Plan planReduceLeaders(const PlanRequest& req) { return planReductionAcrossHosts(req, false, true, "reduce/leaders"); }

Plan planReduceRails(const PlanRequest& req) { return planReductionAcrossHosts(req, true, true, "reduce/rails"); }

}  // namespace hoccl
