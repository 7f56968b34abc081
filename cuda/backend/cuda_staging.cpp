#include "backend/cuda_staging.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#ifdef HOCCL_WITH_CUDA
#include "transport/ce/ce_collectives.h"
#include "transport/ce/cuda_driver.h"
#endif

namespace hoccl::staging {

std::optional<c10::Device> cudaDeviceOf(const std::vector<at::Tensor>& tensors, const char* op, int rank) {
  bool any = false;
  for (const auto& t : tensors) any = any || (t.defined() && t.is_cuda());
  if (!any) return std::nullopt;
  std::optional<c10::Device> device;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    TORCH_CHECK(t.is_cuda(), "hoccl ", op, " on rank ", rank, ": mixes CUDA and ", t.device(), " tensors");
    if (!device) device = t.device();
    TORCH_CHECK(t.device() == *device, "hoccl ", op, " on rank ", rank, ": tensors on ", *device, " and ",
                t.device());
  }
  return device;
}

c10::Stream commStreamOn(std::optional<c10::Stream>& comm, c10::Device device, int rank) {
  if (!comm) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    comm = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  }
  TORCH_CHECK(comm->device() == device, "hoccl on rank ", rank, ": this group already uses ", comm->device(),
              " and cannot also move tensors on ", device, " (one device per process group, like NCCL)");
  return *comm;
}

// CUDA graph capture is refused here, on the caller's thread and before the comm stream waits on
// the caller's (capturing) stream: that wait would join the comm stream into the capture, and the
// user would get an unjoined-capture error from capture_end instead of hoccl's reason.
static void refuseCallerCapture(const c10::Stream& current, const std::string& op) {
#ifdef HOCCL_WITH_CUDA
  cu::ContextGuard ctx(current.device_index());
  ceRefuseCapture(reinterpret_cast<CUstream>(current.native_handle()), op.c_str());
#endif
}

void orderAfterCaller(c10::Stream comm, const std::vector<at::Tensor>& tensors, const std::string& op) {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  c10::Stream current = impl.getStream(comm.device());
  refuseCallerCapture(current, op);
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(current);
  ready.block(comm);
  for (const auto& t : tensors)
    if (t.defined() && t.is_cuda()) t.record_stream(comm);
}

at::Tensor pinnedLike(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
}

at::Tensor hostMirror(c10::Stream comm, const at::Tensor& t, bool copyIn) {
  orderAfterCaller(comm, {t}, copyIn ? "send" : "recv");
  at::Tensor host = pinnedLike(t);
  if (copyIn) {
    c10::StreamGuard guard(comm);
    host.copy_(t, /*non_blocking=*/true);
    c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).synchronizeStream(comm);
  }
  return host;
}

at::Tensor HostMirrors::of(const at::Tensor& t) {
  if (!t.defined()) return t;
  auto it = mirror_.find(t.unsafeGetTensorImpl());
  if (it != mirror_.end()) return it->second;
  at::Tensor h = pinnedLike(t);
  mirror_.emplace(t.unsafeGetTensorImpl(), h);
  return h;
}

std::vector<at::Tensor> HostMirrors::of(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(of(t));
  return out;
}

void copyAll(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  for (size_t i = 0; i < dst.size(); ++i)
    if (dst[i].defined()) dst[i].copy_(src[i], /*non_blocking=*/true);
}

std::shared_ptr<c10::Event> copyBackAfterRecv(const at::Tensor& user, const at::Tensor& host, c10::Stream comm) {
  c10::StreamGuard guard(comm);
  user.copy_(host, /*non_blocking=*/true);
  auto end = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
  end->record(comm);
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).synchronizeStream(comm);  // host mirror dies after this
  return end;
}

namespace {

// The group capturing on this thread, and where its bodies go; restored on exit, so a capture
// inside a capture (an entry point that calls another) ends where it began.
struct Capture {
  const void* owner = nullptr;
  std::vector<Body>* bodies = nullptr;
};
thread_local Capture capture;

}  // namespace

std::vector<Body> captureBodies(const void* owner, const std::function<void()>& run) {
  std::vector<Body> bodies;
  const Capture saved = capture;
  capture = {owner, &bodies};
  try {
    run();
  } catch (...) {
    capture = saved;
    throw;
  }
  capture = saved;
  return bodies;
}

void checkOnMirrors(const void* owner, const std::function<void()>& run, const std::string& op, int rank) {
  TORCH_CHECK(!captureBodies(owner, run).empty(), "hoccl ", op, " on rank ", rank,
              ": internal error: the op queued nothing over the host mirrors of its CUDA tensors");
}

bool capturing(const void* owner) { return owner != nullptr && capture.owner == owner; }

bool captured(const void* owner, Body& body) {
  if (!capturing(owner)) return false;
  capture.bodies->push_back(std::move(body));
  return true;
}

void runViaMirrors(c10::Stream comm, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                   const std::vector<at::Tensor>& hostIns, const std::vector<at::Tensor>& hostOuts,
                   const void* owner, const std::function<void()>& cpuOp) {
  c10::StreamGuard guard(comm);
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  copyAll(hostIns, inputs);  // D2H: copy engine
  impl.synchronizeStream(comm);
  for (const auto& body : captureBodies(owner, cpuOp)) body();
  copyAll(outputs, hostOuts);  // H2D: copy engine
  impl.synchronizeStream(comm);  // the pinned mirrors must outlive the H2D copies
}

}  // namespace hoccl::staging
