#include "transport/net/gloo/framed_p2p.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>

namespace hoccl {

namespace {

constexpr int kHeaderSlot = 0;
// gloo tags are int: framed payloads on slots 1..2^30-1, ordered messages on 2^30..2^31-2.
constexpr uint32_t kPayloadSlots = (1u << 30) - 1;
constexpr uint32_t kOrderedBase = 1u << 30;
constexpr uint32_t kOrderedSlots = (1u << 30) - 1;
constexpr int64_t kHeaderBytes = 5 * sizeof(int64_t);
// A payload this small rides in its header's message (slot 0 in the header says so): one gloo
// handshake instead of two. gloo short-fills the listener's larger recv buffer.
constexpr int64_t kInlineBytes = 16 << 10;
// The listener waits for the next header as long as the group lives: a gloo wait that expires
// breaks the whole gloo context, and idling is no fault.
constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365);

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }

at::Tensor bytesOf(const at::Tensor& t) { return t.view(-1).view(at::kByte); }

std::string firstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

std::string describeBytes(int64_t bytes, int64_t numel, at::ScalarType dtype) {
  return std::to_string(bytes) + " bytes (" + std::to_string(numel) + " " + c10::toString(dtype) + " elements)";
}

// What is left of a budget, at least 1 ms (0 would mean gloo's own timeout).
std::chrono::milliseconds left(std::chrono::steady_clock::time_point deadline) {
  auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(rest, std::chrono::milliseconds(1));
}

// Header then payload; both were posted back to back by send().
class FramedSendWork : public c10d::Work {
 public:
  FramedSendWork(std::shared_ptr<FramedP2P> engine, int dst, c10::intrusive_ptr<c10d::Work> header,
                 c10::intrusive_ptr<c10d::Work> payload)
      : c10d::Work(engine->rank(), c10d::OpType::SEND),
        engine_(std::move(engine)),
        dst_(dst),
        header_(std::move(header)),
        payload_(std::move(payload)) {}

  bool isCompleted() override { return done_; }

  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(waitMutex_);
    if (error_) std::rethrow_exception(error_);
    if (done_) return true;
    // One budget for both halves: the group's timeout bounds the whole send.
    const auto deadline = std::chrono::steady_clock::now() + (timeout == kNoTimeout ? engine_->timeout() : timeout);
    try {
      header_->wait(left(deadline));
      if (payload_) payload_->wait(left(deadline));
    } catch (const std::exception& e) {
      error_ = std::make_exception_ptr(c10::DistBackendError(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "hoccl send on rank " + std::to_string(rank_) + " to rank " + std::to_string(dst_) +
              ": the transfer failed (gloo: " + firstLine(e) + ")"));
      std::rethrow_exception(error_);
    }
    done_ = true;
    return true;
  }

 private:
  std::shared_ptr<FramedP2P> engine_;
  int dst_;
  c10::intrusive_ptr<c10d::Work> header_, payload_;
  std::mutex waitMutex_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

// Waits for the listener to match the recv, then for its payload; raises a size mismatch only
// once the sender's bytes are drained, so the pair's next message is unaffected.
class FramedRecvWork : public c10d::Work {
 public:
  FramedRecvWork(std::shared_ptr<FramedP2P> engine, std::shared_ptr<FramedP2P::Pending> p)
      : c10d::Work(engine->rank(), c10d::OpType::RECV), engine_(std::move(engine)), p_(std::move(p)) {}

  bool isCompleted() override { return done_; }
  int sourceRank() const override { return source_; }

  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(waitMutex_);
    if (error_) std::rethrow_exception(error_);
    if (done_) return true;
    try {
      complete(timeout == kNoTimeout ? engine_->timeout() : timeout);
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
    done_ = true;
    return true;
  }

 private:
  void complete(std::chrono::milliseconds budget) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + budget;
    engine_->awaitMatch(p_, start, budget);
    source_ = p_->src;
    if (p_->payload) {
      try {
        p_->payload->wait(left(deadline));
      } catch (const std::exception& e) {
        TORCH_CHECK_WITH(DistBackendError, false, "hoccl recv on rank ", rank_, " from rank ", p_->src,
                         ": the transfer failed (gloo: ", firstLine(e), ")");
      }
    }
    TORCH_CHECK_VALUE(p_->mismatch.empty(), p_->mismatch);
    if (!p_->buffer.is_same(p_->user)) p_->user.copy_(p_->buffer);
  }

  std::shared_ptr<FramedP2P> engine_;
  std::shared_ptr<FramedP2P::Pending> p_;
  std::mutex waitMutex_;
  std::atomic<bool> done_{false};
  std::atomic<int> source_{-1};
  std::exception_ptr error_;
};

}  // namespace

FramedP2P::FramedP2P(c10::intrusive_ptr<c10d::Backend> gloo, int rank, std::chrono::milliseconds timeout)
    : gloo_(std::move(gloo)), rank_(rank), timeout_(timeout), sent_(gloo_->getSize(), 0),
      orderedSent_(gloo_->getSize(), 0), orderedReceived_(gloo_->getSize(), 0) {}

FramedP2P::~FramedP2P() { stop("the process group was destroyed"); }

void FramedP2P::setTimeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout_ = timeout;
}

std::chrono::milliseconds FramedP2P::timeout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeout_;
}

c10::intrusive_ptr<c10d::Work> FramedP2P::post(bool isSend, const at::Tensor& t, int peer, int slot) {
  std::vector<at::Tensor> one{t};
  if (isSend) return gloo_->send(one, peer, slot);
  return peer < 0 ? gloo_->recvAnysource(one, slot) : gloo_->recv(one, peer, slot);
}

c10::intrusive_ptr<c10d::Work> FramedP2P::sendOrdered(const at::Tensor& bytes, int dst) {
  std::lock_guard<std::mutex> lock(postMutex_);
  const int slot = static_cast<int>(kOrderedBase + orderedSent_[dst]++ % kOrderedSlots);
  return post(true, bytes, dst, slot);
}

c10::intrusive_ptr<c10d::Work> FramedP2P::recvOrdered(const at::Tensor& bytes, int src) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK_WITH(DistBackendError, stopped_.empty(), "hoccl recv on rank ", rank_, ": ", stopped_);
  }
  std::lock_guard<std::mutex> lock(postMutex_);
  const int slot = static_cast<int>(kOrderedBase + orderedReceived_[src]++ % kOrderedSlots);
  return post(false, bytes, src, slot);
}

c10::intrusive_ptr<c10d::Work> FramedP2P::send(const at::Tensor& t, int dst, int64_t tag) {
  at::Tensor payload = t.contiguous();
  const int64_t bytes = nbytes(payload);
  const bool inlined = bytes <= kInlineBytes;
  at::Tensor frame = at::empty({kHeaderBytes + (inlined ? bytes : 0)}, at::kByte);
  if (inlined && bytes > 0) std::memcpy(frame.data_ptr<uint8_t>() + kHeaderBytes, payload.data_ptr(), bytes);
  c10::intrusive_ptr<c10d::Work> header, body;
  {
    // ProcessGroupGloo's send is not thread-safe, and the slot count is per destination.
    std::lock_guard<std::mutex> lock(postMutex_);
    const int slot = inlined ? 0 : 1 + static_cast<int>(sent_[dst]++ % kPayloadSlots);
    const int64_t words[] = {tag, slot, bytes, static_cast<int64_t>(payload.scalar_type()), payload.numel()};
    std::memcpy(frame.data_ptr<uint8_t>(), words, kHeaderBytes);
    header = post(true, frame, dst, kHeaderSlot);
    if (!inlined) body = post(true, bytesOf(payload), dst, slot);
  }
  return c10::make_intrusive<FramedSendWork>(shared_from_this(), dst, std::move(header), std::move(body));
}

c10::intrusive_ptr<c10d::Work> FramedP2P::recv(const at::Tensor& user, int src, int64_t tag,
                                               std::shared_ptr<AnySourceClaim> claim) {
  auto p = std::make_shared<Pending>();
  p->wantSrc = src;
  p->tag = tag;
  p->user = user;
  p->buffer = user.is_contiguous() ? user : at::empty_like(user, at::MemoryFormat::Contiguous);
  p->claim = claim;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK_WITH(DistBackendError, stopped_.empty(), "hoccl recv on rank ", rank_, ": ", stopped_);
    if (!listener_.joinable()) listener_ = std::thread([this] { listen(); });
    auto it = std::find_if(early_.begin(), early_.end(), [&](const std::pair<int, Header>& e) {
      return (src < 0 || e.first == src) && e.second.tag == tag;
    });
    if (it != early_.end() && claims(*p)) {
      auto [from, h] = *it;
      early_.erase(it);
      match(*p, from, h);
    } else if (it == early_.end()) {
      posted_.push_back(p);
    }
  }
  if (claim) claim->onWithdraw(AnySourceClaim::Owner::Network, [self = shared_from_this(), p] { self->withdraw(p); });
  return c10::make_intrusive<FramedRecvWork>(shared_from_this(), p);
}

bool FramedP2P::claims(const Pending& p) { return !p.claim || p.claim->take(AnySourceClaim::Owner::Network); }

void FramedP2P::withdraw(const std::shared_ptr<Pending>& p) {
  std::lock_guard<std::mutex> lock(mutex_);
  posted_.erase(std::remove(posted_.begin(), posted_.end(), p), posted_.end());
}

void FramedP2P::listen() {
  pthread_setname_np(pthread_self(), "hoccl-p2p");  // findable in /proc/<pid>/task/*/comm
  while (true) {
    at::Tensor raw = at::empty({kHeaderBytes + kInlineBytes}, at::kByte);
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopped_.empty()) return;
      try {
        std::lock_guard<std::mutex> postLock(postMutex_);
        work = post(false, raw, -1, kHeaderSlot);
      } catch (const std::exception& e) {
        stopped_ = "the point-to-point group failed (gloo: " + firstLine(e) + ")";
        failAll(stopped_);
        return;
      }
      listening_ = work;
    }
    try {
      if (!work->wait(kForever)) return;  // stop() aborted the wait
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_.empty()) stopped_ = "the point-to-point group failed (gloo: " + firstLine(e) + ")";
      failAll(stopped_);
      return;
    }
    int64_t v[5];
    std::memcpy(v, raw.data_ptr<uint8_t>(), kHeaderBytes);
    Header h{v[0], v[1], v[2], v[3], v[4], {}};
    if (h.slot == 0 && h.bytes > 0) h.inlined = raw.narrow(0, kHeaderBytes, h.bytes);  // raw is this header's alone
    deliver(work->sourceRank(), h);
  }
}

void FramedP2P::deliver(int src, const Header& h) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stopped_.empty()) return;
  auto wants = [&](const std::shared_ptr<Pending>& p) { return (p->wantSrc < 0 || p->wantSrc == src) && p->tag == h.tag; };
  auto it = std::find_if(posted_.begin(), posted_.end(), wants);
  // A recv another engine received for (or whose waiter gave up) leaves the message to the next.
  while (it != posted_.end() && !claims(**it)) {
    it = posted_.erase(it);
    it = std::find_if(it, posted_.end(), wants);
  }
  if (it == posted_.end()) {
    Header kept = h;
    if (kept.inlined.defined()) kept.inlined = kept.inlined.clone();  // not the whole 16 KiB frame
    early_.emplace_back(src, std::move(kept));
    return;
  }
  auto p = *it;
  posted_.erase(it);
  match(*p, src, h);
}

void FramedP2P::match(Pending& p, int src, const Header& h) {
  p.src = src;
  const int64_t mine = nbytes(p.buffer);
  if (h.bytes != mine)
    p.mismatch = "hoccl recv on rank " + std::to_string(rank_) + ": rank " + std::to_string(src) + " sent " +
                 describeBytes(h.bytes, h.numel, static_cast<at::ScalarType>(h.dtype)) + ", this recv expects " +
                 describeBytes(mine, p.buffer.numel(), p.buffer.scalar_type());
  if (h.inlined.defined()) {
    if (h.bytes == mine) bytesOf(p.buffer).copy_(h.inlined);
  } else if (h.bytes > 0) {
    // A mismatched payload still lands, whole, in scratch: the sender completes and the pair's
    // next message starts where it should.
    at::Tensor into = h.bytes == mine ? bytesOf(p.buffer) : at::empty({h.bytes}, at::kByte);
    try {
      std::lock_guard<std::mutex> postLock(postMutex_);
      p.payload = post(false, into, src, static_cast<int>(h.slot));
    } catch (const std::exception& e) {
      p.failed = "hoccl recv on rank " + std::to_string(rank_) + " from rank " + std::to_string(src) +
                 ": the transfer failed (gloo: " + firstLine(e) + ")";
    }
  }
  p.matched = true;
  matched_.notify_all();
}

void FramedP2P::failAll(const std::string& reason) {
  for (auto& p : posted_) {
    p->failed = "hoccl recv on rank " + std::to_string(rank_) + ": " + reason;
    if (p->claim) p->claim->take(AnySourceClaim::Owner::Network);  // its waiter hears the failure here
  }
  posted_.clear();
  early_.clear();
  matched_.notify_all();
}

void FramedP2P::awaitMatch(const std::shared_ptr<Pending>& p, std::chrono::steady_clock::time_point start,
                           std::chrono::milliseconds budget) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool ready = matched_.wait_until(lock, start + budget, [&] { return p->matched || !p->failed.empty(); });
  TORCH_CHECK_WITH(DistBackendError, p->failed.empty(), p->failed);
  if (ready) return;
  // Withdrawn: a message that comes later waits for the next matching recv.
  posted_.erase(std::remove(posted_.begin(), posted_.end(), p), posted_.end());
  TORCH_CHECK_WITH(DistBackendError, false, "hoccl recv on rank ", rank_, ": no message ",
                   p->wantSrc < 0 ? std::string("from any rank") : "from rank " + std::to_string(p->wantSrc),
                   " with tag ", p->tag, " within the timeout of ", budget.count(), " ms");
}

void FramedP2P::stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_.empty()) {
      stopped_ = reason;
      failAll(reason);
    }
    if (listening_) listening_->abort();
  }
  std::lock_guard<std::mutex> lock(joinMutex_);
  if (listener_.joinable() && listener_.get_id() != std::this_thread::get_id()) listener_.join();
}

}  // namespace hoccl
