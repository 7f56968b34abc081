// Python face of the CUDA pieces: status/diagnostics that work everywhere, plus thin test hooks
// (_ce_reduce, _CeGroup) that drive the primitives on CUDA tensors, and raw-pointer hooks
// (_ce_raw_*, _CeGroup.*_raw) that need no CUDA build of torch: device memory, streams and
// copies go through the dlopen'ed driver, so the same tests run on a GPU and on a CPU model of
// the driver (HOCCL_LIBCUDA). The core registers them with one call, bindCuda(m).
#include <ATen/ops/empty.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <stdexcept>

#include "python/cuda_bindings.h"

#include "plan/plan.h"
#include "transport/ce/ce_collectives.h"
#include "transport/ce/ce_copy.h"
#include "transport/ce/ce_reduce.h"
#include "transport/ce/ce_sm_check.h"
#include "transport/ce/ce_spin.h"
#include "transport/ce/cuda_driver.h"

namespace py = pybind11;

namespace hoccl {
namespace {

RedOp parseOp(const std::string& name) {
  static const std::map<std::string, RedOp> ops = {
      {"sum", RedOp::Sum}, {"avg", RedOp::Avg}, {"product", RedOp::Product}, {"min", RedOp::Min},
      {"max", RedOp::Max}, {"premul_sum", RedOp::PremulSum}, {"band", RedOp::BitAnd},
      {"bor", RedOp::BitOr}, {"bxor", RedOp::BitXor}};
  auto it = ops.find(name);
  if (it == ops.end()) throw py::value_error("unknown reduce op '" + name + "'");
  return it->second;
}

// The sm_free check's report as plain Python values (printed and judged by scripts/gpu_checks.py).
py::dict smCheck(int device, size_t bytes, double startDeadlineS, double copyDeadlineS, double drainDeadlineS) {
  SmCheckOptions o;
  o.bytes = bytes;
  o.startDeadlineS = startDeadlineS;
  o.copyDeadlineS = copyDeadlineS;
  o.drainDeadlineS = drainDeadlineS;
  SmCheckReport r;
  {
    py::gil_scoped_release nogil;
    r = runSmCheck(device, o);
  }
  py::list rows;
  for (const auto& row : r.rows) {
    py::dict x;
    x["direction"] = row.direction;
    x["used_by"] = row.usedBy;
    x["call"] = row.call;
    x["bytes"] = row.bytes;
    x["completed"] = row.completed;
    x["completed_while_sms_full"] = row.completedWhileSmsFull;
    x["microseconds"] = row.microseconds;
    x["error"] = row.error;
    rows.append(x);
  }
  py::dict d;
  d["device"] = r.device;
  d["driver_version"] = r.driverVersion;
  d["spin_kernel_bytes"] = spinKernelImageBytes();
  d["sms"] = r.sms;
  d["threads_per_block"] = r.threadsPerBlock;
  d["blocks_per_sm"] = r.blocksPerSm;
  d["max_threads_per_sm"] = r.maxThreadsPerSm;
  d["occupancy_source"] = r.occupancySource;
  d["blocks"] = r.blocks;
  d["blocks_resident"] = r.blocksResident;
  d["blocks_timed_out"] = r.blocksTimedOut;
  d["sms_full"] = r.smsFull;
  d["peer_access"] = r.peerAccess;
  d["rows"] = rows;
  d["errors"] = r.errors;
  return d;
}

const char* reduceOnName(ReduceOn r) { return r == ReduceOn::Gpu ? "gpu" : "host"; }

py::dict driverStatus() {
  std::string err = cu::loadError();
  if (!err.empty()) throw std::runtime_error(err);  // pybind11 maps it to RuntimeError
  py::dict d;
#ifdef HOCCL_WITH_CUDA
  const auto& api = cu::driver();
  int count = 0;
  cu::check(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  d["library"] = api.libraryPath;
  d["driver_version"] = api.driverVersion;
  d["header_version"] = CUDA_VERSION;
  d["device_count"] = count;
  d["batch_memcpy"] = api.cuMemcpyBatchAsync != nullptr;
  d["dlsym_fallbacks"] = api.dlsymFallbacks;
  // Whether p2p copies carry the copy-engine hint; a hint proves nothing (see sm_check).
  d["prefer_overlap_hint"] = api.cuMemcpyBatchAsync != nullptr && api.driverVersion >= kSameDeviceCeDriverVersion;
#endif
  return d;
}

#ifdef HOCCL_WITH_CUDA
void checkCuda(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda(), "hoccl: ", what, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), "hoccl: ", what, " must be contiguous");
}

CUdeviceptr ptrOf(const at::Tensor& t) { return reinterpret_cast<CUdeviceptr>(t.data_ptr()); }
CUstream asStream(uint64_t s) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(s)); }

void checkHost(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "hoccl: ", what, " must be a contiguous CPU tensor");
}

std::unique_ptr<CeGroup> makeGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                                   int world, int device, size_t slotBytes, const std::string& reduceOn,
                                   const std::string& path, uint32_t firstSeq, int64_t timeoutMs) {
  auto opts = CeGroupOptions::fromEnv();
  if (slotBytes) opts.slotBytes = slotBytes;
  if (reduceOn == "host") opts.reduceOn = ReduceOn::Host;
  else if (reduceOn == "gpu") opts.reduceOn = ReduceOn::Gpu;
  else if (!reduceOn.empty()) throw py::value_error("reduce_on must be '', 'gpu' or 'host'");
  if (!path.empty()) opts.pathMode = parseCePathMode(path);
  opts.firstSeq = firstSeq;
  if (timeoutMs > 0) opts.timeout = std::chrono::milliseconds(timeoutMs);
  return std::make_unique<CeGroup>(store, prefix, rank, world, device, opts, PlanRule{buildPlan, readsPeersDirectly});
}

// Raw hooks: driver calls under the device's primary context, GIL released while they block.
uint64_t rawStreamCreate(int device) {
  py::gil_scoped_release nogil;
  cu::ContextGuard guard(device);
  CUstream s = nullptr;
  cu::check(cu::driver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return reinterpret_cast<uintptr_t>(s);
}

uint64_t rawAlloc(size_t bytes, int device) {
  cu::ContextGuard guard(device);
  CUdeviceptr p = 0;
  cu::check(cu::driver().cuMemAlloc(&p, bytes), "cuMemAlloc");
  return p;
}

// Stream-ordered H2D of a CPU tensor's bytes (pageable: the driver stages them before returning).
void rawUpload(uint64_t dst, const at::Tensor& src, uint64_t stream, int device) {
  checkHost(src, "source");
  py::gil_scoped_release nogil;
  cu::ContextGuard guard(device);
  cu::check(cu::driver().cuMemcpyHtoDAsync(dst, src.data_ptr(), src.nbytes(), asStream(stream)), "cuMemcpyHtoDAsync");
}

// D2H into a CPU tensor after the stream's earlier work (pageable: returns once copied).
void rawDownload(const at::Tensor& dst, uint64_t src, uint64_t stream, int device) {
  checkHost(dst, "destination");
  py::gil_scoped_release nogil;
  cu::ContextGuard guard(device);
  cu::check(cu::driver().cuMemcpyDtoHAsync(dst.data_ptr(), src, dst.nbytes(), asStream(stream)), "cuMemcpyDtoHAsync");
  cu::check(cu::driver().cuStreamSynchronize(asStream(stream)), "cuStreamSynchronize");
}

void rawReduce(uint64_t dst, const std::vector<uint64_t>& srcs, int64_t count, const at::Tensor& like,
               const std::string& op, double factor, int world, uint64_t stream, int ctas, int device) {
  RedOp r = parseOp(op);
  std::string why = checkReducible(like.scalar_type(), r);
  TORCH_CHECK(why.empty(), "hoccl: ", why);
  std::vector<CUdeviceptr> ptrs(srcs.begin(), srcs.end());
  py::gil_scoped_release nogil;
  cu::ContextGuard guard(device);
  ReduceKernel k(device, ctas);
  const size_t scratchBytes = reduceScratchBytes(like.scalar_type(), ptrs.size(), count);
  std::unique_ptr<DeviceBuffer> scratch;  // freed after the sync below
  if (scratchBytes) scratch = std::make_unique<DeviceBuffer>(scratchBytes, device);
  k.launch(asStream(stream), dst, ptrs, count, like.scalar_type(), r, factor, world, true,
           scratch ? scratch->ptr() : 0);
  cu::check(cu::driver().cuStreamSynchronize(asStream(stream)), "cuStreamSynchronize");
}

void bindRaw(py::module& m) {
  m.def("_ce_raw_stream_create", &rawStreamCreate, py::arg("device") = 0, "Test hook: cuStreamCreate (as int).");
  m.def(
      "_ce_raw_stream_sync",
      [](uint64_t s) {
        py::gil_scoped_release nogil;
        cu::check(cu::driver().cuStreamSynchronize(asStream(s)), "cuStreamSynchronize");
      },
      py::arg("stream"));
  m.def(
      "_ce_raw_stream_destroy", [](uint64_t s) { cu::check(cu::driver().cuStreamDestroy(asStream(s)), "cuStreamDestroy"); },
      py::arg("stream"));
  m.def("_ce_raw_alloc", &rawAlloc, py::arg("bytes"), py::arg("device") = 0, "Test hook: cuMemAlloc (as int).");
  m.def(
      "_ce_raw_free",
      [](uint64_t p, int device) {
        cu::ContextGuard guard(device);
        cu::check(cu::driver().cuMemFree(p), "cuMemFree");
      },
      py::arg("ptr"), py::arg("device") = 0);
  m.def("_ce_raw_upload", &rawUpload, py::arg("dst"), py::arg("src"), py::arg("stream"), py::arg("device") = 0);
  m.def("_ce_raw_download", &rawDownload, py::arg("dst"), py::arg("src"), py::arg("stream"), py::arg("device") = 0);
  m.def("_ce_raw_reduce", &rawReduce, py::arg("dst"), py::arg("srcs"), py::arg("count"), py::arg("like"),
        py::arg("op"), py::arg("factor") = 1.0, py::arg("world") = 1, py::arg("stream") = 0, py::arg("ctas") = 4,
        py::arg("device") = 0, "Test hook: one (chained) reduction on raw device pointers, then a stream sync.");
  m.def(
      "_ce_raw_refuse_capture",
      [](uint64_t s, const std::string& op) { ceRefuseCapture(asStream(s), op.c_str()); }, py::arg("stream"),
      py::arg("op"), "Test hook: the graph-capture check the process group runs on the caller's stream.");
}

// Test hook: one reduction kernel launch on `stream`, dst = op(srcs) in list order.
void ceReduce(const at::Tensor& dst, const std::vector<at::Tensor>& srcs, const std::string& op, double factor,
              int world, uint64_t stream, int ctas) {
  checkCuda(dst, "dst");
  std::vector<CUdeviceptr> ptrs;
  for (const auto& s : srcs) {
    checkCuda(s, "source");
    TORCH_CHECK(s.scalar_type() == dst.scalar_type() && s.numel() == dst.numel(), "hoccl: source/dst mismatch");
    ptrs.push_back(ptrOf(s));
  }
  RedOp r = parseOp(op);
  std::string why = checkReducible(dst.scalar_type(), r);
  TORCH_CHECK(why.empty(), "hoccl: ", why);
  const int device = dst.get_device();
  cu::ContextGuard guard(device);
  thread_local std::map<std::pair<int, int>, std::unique_ptr<ReduceKernel>> kernels;  // (device, ctas)
  auto& k = kernels[{device, ctas}];
  if (!k) k = std::make_unique<ReduceKernel>(device, ctas);
  const size_t scratchBytes = reduceScratchBytes(dst.scalar_type(), ptrs.size(), dst.numel());
  if (!scratchBytes) {
    k->launch(asStream(stream), ptrOf(dst), ptrs, dst.numel(), dst.scalar_type(), r, factor, world, true);
    return;
  }
  // Torch's allocator does not know `stream`: keep the scratch until the launches are done.
  at::Tensor scratch = at::empty({dst.numel()}, dst.options().dtype(at::kFloat));
  k->launch(asStream(stream), ptrOf(dst), ptrs, dst.numel(), dst.scalar_type(), r, factor, world, true, ptrOf(scratch));
  cu::check(cu::driver().cuStreamSynchronize(asStream(stream)), "cuStreamSynchronize");
}
#endif

}  // namespace
}  // namespace hoccl

void bindCuda(py::module& m) {
  using namespace hoccl;
  m.def("cuda_driver_status", &driverStatus,
        "Loads the CUDA driver (dlopen libcuda.so.1, or $HOCCL_LIBCUDA) and returns what it found; "
        "raises RuntimeError naming the library or the missing entry point.");
  m.def("cuda_driver_error", &cu::loadError, "'' when the CUDA driver is usable, else why not (never raises).");
  m.def("sm_check", &smCheck, py::arg("device") = 0, py::arg("bytes") = size_t(32) << 20,
        py::arg("start_deadline_s") = 5.0, py::arg("copy_deadline_s") = 1.0, py::arg("drain_deadline_s") = 5.0,
        "The sm_free check: fill every SM with a spin kernel, issue the transport's copies (d2h, h2d, d2d as "
        "the p2p path issues it, d2d_memcpy, d2d_batch) and report which completed while the SMs were full. "
        "CUDA failures are reported in the dict ('errors', rows' 'error'), never raised.");
  m.def(
      "ce_choose_path",
      [](const std::string& mode, bool sameDevice, bool canAccessPeer, int driverVersion) {
        return std::string(cePathName(choosePath(parseCePathMode(mode), sameDevice, canAccessPeer, driverVersion)));
      },
      py::arg("mode"), py::arg("same_device"), py::arg("can_access_peer"), py::arg("driver_version"),
      "The copy path (p2p|host) the cuda-ce transport takes for one pair of ranks.");
  m.def(
      "reduce_kernel_info",
      [] {
        py::dict d;
        d["image_bytes"] = reduceKernelImageBytes();
        d["available"] = reduceKernelImageBytes() > 0;
        d["spin_image_bytes"] = spinKernelImageBytes();  // sm_free's kernel, embedded alongside
        d["max_ctas"] = reduceCtasFromEnv();
        d["threads_per_cta"] = kReduceThreads;
        d["reduce_on"] = reduceOnName(reduceOnFromEnv());
        return d;
      },
      "The embedded GPU reduction kernel and the HOCCL_REDUCE_* settings in effect.");
#ifdef HOCCL_WITH_CUDA
  m.def("_ce_reduce", &ceReduce, py::arg("dst"), py::arg("srcs"), py::arg("op"), py::arg("factor") = 1.0,
        py::arg("world") = 1, py::arg("stream") = 0, py::arg("ctas") = 4,
        "Test hook: launch the bounded reduction kernel on `stream` (a cudaStream_t as int).");
  py::class_<CeGroup>(m, "_CeGroup", "Reference cuda-ce collectives on raw CUDA tensors (tests, benchmarks).")
      .def(py::init(&makeGroup), py::arg("store"), py::arg("prefix"), py::arg("rank"), py::arg("world"),
           py::arg("device"), py::arg("slot_bytes") = 0, py::arg("reduce_on") = "", py::arg("path") = "",
           py::arg("first_seq") = 0, py::arg("timeout_ms") = 0, py::call_guard<py::gil_scoped_release>())
      .def(
          "all_gather",
          [](CeGroup& g, const at::Tensor& out, const at::Tensor& in, uint64_t stream) {
            checkCuda(out, "output");
            checkCuda(in, "input");
            TORCH_CHECK(out.nbytes() == in.nbytes() * g.peers().size(), "hoccl: output must hold world inputs");
            py::gil_scoped_release nogil;
            g.allGather(asStream(stream), ptrOf(out), ptrOf(in), in.nbytes());
          },
          py::arg("out"), py::arg("inp"), py::arg("stream"))
      .def(
          "all_to_all",
          [](CeGroup& g, const at::Tensor& out, const at::Tensor& in, uint64_t stream) {
            checkCuda(out, "output");
            checkCuda(in, "input");
            const size_t world = g.peers().size();
            TORCH_CHECK(out.nbytes() == in.nbytes() && in.nbytes() % world == 0,
                        "hoccl: all_to_all needs equal input/output sizes divisible by world");
            py::gil_scoped_release nogil;
            g.allToAll(asStream(stream), ptrOf(out), ptrOf(in), in.nbytes() / world);
          },
          py::arg("out"), py::arg("inp"), py::arg("stream"))
      .def(
          "broadcast",
          [](CeGroup& g, const at::Tensor& t, int root, uint64_t stream) {
            checkCuda(t, "tensor");
            py::gil_scoped_release nogil;
            g.broadcast(asStream(stream), ptrOf(t), t.nbytes(), root);
          },
          py::arg("tensor"), py::arg("root"), py::arg("stream"))
      .def(
          "all_reduce",
          [](CeGroup& g, const at::Tensor& t, const std::string& op, double factor, uint64_t stream) {
            checkCuda(t, "tensor");
            RedOp r = parseOp(op);
            py::gil_scoped_release nogil;
            g.allReduce(asStream(stream), ptrOf(t), t.numel(), t.scalar_type(), r, factor);
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("factor") = 1.0, py::arg("stream") = 0)
      .def(
          "all_gather_raw",
          [](CeGroup& g, uint64_t out, uint64_t in, size_t bytes, uint64_t s) { g.allGather(asStream(s), out, in, bytes); },
          py::arg("out"), py::arg("inp"), py::arg("bytes"), py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def(
          "all_to_all_raw",
          [](CeGroup& g, uint64_t out, uint64_t in, size_t blockBytes, uint64_t s) {
            g.allToAll(asStream(s), out, in, blockBytes);
          },
          py::arg("out"), py::arg("inp"), py::arg("block_bytes"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "broadcast_raw",
          [](CeGroup& g, uint64_t buf, size_t bytes, int root, uint64_t s) { g.broadcast(asStream(s), buf, bytes, root); },
          py::arg("buf"), py::arg("bytes"), py::arg("root"), py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def(
          "all_reduce_raw",
          [](CeGroup& g, uint64_t buf, int64_t count, const at::Tensor& like, const std::string& op, double factor,
             uint64_t s) {
            RedOp r = parseOp(op);
            c10::ScalarType dtype = like.scalar_type();
            py::gil_scoped_release nogil;
            g.allReduce(asStream(s), buf, count, dtype, r, factor);
          },
          py::arg("buf"), py::arg("count"), py::arg("like"), py::arg("op"), py::arg("factor"), py::arg("stream"))
      .def(
          "synchronize", [](CeGroup& g, double seconds) { g.synchronize(std::chrono::milliseconds(int64_t(seconds * 1e3))); },
          py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
          "Watchdog: wait for the group's last op; on timeout raise naming the unsatisfied flags.")
      .def("flag_state", &CeGroup::flagState)
      .def("ipc_mappings", &CeGroup::ipcMappings)
      .def("ipc_store_keys", &CeGroup::ipcStoreKeys)
      .def("paths", &CeGroup::describePaths)
      .def("last_algo", &CeGroup::lastAlgo, "The algorithm of the last op's plan, e.g. 'allreduce/rs-ag'.");
  bindRaw(m);
#endif
}
