// The CUDA side of ProcessGroupHOCCL: the stream manager and the routing of CUDA tensors.
//
// Ordering: the comm stream waits on an event recorded on the caller's current stream, so a
// kernel that wrote the input before the collective is seen; the op ends with an event that
// Work.wait() makes the caller's current stream wait on, so a kernel that reads the output
// after it sees the result. Tensors are record_stream()-ed on the comm stream.
//
// Transports:
//  - copy-engine (cuda-ce, CeGroup): all_reduce, all_gather_into_tensor, broadcast and even
//    all_to_all_single on contiguous tensors. Zero SM for data movement; all_reduce's
//    arithmetic is the bounded reduction kernel or the host (HOCCL_REDUCE_ON).
//  - host staging: every other op (and non-contiguous tensors): D2H on the comm stream (a
//    copy engine), the CPU algorithm on the host copies, H2D back on the comm stream.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <unordered_map>

#include "backend/process_group.h"

#ifdef HOCCL_WITH_CUDA
#include "transport/ce/ce_collectives.h"
#include "transport/ce/cuda_driver.h"
#endif

namespace hoccl {

namespace {
thread_local std::function<void()>* captureSlot = nullptr;  // see captureBody

}  // namespace

bool ProcessGroupHOCCL::anyCuda(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (t.defined() && t.is_cuda()) return true;
  return false;
}

bool ProcessGroupHOCCL::capturing() { return captureSlot != nullptr; }

void ProcessGroupHOCCL::storeCapture(Body body) { *captureSlot = std::move(body); }

bool WorkHOCCL::wait(std::chrono::milliseconds timeout) {
  c10d::Work::wait(timeout);  // host: until the op ran (CPU) or was enqueued (CUDA)
  if (endEvent_ && commStream_) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    endEvent_->block(impl.getStream(commStream_->device()));
  }
  return true;
}

bool WorkHOCCL::isCompleted() {
  if (!c10d::Work::isCompleted()) return false;
  return !endEvent_ || endEvent_->query();
}

c10::Stream ProcessGroupHOCCL::commStream(c10::Device device) {
  if (!comm_) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    comm_ = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  }
  TORCH_CHECK(comm_->device() == device, "hoccl on rank ", rank_, ": this group already uses ", comm_->device(),
              " and cannot also move tensors on ", device, " (one device per process group, like NCCL)");
  return *comm_;
}

void* ProcessGroupHOCCL::ceGroup(c10::Device device) {
#ifdef HOCCL_WITH_CUDA
  if (!ce_) {
    auto opts = CeGroupOptions::fromEnv();
    opts.timeout = timeout_;
    ce_ = std::make_shared<CeGroup>(store_, "hoccl/ce", rank_, size_, device.index(), opts);
  }
  return ce_.get();
#else
  TORCH_CHECK(false, "hoccl: built without CUDA headers; the copy-engine transport is unavailable");
#endif
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

// Shared prologue: order the comm stream after the caller's stream and keep tensors alive.
static c10::Stream orderAfterCaller(c10::Stream comm, const std::vector<at::Tensor>& tensors, const std::string& op) {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  c10::Stream current = impl.getStream(comm.device());
  refuseCallerCapture(current, op);
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(current);
  ready.block(comm);
  for (const auto& t : tensors)
    if (t.defined() && t.is_cuda()) t.record_stream(comm);
  return comm;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::enqueueCuda(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                                                              const std::vector<at::Tensor>& outputs,
                                                              std::function<void(c10::Stream)> deviceBody) {
  c10::Device device = outputs.empty() ? inputs.at(0).device() : outputs[0].device();
  c10::Stream comm = commStream(device);
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  orderAfterCaller(comm, all, c10d::opTypeToString(type));
  auto work = c10::make_intrusive<WorkHOCCL>(rank_, type, outputs);
  work->setCommStream(comm);
  auto end = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
  Body body = [comm, deviceBody, end, work] {
    c10::StreamGuard guard(comm);
    deviceBody(comm);
    end->record(comm);
    work->setEndEvent(end);
  };
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    TORCH_CHECK(!stopping_, "hoccl: rank ", rank_, ": the process group was shut down");
    if (coalescing_) coalesced_.push_back(work);
    queue_.emplace_back(work, std::move(body));
  }
  queueCv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::enqueueCudaViaHost(
    c10d::OpType type, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
    std::function<void(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)> hostBody) {
  // Host mirrors; a tensor that is both input and output (in-place ops) gets one mirror.
  std::unordered_map<c10::TensorImpl*, at::Tensor> mirror;
  auto hostOf = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    auto it = mirror.find(t.unsafeGetTensorImpl());
    if (it != mirror.end()) return it->second;
    at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    mirror.emplace(t.unsafeGetTensorImpl(), h);
    return h;
  };
  std::vector<at::Tensor> hostIns, hostOuts;
  for (const auto& t : inputs) hostIns.push_back(hostOf(t));
  for (const auto& t : outputs) hostOuts.push_back(hostOf(t));
  // The CPU op's own checks run now, on the caller's thread; its body is captured, not queued.
  Body cpuBody;
  captureSlot = &cpuBody;
  try {
    hostBody(hostIns, hostOuts);
  } catch (...) {
    captureSlot = nullptr;
    throw;
  }
  captureSlot = nullptr;
  TORCH_CHECK(cpuBody, "hoccl: internal error: no host body captured");
  return enqueueCuda(type, inputs, outputs, [inputs, outputs, hostIns, hostOuts, cpuBody](c10::Stream comm) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined()) hostIns[i].copy_(inputs[i], /*non_blocking=*/true);  // D2H: copy engine
    impl.synchronizeStream(comm);
    cpuBody();
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].defined()) outputs[i].copy_(hostOuts[i], /*non_blocking=*/true);  // H2D: copy engine
    // The pinned mirrors must outlive the H2D copies.
    impl.synchronizeStream(comm);
  });
}

std::optional<c10::intrusive_ptr<c10d::Work>> ProcessGroupHOCCL::tryCuda(
    const char* op, c10d::OpType type, std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
    std::function<void(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)> hostBody,
    std::function<void(c10::Stream)> ceBody) {
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  if (!anyCuda(all)) return std::nullopt;
  c10::Device device = c10::Device(c10::DeviceType::CUDA, 0);
  bool first = true;
  for (const auto& t : all) {
    if (!t.defined()) continue;
    TORCH_CHECK(t.is_cuda(), "hoccl ", op, " on rank ", rank_, ": mixes CUDA and ", t.device(), " tensors");
    if (first) device = t.device();
    TORCH_CHECK(t.device() == device, "hoccl ", op, " on rank ", rank_, ": tensors on ", device, " and ",
                t.device());
    first = false;
  }
  bool contiguous = true;
  for (const auto& t : all) contiguous = contiguous && (!t.defined() || t.is_contiguous());
#ifdef HOCCL_WITH_CUDA
  if (ceBody && contiguous && !config_.cudaViaHostOnly) {
    int index = device.index();
    return enqueueCuda(type, inputs, outputs, [this, ceBody, device, index](c10::Stream s) {
      cu::ContextGuard ctx(index);
      ceGroup(device);
      ceBody(s);
    });
  }
#endif
  return enqueueCudaViaHost(type, inputs, outputs, hostBody);
}

at::Tensor ProcessGroupHOCCL::cudaHostMirror(const at::Tensor& t, bool copyIn) {
  c10::Stream comm = commStream(t.device());
  orderAfterCaller(comm, {t}, copyIn ? "send" : "recv");
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  if (copyIn) {
    c10::StreamGuard guard(comm);
    host.copy_(t, /*non_blocking=*/true);
    c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).synchronizeStream(comm);
  }
  return host;
}

void ProcessGroupHOCCL::finishCudaRecv(const at::Tensor& user, const at::Tensor& host, c10::Stream comm,
                                       WorkHOCCL& work) {
  c10::StreamGuard guard(comm);
  user.copy_(host, /*non_blocking=*/true);
  auto end = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
  end->record(comm);
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).synchronizeStream(comm);  // host mirror dies after this
  work.setEndEvent(end);
}

#ifdef HOCCL_WITH_CUDA
// Copy-engine bodies, used by the op entry points in process_group.cpp.
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllReduce(at::Tensor t, RedOp op, double factor) {
  return [this, t, op, factor](c10::Stream s) {
    static_cast<CeGroup*>(ce_.get())->allReduce(reinterpret_cast<CUstream>(s.native_handle()),
                                                reinterpret_cast<CUdeviceptr>(t.data_ptr()), t.numel(),
                                                t.scalar_type(), op, factor);
  };
}
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllGather(at::Tensor out, at::Tensor in) {
  return [this, out, in](c10::Stream s) {
    static_cast<CeGroup*>(ce_.get())->allGather(reinterpret_cast<CUstream>(s.native_handle()),
                                                reinterpret_cast<CUdeviceptr>(out.data_ptr()),
                                                reinterpret_cast<CUdeviceptr>(in.data_ptr()),
                                                static_cast<size_t>(in.numel() * in.element_size()));
  };
}
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceBroadcast(at::Tensor t, int root) {
  return [this, t, root](c10::Stream s) {
    static_cast<CeGroup*>(ce_.get())->broadcast(reinterpret_cast<CUstream>(s.native_handle()),
                                                reinterpret_cast<CUdeviceptr>(t.data_ptr()),
                                                static_cast<size_t>(t.numel() * t.element_size()), root);
  };
}
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllToAll(at::Tensor out, at::Tensor in) {
  return [this, out, in](c10::Stream s) {
    static_cast<CeGroup*>(ce_.get())->allToAll(reinterpret_cast<CUstream>(s.native_handle()),
                                               reinterpret_cast<CUdeviceptr>(out.data_ptr()),
                                               reinterpret_cast<CUdeviceptr>(in.data_ptr()),
                                               static_cast<size_t>(in.numel() * in.element_size()) / size_);
  };
}
#else
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllReduce(at::Tensor, RedOp, double) { return nullptr; }
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllGather(at::Tensor, at::Tensor) { return nullptr; }
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceBroadcast(at::Tensor, int) { return nullptr; }
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllToAll(at::Tensor, at::Tensor) { return nullptr; }
#endif

}  // namespace hoccl
