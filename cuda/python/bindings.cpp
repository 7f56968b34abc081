// Python face of the C++ core: hoccl_backend._C.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "python/cuda_bindings.h"
#include "python/plan_bindings.h"
#include "python/reduce_bindings.h"
#include "python/varipath_bindings.h"
#include "plan/plan.h"
#include "backend/direct_allreduce.h"
#include "backend/process_group.h"
#include "transport/shm/futex_wait.h"
#include "transport/shm/shared_tensor.h"
#include "common/config.h"
#include "backend/core_sharing.h"
#include "backend/thread_scan.h"
#include "backend/multihost/host_span.h"
#include "varipath/scheduler.h"

namespace py = pybind11;

namespace {

// Phases as Python sees them: [[(src, dst, bytes), ...], ...].
std::vector<std::vector<std::tuple<int, int, int64_t>>> phasesForPython(const std::vector<hoccl::TransferPhase>& phases) {
  std::vector<std::vector<std::tuple<int, int, int64_t>>> out;
  for (const auto& phase : phases) {
    out.emplace_back();
    for (const auto& t : phase) out.back().emplace_back(t.src, t.dst, t.bytes);
  }
  return out;
}

// The replay bindings' clocks: a step's milliseconds from the clock's epoch, a duration in us.
std::chrono::steady_clock::time_point steadyAtMs(double ms) {
  return std::chrono::steady_clock::time_point{} +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

std::chrono::nanoseconds nanosFromUs(double us) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::micro>(us));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hoccl C++ core: process group, shm transport, plan-building collective scheduler";
  py::class_<hoccl::ProcessGroupHOCCL, c10d::Backend, c10::intrusive_ptr<hoccl::ProcessGroupHOCCL>>(
      m, "ProcessGroupHOCCL")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, bool spansHosts) {
             return c10::make_intrusive<hoccl::ProcessGroupHOCCL>(store, rank, size, timeout, spansHosts);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("spans_hosts") = false,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "set_alltoall_scheduler",
          [](hoccl::ProcessGroupHOCCL& pg, std::shared_ptr<hoccl::varipath::Scheduler> s) { pg.setAllToAllScheduler(std::move(s)); },
          py::arg("scheduler"), "the varipath Scheduler all_to_all plans with (None: no VarioPath)")
      .def("last_algorithm", &hoccl::ProcessGroupHOCCL::lastAlgorithm)
      .def(
          "last_core_sharing", [](const hoccl::ProcessGroupHOCCL& pg) { return hoccl::coreSharingName(pg.lastCoreSharing()); },
          "how this rank saw its cores at its latest op: 'none', 'among_ranks' or 'with_other_work'")
      .def(
          "last_alltoall_phases",
          [](const hoccl::ProcessGroupHOCCL& pg) { return phasesForPython(pg.lastAllToAllPhases()); },
          "[[(src, dst, bytes), ...], ...]: the phases the last all_to_all ran, its self-copy phase first")
      .def("alltoall_plan_counts", &hoccl::ProcessGroupHOCCL::allToAllPlanCounts,
           "(split matrices planned by VarioPath, served from the plan cache) on this rank")
      .def("direct_handle", [](const c10::intrusive_ptr<hoccl::ProcessGroupHOCCL>& pg) { return hoccl::directHandle(pg); },
           "the int that names this group in torch.ops.hoccl.all_reduce_(tensor, group, op)")
      .def(
          "span_hosts",
          [](hoccl::ProcessGroupHOCCL& pg, c10::intrusive_ptr<c10d::Backend> rail,
             c10::intrusive_ptr<c10d::Backend> global, c10::intrusive_ptr<c10d::Backend> p2p,
             std::vector<std::string> addressOf) {
            hoccl::InterHostGroups groups{std::move(rail), std::move(global), std::move(p2p), std::move(addressOf)};
            pg.spanHosts(std::move(groups), hoccl::config::bytes("HOCCL_LEADER_MAX_BYTES"),
                         hoccl::config::text("HOCCL_CHECK_ACROSS_HOSTS") == "1");
          },
          py::arg("rail"), py::arg("global_group"), py::arg("p2p"),
          py::arg("address_of"), py::call_guard<py::gil_scoped_release>(),
          "collectives across hosts from now on, over these gloo groups (a group created with spans_hosts)")
      .def("spans_hosts", &hoccl::ProcessGroupHOCCL::spansHosts)
      .def(
          "net_costs",
          [](const hoccl::ProcessGroupHOCCL& g) {
            const hoccl::NetCosts c = g.netCosts();
            return py::dict(py::arg("message_s") = c.messageSec, py::arg("link_bytes_per_s") = c.linkBytesPerSec,
                            py::arg("copy_bytes_per_s") = c.copyBytesPerSec);
          },
          "what crossing hosts costs, as plans and all_to_all's form weigh it: the same on every rank")
      .def("hosts", &hoccl::ProcessGroupHOCCL::hostRanks, "ranks of each host, hosts in order of their lowest rank");

  m.def(
      "describe_plan",
      [](const std::string& kind, int rank, int world, int64_t bytes, int64_t elemSize, int64_t slotBytes,
         int root, int64_t oneShotMaxBytes) {
        static const std::map<std::string, hoccl::OpKind> kinds = {
            {"all_reduce", hoccl::OpKind::AllReduce}, {"all_gather", hoccl::OpKind::AllGather},
            {"reduce_scatter", hoccl::OpKind::ReduceScatter}, {"broadcast", hoccl::OpKind::Broadcast},
            {"reduce", hoccl::OpKind::Reduce}, {"gather", hoccl::OpKind::Gather},
            {"scatter", hoccl::OpKind::Scatter}, {"barrier", hoccl::OpKind::Barrier}};
        auto it = kinds.find(kind);
        if (it == kinds.end()) throw py::value_error("unknown collective " + kind);
        hoccl::PlanRequest req;
        req.kind = it->second;
        req.rank = rank;
        req.world = world;
        req.bytes = bytes;
        req.elemSize = elemSize;
        req.slotBytes = slotBytes;
        req.root = root;
        req.oneShotMaxBytes = oneShotMaxBytes;
        return hoccl::buildPlan(req).describe();
      },
      py::arg("kind"), py::arg("rank"), py::arg("world"), py::arg("bytes"), py::arg("elem_size") = 4,
      py::arg("slot_bytes") = 4 << 20, py::arg("root") = 0, py::arg("one_shot_max_bytes") = 64 << 10);
  m.def("shared_bytes", &hoccl::sharedBytes, py::arg("nbytes"),
        "uninitialised uint8 CPU tensor in memory local peers can map (see hoccl_backend.empty)");
  m.def("is_shared", &hoccl::isShared, py::arg("tensor"));
  m.def("peer_mapped_bytes", &hoccl::PeerMappings::bytesRead,
        "bytes this process read from peers' shared tensors through mappings (all groups)");
  m.def("huge_page_promoted_bytes", &hoccl::HugePagePromoter::bytesPromoted,
        "bytes of reused peer-read buffers this process moved onto huge pages (all groups)");
  m.def(
      "config_table",
      [] {
        static const char* kinds[] = {"bytes", "integer", "choice", "text"};
        static const char* readers[] = {"core", "python", "build", "tests"};
        py::list rows;
        for (const auto& v : hoccl::config::table()) {
          py::dict row;
          row["name"] = v.name;
          row["kind"] = kinds[static_cast<int>(v.kind)];
          row["read_by"] = readers[static_cast<int>(v.readBy)];
          row["default"] = v.defaultValue;
          row["choices"] = v.choices;
          row["meaning"] = v.meaning;
          rows.append(row);
        }
        return rows;
      },
      "every HOCCL_* variable: name, kind, who reads it, default, allowed values, meaning");
  m.def("config_value", [](const std::string& name) { return hoccl::config::text(name); }, py::arg("name"),
        "the variable's validated text (its default when unset); raises ValueError naming it when bad");
  m.def("config_describe", &hoccl::config::describe, "the configuration in force, one line per variable");
  m.def("job_ranks_on_host", &hoccl::jobRanksOnHost,
        "ranks of this job on this host as hoccl sees them (LOCAL_WORLD_SIZE, the groups made so far)");
  m.def("runnable_threads_now", &hoccl::runnableThreadsNow,
        "runnable threads on the machine now (/proc/loadavg, this reader included); -1 if unreadable");
  m.def("other_runnable_threads_in_process", [] { return hoccl::otherRunnableThreadsInProcess(); },
        py::call_guard<py::gil_scoped_release>(),
        "threads of this process other than the caller in state R now (/proc/self/task); -1 if unreadable");
  m.def(
      "decide_core_sharing",
      [](int ranks, int cpus, bool loaded, bool ownCompute, bool tasksGrouped) {
        return hoccl::coreSharingName(hoccl::decideCoreSharing({ranks, cpus, loaded, ownCompute, tasksGrouped}));
      },
      py::arg("ranks"), py::arg("cpus"), py::arg("loaded"), py::arg("own_compute"), py::arg("tasks_grouped"),
      "the wait policy's decision from its inputs: 'none', 'among_ranks' or 'with_other_work'");
  m.def("tasks_grouped", &hoccl::tasksGrouped,
        "whether the scheduler groups tasks (autogroup, or a cpu cgroup other than the root)");
  m.def(
      "replay_compute_sampler",
      [](const std::vector<std::tuple<double, double, int>>& steps) {
        // Each step: (milliseconds, CPU microseconds the other threads took since the previous
        // step, runnable threads a scan would find); after it: (whether it scanned, computing).
        hoccl::ComputeSampler sampler;
        std::vector<std::pair<bool, bool>> out;
        for (size_t i = 0; i < steps.size(); ++i) {
          const auto [ms, othersUs, runnable] = steps[i];
          const auto now = steadyAtMs(ms);
          if (i > 0) sampler.noteOthersCpu(now, nanosFromUs(othersUs), now - steadyAtMs(std::get<0>(steps[i - 1])));
          const bool due = sampler.due(now);
          if (due) sampler.note(now, runnable, std::chrono::nanoseconds(0));
          out.emplace_back(due, sampler.computing());
        }
        return out;
      },
      py::arg("steps"),
      "the compute sampler fed [(ms, other threads' CPU us since the previous step, runnable threads a scan finds)]: "
      "[(scanned, computing)]");
  m.def(
      "replay_load_sampler",
      [](const std::vector<std::pair<double, bool>>& steps) {
        // Each step: (milliseconds, whether /proc/loadavg would show more runnable threads than
        // the CPUs); after it: (whether it sampled, loaded).
        hoccl::LoadSampler sampler;
        std::vector<std::pair<bool, bool>> out;
        for (const auto& [ms, over] : steps) {
          const auto now = steadyAtMs(ms);
          const bool due = sampler.due(now);
          if (due) sampler.note(now, over);
          out.emplace_back(due, sampler.overloaded());
        }
        return out;
      },
      py::arg("steps"), "the load sampler fed [(ms, over the CPUs)]: [(sampled, loaded)]");
  m.def(
      "replay_yield_gate",
      [](const std::vector<std::tuple<double, double, bool>>& yields) {
        // Each yield: (milliseconds when it ended, microseconds it took, whether the awaited word
        // moved); after it: whether the gate lets the next waiter yield at that moment.
        hoccl::YieldGate gate;
        std::vector<bool> out;
        for (const auto& [ms, tookUs, progressed] : yields) {
          const auto now = steadyAtMs(ms);
          gate.noteYield(now, nanosFromUs(tookUs), progressed);
          out.push_back(gate.open(now));
        }
        return out;
      },
      py::arg("yields"), "a yield gate fed [(ms, took us, word moved)]: whether it is open after each");
  m.def(
      "lost_yields", [] { return hoccl::processYieldGate.lostYields(); },
      "yields of this process's waiters that fed work outside the op (each closed the gate for a while)");
  m.def("host_identity", &hoccl::localHostIdentity,
        "this process's host identity (HOCCL_HOSTNAME, else hostname + boot, /dev/shm and namespaces)");
  bindCuda(m);
  bindVariPath(m);
  bindPlans(m);
  bindReductions(m);
#ifdef HOCCL_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}
