#include "transport/shm/p2p_engine.h"

#include <cstring>
#include <set>
#include <stdexcept>

#include "transport/shm/futex_wait.h"

namespace hoccl {

P2PEngine::P2PEngine(ShmGroup& group, std::chrono::milliseconds timeout)
    : group_(group), timeout_(timeout), thread_([this] { loop(); }) {}

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

int64_t P2PEngine::nextTag(int src) const {
  if (ringAvailable(src) < static_cast<int64_t>(sizeof(Header))) return -1;
  auto& rc = group_.ringControl(src, group_.rank());
  const char* data = group_.ringData(src, group_.rank());
  const uint64_t cap = group_.ringBytes();
  const uint64_t pos = rc.tail.load(std::memory_order_relaxed) % cap;
  Header h;
  const uint64_t first = std::min<uint64_t>(sizeof(h), cap - pos);
  std::memcpy(&h, data + pos, first);
  if (first < sizeof(h)) std::memcpy(reinterpret_cast<char*>(&h) + first, data, sizeof(h) - first);
  return h.tag;
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

bool P2PEngine::progressRecv(Op& op) {
  bool moved = false;
  if (!op.framed) {
    if (ringAvailable(op.peer) < static_cast<int64_t>(sizeof(Header))) return false;
    Header h;
    ringRead(op.peer, reinterpret_cast<char*>(&h), sizeof(h));
    op.framed = moved = true;
    if (h.tag != op.tag || h.bytes != op.bytes) {
      // Drain the mismatched message so the pair's stream stays aligned, then report it.
      int64_t left = h.bytes;
      while (left > 0) {
        int64_t n = std::min(ringAvailable(op.peer), left);
        if (n > 0) ringRead(op.peer, nullptr, n), left -= n, ring(op.peer);
        else std::this_thread::yield();
        if (std::chrono::steady_clock::now() > op.deadline) break;
      }
      op.done = op.bytes;
      ring(op.peer);
      throw std::runtime_error("rank " + std::to_string(name(op.peer)) + " sent " +
                               std::to_string(h.bytes) + " bytes with tag " + std::to_string(h.tag) +
                               " but this recv expects " + std::to_string(op.bytes) +
                               " bytes with tag " + std::to_string(op.tag));
    }
  }
  int64_t n = std::min(ringAvailable(op.peer), op.bytes - op.done);
  if (n > 0) {
    ringRead(op.peer, op.data + op.done, n);
    op.done += n;
    moved = true;
  }
  if (moved) ring(op.peer);
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
    bool progressed = false;
    // Liveness of peers is read from /proc: only every 100 ms, not on every pass.
    auto now = std::chrono::steady_clock::now();
    bool checkPeers = now - lastPeerCheck_ > std::chrono::milliseconds(100);
    if (checkPeers) lastPeerCheck_ = now;
    std::list<Op> finished;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::set<std::pair<bool, int>> blockedPeers;  // keep FIFO order per (direction, peer)
      for (auto it = ops_.begin(); it != ops_.end();) {
        Op& op = *it;
        if (!op.send && op.peer < 0) {
          if (op.claim && op.claim->owner() != AnySourceClaim::Owner::None) {
            it = ops_.erase(it);  // another engine received it, or its waiter gave up
            continue;
          }
          // Any-source: bind to the first peer whose next message has this recv's tag (others stay
          // for the recvs that name their sender) and no earlier recv queued.
          int from = -1;
          for (int s = 0; s < group_.world() && from < 0; ++s)
            if (s != group_.rank() && !blockedPeers.count({false, s}) && nextTag(s) == op.tag) from = s;
          if (from >= 0 && op.claim && !op.claim->take(AnySourceClaim::Owner::SharedMemory)) {
            it = ops_.erase(it);
            continue;
          }
          op.peer = from;
          if (op.peer < 0) {
            if (!op.claim && std::chrono::steady_clock::now() > op.deadline) {
              fail(op, "Timed out after " + std::to_string(timeout_.count()) + " ms: no rank sent");
              it = ops_.erase(it);
              continue;
            }
            ++it;
            continue;
          }
        }
        auto key = std::make_pair(op.send, op.peer);
        if (blockedPeers.count(key)) { ++it; continue; }
        try {
          progressed |= op.send ? progressSend(op) : progressRecv(op);
        } catch (const std::exception& e) {
          fail(op, e.what());
          it = ops_.erase(it);
          progressed = true;
          continue;
        }
        bool complete = op.framed && op.done == op.bytes;
        if (complete) {
          finished.splice(finished.end(), ops_, it++);
          continue;
        }
        blockedPeers.insert(key);
        if (std::chrono::steady_clock::now() > op.deadline) {
          fail(op, "Timed out after " + std::to_string(timeout_.count()) + " ms (" +
                       std::to_string(op.done) + " of " + std::to_string(op.bytes) +
                       " bytes moved; is the matching " + (op.send ? "recv" : "send") + " posted?)");
          it = ops_.erase(it);
          continue;
        }
        try {
          if (checkPeers) group_.checkAlive(op.peer, describe(op), name(op.peer));
        } catch (const std::exception& e) {
          op.callback(std::current_exception(), name(op.peer));
          it = ops_.erase(it);
          continue;
        }
        ++it;
      }
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
