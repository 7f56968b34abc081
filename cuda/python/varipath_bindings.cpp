// hoccl_backend._C.varipath: the VarioPath online scheduler for Python (varipath.schedule() and
// the backend's all_to_all run the same compiled scheduler; see bindVariPath()).
#include "python/varipath_bindings.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <tuple>

#include "varipath/scheduler.h"
#include "varipath/timeshare.h"

namespace py = pybind11;
using hoccl::varipath::CostModel;
using hoccl::varipath::Phase;
using hoccl::varipath::PlanInfo;
using hoccl::varipath::Scheduler;
namespace vp = hoccl::varipath;

namespace {

using PyPhase = std::vector<std::tuple<int, int, int64_t>>;

std::vector<PyPhase> to_python(const std::vector<Phase>& phases) {
  std::vector<PyPhase> out;
  out.reserve(phases.size());
  for (const Phase& ph : phases) {
    PyPhase p;
    p.reserve(ph.size());
    for (const auto& t : ph) p.emplace_back(t.src, t.dst, t.bytes);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<Phase> from_python(const std::vector<PyPhase>& phases) {
  std::vector<Phase> out;
  for (const PyPhase& ph : phases) {
    Phase p;
    for (const auto& t : ph) p.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t)});
    out.push_back(std::move(p));
  }
  return out;
}

// Median wall time of `repeats` plan() calls in microseconds, measured without Python overhead.
double plan_time_us(const Scheduler& s, const std::vector<int64_t>& demand, int repeats) {
  std::vector<double> t;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto a = std::chrono::steady_clock::now();
    auto plan = s.plan(demand);
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace

void bindVariPath(py::module& parent) {
  // Bad input raises ValueError (pybind11 translates std::invalid_argument).
  py::module m = parent.def_submodule("varipath", "VarioPath online alltoallv scheduler (C++)");
  m.def(
      "time_share_search",
      [](const std::vector<double>& link_bw, const std::vector<std::vector<int>>& links, const std::vector<double>& eta,
         const std::vector<double>& demand, const std::vector<std::vector<int>>& start, int rounds) {
        std::vector<std::tuple<std::vector<int>, std::vector<double>, double>> out;
        for (auto& c : hoccl::varipath::time_share_search(links, link_bw, eta, demand, start, rounds))
          out.emplace_back(std::move(c.members), std::move(c.rates), c.seconds);
        return out;
      },
      py::arg("link_bw"), py::arg("links"), py::arg("eta"), py::arg("demand"), py::arg("start") = std::vector<std::vector<int>>{},
      py::arg("rounds") = 0,
      "Column generation for the time-sharing LP (tests and tools): (members, rates, seconds) of the "
      "configurations used, for transfers with the given link paths and demands.");
  // Held by shared_ptr so that the backend can plan with the very object (set_alltoall_scheduler).
  py::class_<Scheduler, std::shared_ptr<Scheduler>>(m, "Scheduler")
      .def(py::init<int, std::vector<std::vector<std::pair<int, int>>>, double, double>(), py::arg("n"),
           py::arg("channels"), py::arg("phase_latency_s"), py::arg("bandwidth_Bps"))
      .def("set_link_model", &Scheduler::set_link_model, py::arg("link_bw"), py::arg("pair_links"))
      .def("set_hosts", &Scheduler::set_hosts, py::arg("host_of_gpu"),
           "The host of every GPU; enables host rounds on several hosts.")
      .def(
          "set_cost_model",
          [](Scheduler& s, double eta_beta, double eta_min, int copy_engines) {
            CostModel m;
            m.eta_beta = eta_beta;
            m.eta_min = eta_min;
            m.copy_engines = copy_engines;
            s.set_cost_model(m);
          },
          py::arg("eta_beta") = 0.0, py::arg("eta_min") = 1.0, py::arg("copy_engines") = 0)
      .def(
          "set_candidates",
          [](Scheduler& s, bool channels, bool link_greedy, bool peer_rounds, bool direct, bool time_share,
             bool host_rounds, bool backfill) {
            s.set_candidates((channels ? vp::kCatalogChannels : 0) | (link_greedy ? vp::kLinkGreedy : 0) |
                             (peer_rounds ? vp::kPeerRounds : 0) | (direct ? vp::kDirect : 0) |
                             (time_share ? vp::kTimeShare : 0) | (host_rounds ? vp::kHostRounds : 0) |
                             (backfill ? vp::kBackfill : 0));
          },
          py::arg("channels") = true, py::arg("link_greedy") = true, py::arg("peer_rounds") = true,
          py::arg("direct") = true, py::arg("time_share") = true, py::arg("host_rounds") = true,
          py::arg("backfill") = true,
          "Candidate families plan() chooses from (tests and experiments).")
      .def(
          "plan", [](const Scheduler& s, const std::vector<int64_t>& d) { return to_python(s.plan(d)); },
          py::arg("demand"), "Phases covering the n*n row-major demand exactly.")
      .def(
          "plan_info",
          [](const Scheduler& s, const std::vector<int64_t>& d) {
            PlanInfo info;
            auto phases = to_python(s.plan_info(d, &info));
            py::dict meta;
            meta["est_cost_s"] = info.est_cost_s;
            meta["channel_phases"] = info.channel_phases;
            meta["merge_factor"] = info.merge_factor;
            meta["quantum_bytes"] = info.quantum_bytes;
            meta["candidates"] = info.candidates;
            meta["simulated"] = info.simulated;
            meta["backfilled"] = info.backfilled;
            meta["candidate"] = vp::family_name(info.family);
            return py::make_tuple(phases, meta);
          },
          py::arg("demand"))
      .def(
          "estimate", [](const Scheduler& s, const std::vector<PyPhase>& p) { return s.estimate(from_python(p)); },
          py::arg("phases"))
      .def("plan_time_us", &plan_time_us, py::arg("demand"), py::arg("repeats") = 20)
      .def_property_readonly("num_gpus", &Scheduler::num_gpus)
      .def_property_readonly("num_channels", &Scheduler::num_channels);
}
