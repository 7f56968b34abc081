#include "backend/work.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace hoccl {

WorkHOCCL::WorkHOCCL(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs_)
    if (!t.device().is_cpu()) devices.push_back(t.device());
  future_ = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), devices);
}

void WorkHOCCL::complete(std::exception_ptr error, int sourceRank) {
  sourceRank_ = sourceRank;
  // CUDA: the future records its events on the comm stream, so consumers wait on the op.
  c10::OptionalStreamGuard guard(commStream_);
  if (error) future_->setError(error);
  else future_->markCompleted(c10::IValue(outputs_));
  finish(error);
}

WorkGroupHOCCL::WorkGroupHOCCL(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {}

bool WorkGroupHOCCL::isCompleted() {
  for (auto& w : works_)
    if (!w->isCompleted()) return false;
  return true;
}

bool WorkGroupHOCCL::wait(std::chrono::milliseconds timeout) {
  for (auto& w : works_) w->wait(timeout);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkGroupHOCCL::getFuture() {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  for (auto& w : works_) futures.push_back(w->getFuture());
  auto all = c10::collectAll(c10::List<c10::intrusive_ptr<c10::ivalue::Future>>(futures));
  std::vector<at::Tensor> outputs;
  for (auto& w : works_)
    for (auto& t : w->result()) outputs.push_back(t);
  return all->then([outputs](c10::ivalue::Future&) { return c10::IValue(outputs); },
                   c10::ListType::create(c10::TensorType::get()));
}

}  // namespace hoccl
