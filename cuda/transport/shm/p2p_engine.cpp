#include "transport/shm/p2p_engine.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

#include "transport/shm/futex_wait.h"

namespace hoccl {

P2PEngine::P2PEngine(ShmGroup& group, std::chrono::milliseconds timeout)
    : group_(group), timeout_(timeout), incoming_(group.world()), thread_([this] { loop(); }) {}

P2PEngine::~P2PEngine() {
  stop_.store(true);
  cv_.notify_all();
  futexWakeAll(&group_.control(group_.rank()).doorbell);
  if (thread_.joinable()) thread_.join();
}

void P2PEngine::postSend(int dst, int tag, const char* data, int64_t bytes, Done done) {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.push_back(Op{true, dst, tag, const_cast<char*>(data), bytes, 0, false,
                    std::chrono::steady_clock::now() + timeout_, std::move(done)});
  cv_.notify_all();
}

void P2PEngine::postRecv(int src, int tag, char* data, int64_t bytes, Done done,
                         std::shared_ptr<AnySourceClaim> claim) {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.push_back(Op{false, src, tag, data, bytes, 0, false,
                    std::chrono::steady_clock::now() + timeout_, std::move(done), std::move(claim)});
  cv_.notify_all();
}

int64_t P2PEngine::ringFree(int dst) const {
  auto& rc = group_.ringControl(group_.rank(), dst);
  return static_cast<int64_t>(group_.ringBytes()) -
         static_cast<int64_t>(rc.head.load(std::memory_order_relaxed) - rc.tail.load(std::memory_order_acquire));
}

int64_t P2PEngine::ringAvailable(int src) const {
  auto& rc = group_.ringControl(src, group_.rank());
  return static_cast<int64_t>(rc.head.load(std::memory_order_acquire) - rc.tail.load(std::memory_order_relaxed));
}

void P2PEngine::ringWrite(int dst, const char* src, int64_t n) {
  auto& rc = group_.ringControl(group_.rank(), dst);
  char* data = group_.ringData(group_.rank(), dst);
  const uint64_t cap = group_.ringBytes();
  uint64_t head = rc.head.load(std::memory_order_relaxed);
  uint64_t pos = head % cap;
  uint64_t first = std::min<uint64_t>(n, cap - pos);
  std::memcpy(data + pos, src, first);
  if (static_cast<uint64_t>(n) > first) std::memcpy(data, src + first, n - first);
  rc.head.store(head + n, std::memory_order_release);
}

void P2PEngine::ringRead(int src, char* dst, int64_t n) {
  auto& rc = group_.ringControl(src, group_.rank());
  const char* data = group_.ringData(src, group_.rank());
  const uint64_t cap = group_.ringBytes();
  uint64_t tail = rc.tail.load(std::memory_order_relaxed);
  uint64_t pos = tail % cap;
  uint64_t first = std::min<uint64_t>(n, cap - pos);
  if (dst) {
    std::memcpy(dst, data + pos, first);
    if (static_cast<uint64_t>(n) > first) std::memcpy(dst + first, data, n - first);
  }
  rc.tail.store(tail + n, std::memory_order_release);
}

void P2PEngine::ring(int rankToWake) {
  auto& c = group_.control(rankToWake);
  c.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (c.doorbellWaiters.load(std::memory_order_seq_cst) != 0) futexWakeAll(&c.doorbell);
}

std::string P2PEngine::describe(const Op& op) const {
  std::string what = op.send ? "send to rank " : "recv from rank ";
  return "hoccl " + what + (op.peer < 0 ? std::string("<any>") : std::to_string(name(op.peer))) +
         " (tag " + std::to_string(op.tag) + ", " + std::to_string(op.bytes) + " bytes) on rank " +
         std::to_string(name(group_.rank()));
}

void P2PEngine::fail(Op& op, const std::string& message) {
  op.callback(std::make_exception_ptr(std::runtime_error(describe(op) + ": " + message)), name(op.peer));
}

bool P2PEngine::progressSend(Op& op) {
  bool moved = false;
  if (!op.framed) {
    if (ringFree(op.peer) < static_cast<int64_t>(sizeof(Header))) return false;
    Header h{op.tag, 0, op.bytes};
    ringWrite(op.peer, reinterpret_cast<const char*>(&h), sizeof(h));
    op.framed = moved = true;
  }
  int64_t n = std::min(ringFree(op.peer), op.bytes - op.done);
  if (n > 0) {
    ringWrite(op.peer, op.data + op.done, n);
    op.done += n;
    moved = true;
  }
  if (moved) ring(op.peer);
  return moved;
}

bool P2PEngine::readHeader(int src) {
  Incoming& in = incoming_[src];
  if (in.framed) return true;
  if (ringAvailable(src) < static_cast<int64_t>(sizeof(Header))) return false;
  ringRead(src, reinterpret_cast<char*>(&in.head), sizeof(Header));
  in.framed = true;
  in.done = 0;
  in.into = Incoming::Into::Nowhere;
  ring(src);
  return true;
}

namespace {
std::string sizeMismatch(int sender, int64_t sent, int sentTag, int64_t expected, int tag) {
  return "rank " + std::to_string(sender) + " sent " + std::to_string(sent) + " bytes with tag " +
         std::to_string(sentTag) + " but this recv expects " + std::to_string(expected) + " bytes with tag " +
         std::to_string(tag);
}
}  // namespace

P2PEngine::BindResult P2PEngine::bind(OpIt op, int src, std::list<Op>& finished) {
  Incoming& in = incoming_[src];
  auto claimed = [&] { return !op->claim || op->claim->take(AnySourceClaim::Owner::SharedMemory); };
  // Stashed messages came before the one at the head of the ring.
  for (auto s = in.stashed.begin(); s != in.stashed.end(); ++s) {
    if (s->tag != op->tag) continue;
    if (!claimed()) return BindResult::Dropped;
    op->peer = src;
    op->framed = true;
    const int64_t sent = static_cast<int64_t>(s->data.size());
    if (sent != op->bytes) {
      fail(*op, sizeMismatch(name(src), sent, s->tag, op->bytes, op->tag));
      in.stashed.erase(s);
      return BindResult::Failed;
    }
    if (sent > 0) std::memcpy(op->data, s->data.data(), sent);
    op->done = sent;
    in.stashed.erase(s);
    completeRecv(op, finished);
    return BindResult::Completed;
  }
  if (!readHeader(src) || in.into != Incoming::Into::Nowhere || in.head.tag != op->tag) return BindResult::None;
  if (!claimed()) return BindResult::Dropped;
  op->peer = src;
  op->framed = true;
  if (in.head.bytes != op->bytes) {
    // The message is drained so that the pair's stream stays aligned.
    in.into = Incoming::Into::Discard;
    fail(*op, sizeMismatch(name(src), in.head.bytes, in.head.tag, op->bytes, op->tag));
    return BindResult::Failed;
  }
  in.into = Incoming::Into::Recv;
  in.recv = op;
  return BindResult::Bound;
}

bool P2PEngine::mustStash(int src) const {
  const Incoming& in = incoming_[src];
  bool waits = false;
  for (const Op& op : ops_) {
    if (!op.waitsFor(src)) continue;
    if (op.tag == in.head.tag) return false;  // the next pass binds it
    waits = true;
  }
  return waits;
}

void P2PEngine::completeRecv(OpIt op, std::list<Op>& finished) { finished.splice(finished.end(), ops_, op); }

bool P2PEngine::drain(int src, std::list<Op>& finished) {
  Incoming& in = incoming_[src];
  bool moved = false;
  while (true) {
    if (!in.framed) {
      // Headers are read when a recv looks for its message (bind) or must get past this one.
      const bool waits = std::any_of(ops_.begin(), ops_.end(), [src](const Op& op) { return op.waitsFor(src); });
      if (!waits || !readHeader(src)) break;
      moved = true;
    }
    if (in.into == Incoming::Into::Nowhere) {
      if (!mustStash(src)) break;
      in.into = Incoming::Into::Stash;
      in.stash.resize(static_cast<size_t>(in.head.bytes));
    }
    const int64_t n = std::min(ringAvailable(src), in.head.bytes - in.done);
    if (n > 0) {
      char* dst = in.into == Incoming::Into::Recv    ? in.recv->data + in.done
                  : in.into == Incoming::Into::Stash ? in.stash.data() + in.done
                                                     : nullptr;
      ringRead(src, dst, n);
      in.done += n;
      if (in.into == Incoming::Into::Recv) in.recv->done = in.done;
      ring(src);
      moved = true;
    }
    if (in.done < in.head.bytes) break;
    if (in.into == Incoming::Into::Recv) completeRecv(in.recv, finished);
    if (in.into == Incoming::Into::Stash) in.stashed.push_back(Stashed{in.head.tag, std::move(in.stash)});
    in.stash = {};
    in.framed = false;
    in.into = Incoming::Into::Nowhere;
    moved = true;
  }
  return moved;
}

void P2PEngine::unbind(const Op& op) {
  if (op.peer < 0) return;
  Incoming& in = incoming_[op.peer];
  if (in.into == Incoming::Into::Recv && &*in.recv == &op) in.into = Incoming::Into::Discard;
}

bool P2PEngine::progressRecvs(bool checkPeers, std::list<Op>& finished) {
  bool moved = false;
  // Recvs find their messages in posting order: of two recvs for one sender and tag, the first
  // posted takes the first sent.
  for (auto it = ops_.begin(); it != ops_.end();) {
    OpIt op = it++;
    if (op->send || op->framed) continue;
    if (op->claim && op->claim->owner() != AnySourceClaim::Owner::None) {
      ops_.erase(op);  // another engine received it, or its waiter gave up
      continue;
    }
    BindResult r = BindResult::None;
    if (op->peer >= 0) {
      r = bind(op, op->peer, finished);
    } else {
      // Any source: the first sender with a message of this tag stashed or next in its ring; while
      // none has, drain stashes what the senders' rings hold before it.
      for (int s = 0; s < group_.world() && r == BindResult::None; ++s)
        if (s != group_.rank()) r = bind(op, s, finished);
    }
    if (r == BindResult::Failed || r == BindResult::Dropped) ops_.erase(op);
    moved |= r != BindResult::None;
  }
  for (int s = 0; s < group_.world(); ++s)
    if (s != group_.rank()) moved |= drain(s, finished);
  const auto now = std::chrono::steady_clock::now();
  for (auto it = ops_.begin(); it != ops_.end();) {
    OpIt op = it++;
    if (op->send) continue;
    if (now > op->deadline && !op->claim) {
      unbind(*op);
      if (op->peer < 0)
        fail(*op, "Timed out after " + std::to_string(timeout_.count()) + " ms: no rank sent");
      else
        fail(*op, "Timed out after " + std::to_string(timeout_.count()) + " ms (" + std::to_string(op->done) +
                      " of " + std::to_string(op->bytes) + " bytes moved; is the matching send posted?)");
      ops_.erase(op);
      continue;
    }
    if (!checkPeers || op->peer < 0) continue;
    try {
      group_.checkAlive(op->peer, describe(*op), name(op->peer));
    } catch (const std::exception&) {
      unbind(*op);
      op->callback(std::current_exception(), name(op->peer));
      ops_.erase(op);
    }
  }
  return moved;
}

bool P2PEngine::progressSends(bool checkPeers, std::list<Op>& finished) {
  bool moved = false;
  std::set<int> blockedPeers;  // keep FIFO order per destination
  const auto now = std::chrono::steady_clock::now();
  for (auto it = ops_.begin(); it != ops_.end();) {
    Op& op = *it;
    if (!op.send || blockedPeers.count(op.peer)) {
      ++it;
      continue;
    }
    moved |= progressSend(op);
    if (op.framed && op.done == op.bytes) {
      finished.splice(finished.end(), ops_, it++);
      continue;
    }
    blockedPeers.insert(op.peer);
    if (now > op.deadline) {
      fail(op, "Timed out after " + std::to_string(timeout_.count()) + " ms (" + std::to_string(op.done) + " of " +
                   std::to_string(op.bytes) + " bytes moved; is the matching recv posted?)");
      it = ops_.erase(it);
      continue;
    }
    try {
      if (checkPeers) group_.checkAlive(op.peer, describe(op), name(op.peer));
    } catch (const std::exception&) {
      op.callback(std::current_exception(), name(op.peer));
      it = ops_.erase(it);
      continue;
    }
    ++it;
  }
  return moved;
}

void P2PEngine::loop() {
  auto& me = group_.control(group_.rank());
  while (!stop_.load()) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_.load() || !ops_.empty(); });
      if (ops_.empty()) continue;
    }
    uint32_t bell = me.doorbell.load(std::memory_order_seq_cst);
    // Liveness of peers is read from /proc: only every 100 ms, not on every pass.
    auto now = std::chrono::steady_clock::now();
    bool checkPeers = now - lastPeerCheck_ > std::chrono::milliseconds(100);
    if (checkPeers) lastPeerCheck_ = now;
    std::list<Op> finished;
    bool progressed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      progressed = progressSends(checkPeers, finished);
      progressed |= progressRecvs(checkPeers, finished);
    }
    for (auto& op : finished) op.callback(nullptr, name(op.peer));
    if (!progressed && finished.empty()) {
      me.doorbellWaiters.fetch_add(1, std::memory_order_seq_cst);
      futexWait(&me.doorbell, bell, std::chrono::microseconds(2000));
      me.doorbellWaiters.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
}

}  // namespace hoccl
