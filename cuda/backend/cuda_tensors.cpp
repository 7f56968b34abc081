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
//    arithmetic is the bounded reduction kernel or the host (HOCCL_REDUCE_ON). Its plans are
//    buildPlan's (plan/), as for the CPU executor, so one rule chooses every algorithm.
//  - host staging: every other op (and non-contiguous tensors): D2H on the comm stream (a
//    copy engine), the CPU algorithm on the host copies, H2D back on the comm stream.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "backend/cuda_staging.h"
#include "backend/multihost/host_span.h"
#include "backend/process_group.h"
#include "plan/plan.h"

#ifdef HOCCL_WITH_CUDA
#include "transport/ce/ce_collectives.h"
#include "transport/ce/cuda_driver.h"
#endif

namespace hoccl {

bool ProcessGroupHOCCL::anyCuda(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (t.defined() && t.is_cuda()) return true;
  return false;
}

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

c10::Stream ProcessGroupHOCCL::commStream(c10::Device device) { return staging::commStreamOn(comm_, device, rank_); }

void* ProcessGroupHOCCL::ceGroup(c10::Device device) {
#ifdef HOCCL_WITH_CUDA
  if (!ce_) {
    auto opts = CeGroupOptions::fromEnv();
    opts.timeout = timeout_;
    ce_ = std::make_shared<CeGroup>(hostStore_, "hoccl/ce", localRank_, localSize_, device.index(), opts,
                                    PlanRule{buildPlan, readsPeersDirectly});
  }
  return ce_.get();
#else
  TORCH_CHECK(false, "hoccl: built without CUDA headers; the copy-engine transport is unavailable");
#endif
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::enqueueCuda(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                                                              const std::vector<at::Tensor>& outputs,
                                                              std::function<void(c10::Stream)> deviceBody) {
  c10::Device device = outputs.empty() ? inputs.at(0).device() : outputs[0].device();
  c10::Stream comm = commStream(device);
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  staging::orderAfterCaller(comm, all, c10d::opTypeToString(type));
  auto work = c10::make_intrusive<WorkHOCCL>(rank_, type, outputs);
  issued_.fetch_add(1);
  work->setCommStream(comm);
  auto end = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
  Body body = [comm, deviceBody, end, work] {
    c10::StreamGuard guard(comm);
    deviceBody(comm);
    end->record(comm);
    work->setEndEvent(end);
  };
  queue_.submit(work, std::move(body), false);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::enqueueCudaViaHost(
    c10d::OpType type, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
    std::function<void(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)> hostBody) {
  staging::HostMirrors mirrors;
  std::vector<at::Tensor> hostIns = mirrors.of(inputs), hostOuts = mirrors.of(outputs);
  auto cpuOp = [hostBody, hostIns, hostOuts] { hostBody(hostIns, hostOuts); };
  staging::checkOnMirrors(this, cpuOp, c10d::opTypeToString(type), rank_);
  return enqueueCuda(type, inputs, outputs, [this, inputs, outputs, hostIns, hostOuts, cpuOp](c10::Stream comm) {
    staging::runViaMirrors(comm, inputs, outputs, hostIns, hostOuts, this, cpuOp);
  });
}

std::optional<c10::intrusive_ptr<c10d::Work>> ProcessGroupHOCCL::tryCuda(
    const char* op, c10d::OpType type, std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
    std::function<void(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)> hostBody,
    std::function<void(c10::Stream)> ceBody) {
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  std::optional<c10::Device> cuda = staging::cudaDeviceOf(all, op, rank_);
  if (!cuda) return std::nullopt;
  [[maybe_unused]] const c10::Device device = *cuda;  // the copy-engine path's (CUDA builds only)
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

std::optional<c10::intrusive_ptr<c10d::Work>> ProcessGroupHOCCL::routeCuda(
    const char* op, c10d::OpType type, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
    HostCall call, std::function<void(c10::Stream)> ceBody) {
  if (span_) return span_->viaHost(op, type, inputs, outputs, std::move(call));
  return tryCuda(op, type, inputs, outputs,
                 [call](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) { call(hi, ho); },
                 std::move(ceBody));
}

at::Tensor ProcessGroupHOCCL::cudaHostMirror(const at::Tensor& t, bool copyIn) {
  return staging::hostMirror(commStream(t.device()), t, copyIn);
}

void ProcessGroupHOCCL::finishCudaRecv(const at::Tensor& user, const at::Tensor& host, c10::Stream comm,
                                       WorkHOCCL& work) {
  work.setEndEvent(staging::copyBackAfterRecv(user, host, comm));
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
                                               static_cast<size_t>(in.numel() * in.element_size()) / localSize_);
  };
}
#else
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllReduce(at::Tensor, RedOp, double) { return nullptr; }
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllGather(at::Tensor, at::Tensor) { return nullptr; }
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceBroadcast(at::Tensor, int) { return nullptr; }
std::function<void(c10::Stream)> ProcessGroupHOCCL::ceAllToAll(at::Tensor, at::Tensor) { return nullptr; }
#endif

}  // namespace hoccl
