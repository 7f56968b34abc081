// _C.build_plan: a PlanRequest as a dict in, the Plan that buildPlan() makes for it as a dict out
// (plan/plan.h). Keys are the PlanRequest fields in snake_case; steps and locations keep the
// names of common/plan_types.h in lower case.
#include "python/plan_bindings.h"

#include <pybind11/stl.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "plan/plan.h"

namespace py = pybind11;
using hoccl::Loc;
using hoccl::OpKind;
using hoccl::Plan;
using hoccl::PlanRequest;
using hoccl::Scope;
using hoccl::Space;
using hoccl::Step;

namespace {

const std::map<std::string, OpKind>& opKinds() {
  static const std::map<std::string, OpKind> kinds = {
      {"all_reduce", OpKind::AllReduce}, {"all_gather", OpKind::AllGather},
      {"reduce_scatter", OpKind::ReduceScatter}, {"broadcast", OpKind::Broadcast},
      {"reduce", OpKind::Reduce}, {"gather", OpKind::Gather},
      {"scatter", OpKind::Scatter}, {"all_to_all", OpKind::AllToAll},
      {"barrier", OpKind::Barrier}};
  return kinds;
}

template <typename T>
T field(const py::handle& value, const std::string& key) {
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    throw py::value_error("build_plan: request key '" + key + "' has the wrong type (" +
                          std::string(py::str(py::type::of(value))) + ")");
  }
}

PlanRequest requestFrom(const py::dict& d) {
  PlanRequest req;
  bool haveKind = false;
  for (const auto& item : d) {
    const std::string key = field<std::string>(item.first, "<key>");
    const py::handle v = item.second;
    if (key == "kind") {
      const std::string name = field<std::string>(v, key);
      auto it = opKinds().find(name);
      if (it == opKinds().end()) throw py::value_error("build_plan: unknown kind '" + name + "'");
      req.kind = it->second;
      haveKind = true;
    } else if (key == "rank") req.rank = field<int>(v, key);
    else if (key == "world") req.world = field<int>(v, key);
    else if (key == "root") req.root = field<int>(v, key);
    else if (key == "elem_size") req.elemSize = field<int64_t>(v, key);
    else if (key == "bytes") req.bytes = field<int64_t>(v, key);
    else if (key == "slot_bytes") req.slotBytes = field<int64_t>(v, key);
    else if (key == "one_shot_max_bytes") req.oneShotMaxBytes = field<int64_t>(v, key);
    else if (key == "cross_memory") req.crossMemory = field<bool>(v, key);
    else if (key == "cross_memory_min_bytes") req.crossMemoryMinBytes = field<int64_t>(v, key);
    else if (key == "all_reduce_direct_read_max_bytes") req.allReduceDirectReadMaxBytes = field<int64_t>(v, key);
    else if (key == "addresses_published") req.addressesPublished = field<bool>(v, key);
    else if (key == "every_tensor_shared") req.everyTensorShared = field<bool>(v, key);
    else if (key == "on_copy_engine") req.onCopyEngine = field<bool>(v, key);
    else if (key == "every_peer_mapped") req.everyPeerMapped = field<bool>(v, key);
    else if (key == "host_of") req.hostOf = field<std::vector<int>>(v, key);
    else if (key == "leader_max_bytes") req.leaderMaxBytes = field<int64_t>(v, key);
    else if (key == "net_chunk_bytes") req.netChunkBytes = field<int64_t>(v, key);
    else if (key == "host_reads_peers") req.hostReadsPeers = field<bool>(v, key);
    else if (key == "all_to_all_form") {
      const auto form = field<std::string>(v, key);
      if (form == "auto") req.allToAllForm = hoccl::AllToAllHostsForm::Auto;
      else if (form == "direct") req.allToAllForm = hoccl::AllToAllHostsForm::Direct;
      else if (form == "relay") req.allToAllForm = hoccl::AllToAllHostsForm::Relay;
      else throw py::value_error("build_plan: all_to_all_form '" + form + "' is not auto, direct or relay");
    } else if (key == "net_costs") {
      const auto c = field<std::tuple<double, double, double>>(v, key);
      req.netCosts = {std::get<0>(c), std::get<1>(c), std::get<2>(c)};
    }
    else if (key == "phases") {
      for (const auto& ph : field<std::vector<std::vector<std::tuple<int, int, int64_t>>>>(v, key)) {
        req.phases.emplace_back();
        for (const auto& [s, t, b] : ph) req.phases.back().push_back({s, t, b});
      }
    } else {
      throw py::value_error("build_plan: unknown request key '" + key + "'");
    }
  }
  if (!haveKind) throw py::value_error("build_plan: the request has no 'kind'");
  if (req.world < 1 || req.rank < 0 || req.rank >= req.world)
    throw py::value_error("build_plan: rank " + std::to_string(req.rank) + " is not in a world of " +
                          std::to_string(req.world));
  if (!req.hostOf.empty() && static_cast<int>(req.hostOf.size()) != req.world)
    throw py::value_error("build_plan: host_of has " + std::to_string(req.hostOf.size()) + " entries for a world of " +
                          std::to_string(req.world));
  return req;
}

const char* spaceName(Space s) {
  switch (s) {
    case Space::In: return "in";
    case Space::Out: return "out";
    case Space::Slot: return "slot";
    case Space::PeerIn: return "peer_in";
    case Space::PeerOut: return "peer_out";
    case Space::Scratch: return "scratch";
  }
  return "?";
}

py::dict locDict(const Loc& l) {
  py::dict d;
  d["space"] = spaceName(l.space);
  d["index"] = l.index;
  d["buf"] = l.buf;
  d["offset"] = l.offset;
  return d;
}

py::dict stepDict(const Step& s) {
  py::dict d;
  switch (s.kind) {
    case Step::Kind::Copy:
      d["kind"] = "copy";
      d["dst"] = locDict(s.dst);
      d["src"] = locDict(s.src);
      d["bytes"] = s.bytes;
      break;
    case Step::Kind::Reduce: {
      d["kind"] = "reduce";
      d["dst"] = locDict(s.dst);
      py::list srcs;
      for (const auto& l : s.srcs) srcs.append(locDict(l));
      d["srcs"] = srcs;
      d["count"] = s.count;
      d["finalize"] = s.finalize;
      break;
    }
    case Step::Kind::Barrier:
      d["kind"] = "barrier";
      d["scope"] = s.scope == Scope::Host ? "host" : "group";
      break;
    case Step::Kind::Send:
      d["kind"] = "send";
      d["src"] = locDict(s.src);
      d["bytes"] = s.bytes;
      d["peer"] = s.peer;
      d["transfer"] = s.transfer;
      d["message"] = s.message;
      break;
    case Step::Kind::Recv:
      d["kind"] = "recv";
      d["dst"] = locDict(s.dst);
      d["bytes"] = s.bytes;
      d["peer"] = s.peer;
      d["transfer"] = s.transfer;
      d["message"] = s.message;
      break;
    case Step::Kind::Wait:
      d["kind"] = "wait";
      d["transfer"] = s.transfer;
      break;
  }
  return d;
}

py::dict planDict(const Plan& p) {
  py::dict d;
  d["algo"] = p.algo;
  d["buffers_used"] = p.buffersUsed;
  d["scratch_bytes"] = p.scratchBytes;
  d["transfers"] = p.transfers;
  py::list steps;
  for (const auto& s : p.steps) steps.append(stepDict(s));
  d["steps"] = steps;
  return d;
}

}  // namespace

void bindPlans(py::module& m) {
  m.def(
      "build_plan", [](const py::dict& request) { return planDict(hoccl::buildPlan(requestFrom(request))); },
      py::arg("request"),
      "the Plan buildPlan() makes for a PlanRequest given as a dict of its fields in snake_case (kind: the op "
      "name, e.g. 'all_reduce'; phases: [[(src, dst, bytes), ...], ...]; host_of: [host of each rank]): "
      "{algo, buffers_used, scratch_bytes, transfers, steps: [{kind, ...}]}; unknown keys raise ValueError");
  // Builders buildPlan does not choose today, by name, for tests.
  m.def(
      "build_named_plan",
      [](const std::string& builder, const py::dict& request) {
        static const std::map<std::string, Plan (*)(const PlanRequest&)> builders = {
            {"allgather/hosts", hoccl::planAllGatherRail},
            {"allgather/hosts-first", hoccl::planAllGatherHostFirst},
            {"gather/hosts", [](const PlanRequest& r) { return hoccl::planAllGatherHosts(r, true); }},
            {"broadcast/hosts", hoccl::planBroadcastHosts},
            {"scatter/hosts", hoccl::planScatterHosts},
            {"alltoall/hosts-direct", hoccl::planAllToAllHostsDirect},
            {"alltoall/hosts-rail", hoccl::planAllToAllHostsRail}};
        auto it = builders.find(builder);
        if (it == builders.end()) throw py::value_error("build_named_plan: unknown builder '" + builder + "'");
        return planDict(it->second(requestFrom(request)));
      },
      py::arg("builder"), py::arg("request"),
      "build_plan(request) through the named builder (the builders across hosts: 'allgather/hosts', "
      "'allgather/hosts-first', 'gather/hosts', 'broadcast/hosts', 'scatter/hosts', 'alltoall/hosts-direct', 'alltoall/hosts-rail'), also "
      "where buildPlan would choose another (one host, or rail)");
  m.def(
      "describe_plan_request", [](const py::dict& request) { return hoccl::buildPlan(requestFrom(request)).describe(); },
      py::arg("request"), "Plan::describe() of the plan build_plan(request) returns (what HOCCL_DEBUG=TRACE prints)");
}
