// The stream manager's CPU side: a process group's ops run one at a time in issue order, on the
// group's worker thread or, when nothing is queued or running, on the caller's thread (the caller
// asks for that when it would only block in wait() meanwhile: two thread hand-offs cost more
// than a small op). Every member of the group issues its ops in the same order, so every
// transport sees them in that order on every rank. Both backends hold one.
#pragma once
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backend/work.h"

namespace hoccl {

class OpQueue {
 public:
  using Body = std::function<void()>;
  // How an op run on the caller's thread is run (e.g. under a spin floor); it must call `run`.
  using AroundInline = std::function<void(const std::function<void()>& run)>;

  explicit OpQueue(int rank) : rank_(rank) {}
  ~OpQueue() { stop(); }
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  void start();
  // Runs `body` and completes `work` with its outcome. With `mayRunHere` and nothing queued,
  // running or coalescing, on this thread before returning; else on the worker. Joins the
  // coalesced group either way. Throws once the queue is stopped.
  void submit(const c10::intrusive_ptr<WorkHOCCL>& work, Body body, bool mayRunHere,
              const AroundInline& around = nullptr);
  // Runs `fn` on this thread at once when nothing is queued, running or coalescing (issue order
  // holds) and returns true; returns false, running nothing, otherwise. No Work: for callers that
  // would only wait on it (the direct all_reduce). Its exceptions reach the caller.
  template <class Fn>
  bool runIfIdle(Fn&& fn);
  // A work that another engine completes (send/recv) joins the coalesced group, if one is open.
  void track(const c10::intrusive_ptr<c10d::Work>& work);
  void startCoalescing();
  c10::intrusive_ptr<c10d::Work> endCoalescing();
  // Runs what is queued, then joins the worker. Idempotent: true for the call that stopped it
  // (its owner's shutdown goes on only then).
  bool stop();

 private:
  static void run(const c10::intrusive_ptr<WorkHOCCL>& work, const Body& body);
  // After an op ran on a caller's thread: the queue is free again; wakes the worker if ops
  // queued up meanwhile.
  void endInline();
  // Nothing queued, running or coalescing: an op may run on its caller's thread (mutex_ held).
  bool idle() const { return queue_.empty() && !busy_ && !coalescing_; }
  void workerLoop();

  int rank_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<c10::intrusive_ptr<WorkHOCCL>, Body>> queue_;
  bool stopping_ = false;
  bool busy_ = false;  // an op is running (on the worker or a caller's thread)
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  std::thread worker_;
};

template <class Fn>
bool OpQueue::runIfIdle(Fn&& fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "hoccl: rank ", rank_, ": the process group was shut down");
    if (!idle()) return false;
    busy_ = true;
  }
  try {
    fn();
  } catch (...) {
    endInline();
    throw;
  }
  endInline();
  return true;
}

}  // namespace hoccl
