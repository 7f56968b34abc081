#include "backend/work.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace hoccl {

namespace {
c10::intrusive_ptr<c10::ivalue::Future> newFuture(const std::vector<c10::Device>& devices) {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
}
}  // namespace

WorkHOCCL::WorkHOCCL(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs_)
    if (!t.device().is_cpu()) devices.push_back(t.device());
  if (!devices.empty()) future_ = newFuture(devices);
}

// Exactly one of complete() and getFuture() settles the future: whichever finds both the future
// and the result there. Settling runs callbacks, so it happens outside the lock.
c10::intrusive_ptr<c10::ivalue::Future> WorkHOCCL::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  bool settleHere = false;
  {
    std::lock_guard<std::mutex> lock(futureMutex_);
    if (!future_) {
      future_ = newFuture({});
      settleHere = done_;
    }
    future = future_;
  }
  if (settleHere) settle(future);
  return future;
}

void WorkHOCCL::complete(std::exception_ptr error, int sourceRank) {
  sourceRank_ = sourceRank;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(futureMutex_);
    done_ = true;
    error_ = error;
    future = future_;
  }
  if (future) settle(future);
  finish(error);
}

void WorkHOCCL::settle(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  // CUDA: the future records its events on the comm stream, so consumers wait on the op.
  c10::OptionalStreamGuard guard(commStream_);
  if (error_) future->setError(error_);
  else future->markCompleted(c10::IValue(outputs_));
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
