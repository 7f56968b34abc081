#include "transport/net/gloo/gloo_net_transport.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <stdexcept>
#include <thread>

namespace hoccl {

// One posted transfer. started/finished/error are guarded by Waiters::mutex.
struct GlooNetTransport::Transfer {
  bool isSend = false;
  int peer = -1;
  size_t bytes = 0;
  at::Tensor view;  // the caller's bytes
  c10::intrusive_ptr<c10d::Work> work;
  // gloo's budget for the transfer runs from here, whichever thread waits and when.
  std::chrono::steady_clock::time_point deadline;

  // What is left of the budget, as gloo's wait takes it (0 would mean gloo's own default).
  std::chrono::milliseconds remaining() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  bool started = false;   // a thread (a waiter, or wait()'s caller) owns the blocking wait
  bool finished = false;  // the work's wait returned or threw (error)
  std::exception_ptr error;
};

// The threads that block on framed works. Shared with them, so a thread still waiting when the
// transport goes keeps what it touches alive; idle threads leave when the transport closes it.
struct GlooNetTransport::Waiters : std::enable_shared_from_this<Waiters> {
  std::mutex mutex;
  std::condition_variable jobsReady;  // for the threads
  std::condition_variable finished;   // for wait() and cancel()
  std::deque<std::shared_ptr<Transfer>> jobs;
  size_t idle = 0;
  bool closing = false;

  // Under `mutex`. A job never queues behind another: a thread is started unless enough idle
  // ones exist (a blocked wait must not hold up a transfer the caller needs first).
  void submit(const std::shared_ptr<Transfer>& t) {
    t->started = true;
    jobs.push_back(t);
    if (jobs.size() > idle) std::thread([self = shared_from_this()] { self->loop(); }).detach();
    jobsReady.notify_one();
  }

  void loop() {
    pthread_setname_np(pthread_self(), "hoccl-netwait");
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      ++idle;
      jobsReady.wait(lock, [&] { return closing || !jobs.empty(); });
      --idle;
      if (jobs.empty()) return;
      std::shared_ptr<Transfer> t = std::move(jobs.front());
      jobs.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        t->work->wait(t->remaining());
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      t->error = error;
      t->finished = true;
      finished.notify_all();
    }
  }
};

namespace {

std::string firstLine(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10 ? c10->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n'));
}

// The framed engine's messages start "hoccl send on rank R to rank P: " or "hoccl recv on rank R
// [from rank P]: "; ours say that with the peer's name, so keep only what follows.
std::string reasonOf(const std::string& message) {
  for (const char* prefix : {"hoccl send on rank ", "hoccl recv on rank "}) {
    if (message.rfind(prefix, 0) != 0) continue;
    auto colon = message.find(": ");
    if (colon != std::string::npos) return message.substr(colon + 2);
  }
  return message;
}

}  // namespace

GlooNetTransport::GlooNetTransport(std::shared_ptr<FramedP2P> framed, int world, PeerNamer peerName, int callerRank)
    : framed_(std::move(framed)),
      world_(world),
      peerName_(std::move(peerName)),
      callerRank_(callerRank),
      waiters_(std::make_shared<Waiters>()) {
  if (!framed_) throw std::invalid_argument("hoccl: a gloo network transport needs its framed engine");
}

GlooNetTransport::~GlooNetTransport() {
  std::lock_guard<std::mutex> lock(waiters_->mutex);
  waiters_->closing = true;
  waiters_->jobsReady.notify_all();
}

std::string GlooNetTransport::peerName(int peer) const {
  return peerName_ ? peerName_(peer) : "rank " + std::to_string(peer);
}

std::string GlooNetTransport::describe(const Transfer& t) const {
  return std::string("hoccl network ") + (t.isSend ? "send" : "recv") + " on rank " +
         std::to_string(callerRank_ >= 0 ? callerRank_ : rank()) +
         (t.isSend ? " to " : " from ") + peerName(t.peer);
}

std::string GlooNetTransport::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

void GlooNetTransport::checkPeer(const Transfer& t) const {
  if (t.peer < 0 || t.peer >= world_ || t.peer == rank())
    throw std::invalid_argument(std::string("hoccl network ") + (t.isSend ? "send" : "recv") + " on rank " +
                                std::to_string(rank()) + ": no peer rank " + std::to_string(t.peer) +
                                " in a group of " + std::to_string(world_));
  const std::string reason = aborted();
  if (!reason.empty()) throw std::runtime_error(describe(t) + ": the transport was aborted: " + reason);
}

GlooNetTransport::Handle GlooNetTransport::add(std::shared_ptr<Transfer> t) {
  std::lock_guard<std::mutex> lock(mutex_);
  Handle h = next_++;
  transfers_.emplace(h, std::move(t));
  return h;
}

std::shared_ptr<GlooNetTransport::Transfer> GlooNetTransport::take(Handle h) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = transfers_.find(h);
  if (it == transfers_.end()) return nullptr;
  auto t = std::move(it->second);
  transfers_.erase(it);
  return t;
}

size_t GlooNetTransport::inFlight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return transfers_.size();
}

GlooNetTransport::Handle GlooNetTransport::isend(int peer, int64_t /*tag: ordered messages match by order*/,
                                                 const void* data, size_t bytes) {
  auto t = std::make_shared<Transfer>();
  t->isSend = true;
  t->peer = peer;
  t->bytes = bytes;
  checkPeer(*t);
  // Only read, by gloo.
  t->view = at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte));
  try {
    t->work = framed_->sendOrdered(t->view, peer);
  } catch (const std::exception& e) {
    throw NetTransportError(describe(*t) + ": " + reasonOf(firstLine(e)));
  }
  t->deadline = std::chrono::steady_clock::now() + framed_->timeout();
  return add(std::move(t));
}

GlooNetTransport::Handle GlooNetTransport::irecv(int peer, int64_t /*tag: ordered messages match by order*/,
                                                 void* data, size_t bytes) {
  auto t = std::make_shared<Transfer>();
  t->peer = peer;
  t->bytes = bytes;
  checkPeer(*t);
  t->view = at::from_blob(data, {static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte));
  try {
    t->work = framed_->recvOrdered(t->view, peer);
  } catch (const std::exception& e) {
    const std::string reason = aborted();
    if (!reason.empty()) throw std::runtime_error(describe(*t) + ": the transport was aborted: " + reason);
    throw NetTransportError(describe(*t) + ": " + reasonOf(firstLine(e)));
  }
  t->deadline = std::chrono::steady_clock::now() + framed_->timeout();
  return add(std::move(t));
}

void GlooNetTransport::fail(const Transfer& t, std::exception_ptr error) const {
  const std::string reason = aborted();
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    if (!reason.empty()) throw std::runtime_error(describe(t) + ": the transport was aborted: " + reason);
    throw NetTransportError(describe(t) + ": " + reasonOf(firstLine(e)));
  }
}

void GlooNetTransport::wait(Handle h, const std::function<void(int waitingFor)>& check) {
  std::shared_ptr<Transfer> t = take(h);
  if (!t) throw std::logic_error("hoccl: wait on an unknown network transfer handle " + std::to_string(h));
  try {
    if (check) check(t->peer);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty()) throw std::runtime_error(describe(*t) + ": the transport was aborted: " + aborted_);
    waiting_.push_back(t);
  } catch (...) {
    settle(t);  // the caller gives up on it: make its memory free before saying so
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(waiters_->mutex);
    t->started = true;
  }
  std::exception_ptr error;
  bool done = false;
  try {
    done = t->work->wait(t->remaining());
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), t));
  }
  {
    std::lock_guard<std::mutex> lock(waiters_->mutex);
    t->finished = done || error;
    t->error = error;
    t->started = t->finished;  // cut short: settle() hands it to a waiter thread
  }
  if (error) fail(*t, error);
  if (done) return;
  // abort() cut the wait short; gloo may still move the bytes, so a waiter thread waits them out
  // before the caller hears (and may free the memory).
  settle(t);
  throw std::runtime_error(describe(*t) + ": the transport was aborted: " + aborted());
}

void GlooNetTransport::settle(const std::shared_ptr<Transfer>& t) {
  Waiters& w = *waiters_;
  std::unique_lock<std::mutex> lock(w.mutex);
  // gloo's wait is given what is left of the budget from the post (Transfer::remaining): the bound
  // follows it, so settling never returns while gloo may still write into the memory.
  if (!t->started) w.submit(t);
  const auto bound = t->deadline + std::chrono::seconds(1);
  w.finished.wait_until(lock, bound, [&] { return t->finished; });
}

void GlooNetTransport::cancel(Handle h) {
  std::shared_ptr<Transfer> t = take(h);
  if (!t) return;
  settle(t);
}

void GlooNetTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.empty()) aborted_ = reason.empty() ? "aborted" : reason;
  }
  framed_->stop(reason);
  std::vector<std::shared_ptr<Transfer>> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting = waiting_;
  }
  for (const auto& t : waiting) t->work->abort();  // the blocked wait returns false
}

}  // namespace hoccl
