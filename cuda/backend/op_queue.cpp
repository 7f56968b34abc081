#include "backend/op_queue.h"

namespace hoccl {

void OpQueue::start() { worker_ = std::thread([this] { workerLoop(); }); }

void OpQueue::run(const c10::intrusive_ptr<WorkHOCCL>& work, const Body& body) {
  try {
    body();
    work->complete(nullptr);
  } catch (...) {
    work->complete(std::current_exception());
  }
}

void OpQueue::submit(const c10::intrusive_ptr<WorkHOCCL>& work, Body body, bool mayRunHere,
                     const AroundInline& around) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "hoccl: rank ", rank_, ": the process group was shut down");
    if (coalescing_) coalesced_.push_back(work);
    // Issue order holds: nothing is queued or running.
    if (!(mayRunHere && idle())) {
      queue_.emplace_back(work, std::move(body));
      cv_.notify_one();
      return;
    }
    busy_ = true;
  }
  if (around)
    around([&] { run(work, body); });
  else
    run(work, body);
  endInline();
}

void OpQueue::endInline() {
  bool wakeWorker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    // Waking the worker for nothing costs a context switch per op on a busy core.
    wakeWorker = !queue_.empty() || stopping_;
  }
  if (wakeWorker) cv_.notify_one();
}

void OpQueue::workerLoop() {
  while (true) {
    std::pair<c10::intrusive_ptr<WorkHOCCL>, Body> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return !busy_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    run(task.first, task.second);
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
  }
}

void OpQueue::track(const c10::intrusive_ptr<c10d::Work>& work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (coalescing_) coalesced_.push_back(work);
}

void OpQueue::startCoalescing() {
  std::lock_guard<std::mutex> lock(mutex_);
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> OpQueue::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    coalescing_ = false;
    works.swap(coalesced_);
  }
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

bool OpQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  return true;
}

}  // namespace hoccl
