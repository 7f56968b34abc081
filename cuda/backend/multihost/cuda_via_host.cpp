// CUDA tensors in a group spanning hosts, staged through pinned host memory: the comm stream
// waits on the caller's stream, copy engines move the bytes D2H, the CPU hierarchical algorithm
// runs over the host copies (its local legs on shared memory, its cross-host legs on gloo), and
// copy engines move the result H2D; Work.wait() makes the caller's stream wait on the op's end
// event. No kernel is launched for data movement; reductions run on the CPU. The ordering is the
// single-host group's (cuda_staging.h), and so is the host's blocking: a send waits for its D2H
// before the transfer is posted, a recv's wait() for its H2D after the payload arrived.
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "backend/cuda_staging.h"
#include "backend/multihost/host_span.h"

namespace hoccl {

namespace {

// A recv of a CUDA tensor: the payload lands in the host mirror; wait() then copies it H2D on
// the comm stream and makes the caller's stream wait for that copy. (The framed recv itself
// completes in wait() only, so the copy cannot start earlier.)
class CudaRecvWork : public c10d::Work {
 public:
  CudaRecvWork(int rank, c10::intrusive_ptr<c10d::Work> payload, at::Tensor user, at::Tensor host, c10::Stream comm)
      : c10d::Work(rank, c10d::OpType::RECV),
        payload_(std::move(payload)),
        user_(std::move(user)),
        host_(std::move(host)),
        comm_(comm) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(waitMutex_);
    return end_ && end_->query();
  }
  int sourceRank() const override { return payload_->sourceRank(); }
  std::vector<at::Tensor> result() override { return {user_}; }

  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(waitMutex_);
    if (!end_) {
      payload_->wait(timeout);
      end_ = staging::copyBackAfterRecv(user_, host_, comm_);
      host_ = at::Tensor();
    }
    end_->block(c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(comm_.device()));
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> payload_;
  at::Tensor user_, host_;
  c10::Stream comm_;
  std::mutex waitMutex_;
  std::shared_ptr<c10::Event> end_;
};

}  // namespace

std::optional<c10::intrusive_ptr<c10d::Work>> HostSpan::viaHost(const char* op, c10d::OpType type,
                                                                      const std::vector<at::Tensor>& inputs,
                                                                      const std::vector<at::Tensor>& outputs,
                                                                      HostCall call) {
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  std::optional<c10::Device> device = staging::cudaDeviceOf(all, op, rank_);
  if (!device) return std::nullopt;
  c10::Stream comm = staging::commStreamOn(comm_, *device, rank_);
  staging::HostMirrors mirrors;
  std::vector<at::Tensor> hostIns = mirrors.of(inputs), hostOuts = mirrors.of(outputs);
  auto cpuOp = [call, hostIns, hostOuts] { call(hostIns, hostOuts); };
  staging::checkOnMirrors(this, cpuOp, op, rank_);
  staging::orderAfterCaller(comm, all, op);
  auto end = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
  Body body = [this, comm, inputs, outputs, hostIns, hostOuts, cpuOp, end] {
    staging::runViaMirrors(comm, inputs, outputs, hostIns, hostOuts, this, cpuOp);
    end->record(comm);
  };
  auto work = c10::static_intrusive_pointer_cast<WorkHOCCL>(enqueue(type, outputs, std::move(body)));
  // Read only by wait()/isCompleted(), which see the event once the worker completed the work.
  work->setCommStream(comm);
  work->setEndEvent(end);
  return work;
}

std::optional<c10::intrusive_ptr<c10d::Work>> HostSpan::p2pViaHost(bool isSend, const at::Tensor& t, int peer,
                                                                         int tag) {
  if (!t.defined() || !t.is_cuda()) return std::nullopt;
  c10::Stream comm = staging::commStreamOn(comm_, t.device(), rank_);
  at::Tensor host = staging::hostMirror(comm, t, isSend);
  if (isSend) return framed_->send(host, peer, tag);
  auto received = peer < 0 ? anySource(host, tag) : framed_->recv(host, peer, tag);
  return c10::make_intrusive<CudaRecvWork>(rank_, received, t, host, comm);
}

}  // namespace hoccl
