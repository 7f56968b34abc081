// The Work objects hoccl hands back to c10d: one per op, and one for a coalesced group.
#pragma once
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace hoccl {

class WorkHOCCL : public c10d::Work {
 public:
  WorkHOCCL(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override { return sourceRank_; }
  // CUDA ops: wait() blocks the host only until the op is enqueued on the comm stream, then
  // makes the caller's current stream wait for the op's end event (like NCCL).
  bool wait(std::chrono::milliseconds timeout) override;
  bool isCompleted() override;
  void complete(std::exception_ptr error, int sourceRank = -1);
  // Set by the CUDA stream manager before the op runs.
  void setCommStream(c10::Stream comm) { commStream_ = comm; }
  void setEndEvent(std::shared_ptr<c10::Event> end) { endEvent_ = std::move(end); }

 private:
  void settle(const c10::intrusive_ptr<c10::ivalue::Future>& future);

  std::vector<at::Tensor> outputs_;
  // CPU ops make their future on first use: most callers never ask for it, and one costs a type,
  // a list and a mutex per op. CUDA ops make it up front, to complete it on the comm stream.
  std::mutex futureMutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool done_ = false;
  std::exception_ptr error_;
  int sourceRank_ = -1;
  std::optional<c10::Stream> commStream_;
  std::shared_ptr<c10::Event> endEvent_;
};

// Completes when every member completes: what endCoalescing returns.
class WorkGroupHOCCL : public c10d::Work {
 public:
  WorkGroupHOCCL(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);
  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

}  // namespace hoccl
