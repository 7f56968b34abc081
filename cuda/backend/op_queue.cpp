#include "backend/process_group.h"
#include "transport/shm/futex_wait.h"

#include <algorithm>

namespace hoccl {

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                          Body body, int64_t bytes, bool callerWaits) {
  // A caller that blocks in wait() right after gains nothing from the worker thread and pays two
  // cross-core wake-ups (tens of microseconds each on a virtual machine). CUDA tensors keep the
  // worker: their wait() must not block the host.
  callerWaits = callerWaits && std::all_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) {
    return t.device().is_cpu();
  });
  auto work = c10::make_intrusive<WorkHOCCL>(rank_, type, std::move(outputs));
  issued_.fetch_add(1);
  if (capturing()) {  // host mirrors of a CUDA op: hand the body to the CUDA stream manager
    storeCapture(std::move(body));
    return work;
  }
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    TORCH_CHECK(!stopping_, "hoccl: rank ", rank_, ": the process group was shut down");
    if (coalescing_) coalesced_.push_back(work);
    // A small op with nothing ahead of it runs right here: two thread hand-offs cost more than
    // the op itself. Issue order is kept because nothing is queued or running.
    bool runHere = (bytes <= config_.inlineMaxBytes || callerWaits) && queue_.empty() && !busy_ && !coalescing_;
    if (!runHere) {
      queue_.emplace_back(work, std::move(body));
      queueCv_.notify_one();
      return work;
    }
    busy_ = true;
  }
  {
    const int64_t callerSpin = coresShared() ? config_.sharedCallerSpinMicros : config_.callerSpinMicros;
    SpinAtLeast spin(std::chrono::microseconds(callerWaits ? callerSpin : 0));
    runTask(work, body);
  }
  bool wakeWorker;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    busy_ = false;
    // Waking the worker for nothing costs a context switch per op on a busy core.
    wakeWorker = !queue_.empty() || stopping_;
  }
  if (wakeWorker) queueCv_.notify_one();
  return work;
}

void ProcessGroupHOCCL::runTask(const c10::intrusive_ptr<WorkHOCCL>& work, const Body& body) {
  try {
    body();
    work->complete(nullptr);
  } catch (...) {
    work->complete(std::current_exception());
  }
}

void ProcessGroupHOCCL::workerLoop() {
  while (true) {
    std::pair<c10::intrusive_ptr<WorkHOCCL>, Body> task;
    {
      std::unique_lock<std::mutex> lock(queueMutex_);
      queueCv_.wait(lock, [&] { return (stopping_ && !busy_) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    runTask(task.first, task.second);
    {
      std::lock_guard<std::mutex> lock(queueMutex_);
      busy_ = false;
    }
  }
}

void ProcessGroupHOCCL::startCoalescing() {
  std::lock_guard<std::mutex> lock(queueMutex_);
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    coalescing_ = false;
    for (auto& w : coalesced_) works.push_back(w);
    coalesced_.clear();
  }
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

}  // namespace hoccl
