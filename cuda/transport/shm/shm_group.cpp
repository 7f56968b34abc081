#include "transport/shm/shm_group.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "transport/shm/futex_wait.h"

namespace hoccl {
namespace {

constexpr uint64_t kMagic = 0x686f63636c763032ULL;  // "hocclv02"

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::vector<uint8_t> toBytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string fromBytes(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// A process that exited but was not yet reaped still answers kill(pid, 0): read its state.
bool processAlive(int pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

// Under the Yama LSM with ptrace_scope = 1 (Ubuntu's default) a process may only ptrace, and so
// process_vm_readv, its own descendants, and torchrun's ranks are siblings: every probe would
// fail and every op would fall back to staging. A process can name who may do so; like Open
// MPI's shared-memory transport, allow any process of the same user (the kernel's uid checks
// still apply). Scope 2 and 3 (admin-only, none) are left alone. Not reached with
// HOCCL_SHM_CMA=0.
void allowSameUserCrossMemoryUnderYama() {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = -1;
  if (scope >> value && value == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

}  // namespace

void ShmGroup::computeLayout() {
  size_t w = static_cast<size_t>(world_);
  size_t off = alignUp(sizeof(GroupHeader), 64);
  controlOffset_ = off;
  off += alignUp(w * sizeof(RankControl), 64);
  splitsOffset_ = off;
  off += alignUp(w * 2 * 2 * w * sizeof(int64_t), 64);
  addressesOffset_ = off;
  off += alignUp(w * 2 * 2 * blocks_ * sizeof(uint64_t), 64);
  regionsOffset_ = off;
  off += alignUp(w * 2 * 2 * blocks_ * sizeof(SharedRegionRef), 64);
  ringCtlOffset_ = off;
  off += alignUp(w * w * sizeof(RingControl), 4096);
  slotOffset_ = off;
  off += w * 2 * cfg_.slotBytes;
  ringDataOffset_ = alignUp(off, 4096);
  totalBytes_ = ringDataOffset_ + w * w * cfg_.ringBytes;
}

ShmGroup::ShmGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                   ShmConfig cfg, std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), blocks_(static_cast<size_t>(std::max(world, cfg.blocksPerSide))), cfg_(cfg) {
  cfg_.slotBytes = alignUp(cfg_.slotBytes, 4096);
  cfg_.ringBytes = alignUp(cfg_.ringBytes, 4096);
  computeLayout();
  if (cfg_.crossMemory != 0) allowSameUserCrossMemoryUnderYama();
  rendezvous(store, timeout);
}

void ShmGroup::rendezvous(const c10::intrusive_ptr<c10d::Store>& store,
                          std::chrono::milliseconds timeout) {
  // Rank 0 creates; everyone maps; once all have mapped, the name is unlinked, so a crash
  // later cannot leave the segment behind in /dev/shm.
  const std::string nameKey = "hoccl/shm/name";
  const std::string mappedKey = "hoccl/shm/mapped";
  if (rank_ == 0) {
    segment_ = ShmSegment::create(totalBytes_);
    base_ = static_cast<char*>(segment_.data());
    header_ = new (base_) GroupHeader();
    header_->magic = kMagic;
    header_->world = world_;
    for (int r = 0; r < world_; ++r) new (&control(r)) RankControl();
    store->set(nameKey, toBytes(segment_.name()));
  } else {
    store->wait({nameKey}, timeout);
    segment_ = ShmSegment::open(fromBytes(store->get(nameKey)), totalBytes_);
    base_ = static_cast<char*>(segment_.data());
    header_ = reinterpret_cast<GroupHeader*>(base_);
    if (header_->magic != kMagic || header_->world != world_)
      throw std::runtime_error("hoccl: shared segment layout mismatch on rank " +
                               std::to_string(rank_) + " (different hoccl versions or world sizes?)");
  }
  control(rank_).pid = static_cast<int32_t>(getpid());
  probeWord_ = 0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(getpid()) << 17) ^ static_cast<uint64_t>(rank_);
  control(rank_).probeValue = probeWord_;
  control(rank_).probeAddress = reinterpret_cast<uint64_t>(&probeWord_);
  store->add(mappedKey, 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store->add(mappedKey, 0) < world_) {
    if (std::chrono::steady_clock::now() > deadline) {
      segment_.unlink();
      throw std::runtime_error("hoccl: rank " + std::to_string(rank_) + " timed out after " +
                               std::to_string(timeout.count()) +
                               " ms waiting for all ranks to map the shared segment");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  segment_.unlink();
  probeCrossMemory(store, timeout);
}

void crossMemoryRead(int pid, void* dst, uint64_t remote, size_t bytes) {
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    iovec local{out, bytes};
    iovec peer{reinterpret_cast<void*>(remote), bytes};
    ssize_t n = process_vm_readv(pid, &local, 1, &peer, 1, 0);
    if (n <= 0)
      throw std::runtime_error("hoccl: cross-memory read of " + std::to_string(bytes) + " bytes from pid " +
                               std::to_string(pid) + " failed: " + std::strerror(errno));
    out += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void ShmGroup::probeCrossMemory(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout) {
  // Every rank must take the same decision, or their plans would differ: each probes its
  // neighbour, publishes the outcome, and cross-memory copies are used only if all succeeded.
  bool ok = cfg_.crossMemory != 0 && world_ > 1;
  if (ok) {
    int peer = (rank_ + 1) % world_;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (control(peer).probeAddress == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    uint64_t got = 0;
    try {
      crossMemoryRead(control(peer).pid, &got, control(peer).probeAddress, sizeof(got));
      ok = got == control(peer).probeValue;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  store->set("hoccl/cma/" + std::to_string(rank_), toBytes(ok ? "1" : "0"));
  bool all = true;
  for (int r = 0; r < world_; ++r) {
    std::string key = "hoccl/cma/" + std::to_string(r);
    store->wait({key}, timeout);
    all = all && fromBytes(store->get(key)) == "1";
  }
  if (cfg_.crossMemory == 1 && !all && world_ > 1)
    throw std::runtime_error("hoccl: HOCCL_SHM_CMA=1 but process_vm_readv between local ranks is not "
                             "permitted here (ptrace restrictions?)");
  crossMemory_ = all && world_ > 1;
}

char* ShmGroup::slot(int r, int buf) const {
  return base_ + slotOffset_ + (static_cast<size_t>(r) * 2 + buf) * cfg_.slotBytes;
}

RankControl& ShmGroup::control(int r) const {
  return reinterpret_cast<RankControl*>(base_ + controlOffset_)[r];
}

int64_t* ShmGroup::splits(int r, int parity) const {
  size_t w = static_cast<size_t>(world_);
  return reinterpret_cast<int64_t*>(base_ + splitsOffset_) + (static_cast<size_t>(r) * 2 + parity) * 2 * w;
}

uint64_t* ShmGroup::blockAddresses(int r, int parity) const {
  return reinterpret_cast<uint64_t*>(base_ + addressesOffset_) + (static_cast<size_t>(r) * 2 + parity) * 2 * blocks_;
}

SharedRegionRef* ShmGroup::blockRegions(int r, int parity) const {
  return reinterpret_cast<SharedRegionRef*>(base_ + regionsOffset_) + (static_cast<size_t>(r) * 2 + parity) * 2 * blocks_;
}

RingControl& ShmGroup::ringControl(int src, int dst) const {
  return reinterpret_cast<RingControl*>(base_ + ringCtlOffset_)[src * world_ + dst];
}

char* ShmGroup::ringData(int src, int dst) const {
  return base_ + ringDataOffset_ + (static_cast<size_t>(src) * world_ + dst) * cfg_.ringBytes;
}

void ShmGroup::arrive(uint32_t barrierIndex) {
  auto& me = control(rank_);
  publishAndWake(&me.seq, barrierIndex, &me.seqWaiters);
}

void ShmGroup::waitAll(uint32_t barrierIndex, const std::function<void(int)>& check) {
  const std::chrono::microseconds spin(coresShared() ? cfg_.sharedSpinMicros : cfg_.spinMicros);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    auto& peer = control(r);
    waitUntil([&] { return seqReached(peer.seq.load(std::memory_order_acquire), barrierIndex); },
              &peer.seq, &peer.seqWaiters, [&] { check(r); }, spin);
  }
}

void ShmGroup::abort(const std::string& message) {
  uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, 1)) {
    // A long message is cut at a character boundary: peers hand it to Python, which rejects a
    // UTF-8 sequence cut in half (gloo's messages may carry non-ASCII text).
    size_t n = std::min(message.size(), sizeof(header_->abortMessage) - 1);
    if (n < message.size())
      while (n > 0 && (static_cast<unsigned char>(message[n]) & 0xC0) == 0x80) --n;
    std::memcpy(header_->abortMessage, message.data(), n);
    header_->abortMessage[n] = '\0';
    header_->aborted.store(2);
  }
  // Wake everyone who sleeps on any word so they notice the abort promptly.
  for (int r = 0; r < world_; ++r) {
    futexWakeAll(&control(r).seq);
    futexWakeAll(&control(r).doorbell);
  }
}

std::string ShmGroup::abortMessage() const {
  for (int i = 0; i < 1000 && header_->aborted.load() == 1; ++i) std::this_thread::yield();
  return std::string(header_->abortMessage,
                     strnlen(header_->abortMessage, sizeof(header_->abortMessage)));
}

void ShmGroup::checkAlive(int r, const std::string& what, int shownAs) const {
  if (!processAlive(control(r).pid))
    throw std::runtime_error(what + ": rank " + std::to_string(shownAs >= 0 ? shownAs : r) + " (pid " +
                             std::to_string(control(r).pid) + ") has exited");
}

}  // namespace hoccl

namespace hoccl {

namespace {
// Peers read the published tables after every barrier, so their cores hold those lines; a store
// takes a line back from them (a cross-core miss per line, every op). Reused buffers publish the
// same values op after op: store only what changed.
template <typename T>
void storeIfChanged(T& slot, const T& value) {
  if (std::memcmp(&slot, &value, sizeof(T)) != 0) slot = value;
}
}  // namespace

void ShmGroup::publishSplits(uint32_t parity, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  int64_t* table = splits(rank_, static_cast<int>(parity));
  for (size_t i = 0; i < send.size(); ++i) storeIfChanged(table[i], send[i]);
  for (size_t i = 0; i < recv.size(); ++i) storeIfChanged(table[world_ + i], recv[i]);
}

void ShmGroup::publishBlocks(uint32_t parity, const std::vector<char*>& in, const std::vector<char*>& out) {
  uint64_t* table = blockAddresses(rank_, parity);
  SharedRegionRef* regions = blockRegions(rank_, parity);
  const size_t b = blocks_;
  // A block's region is looked up from its first byte: a peer checks that what it reads lies
  // inside the region and otherwise falls back to cross-memory reads.
  for (size_t i = 0; i < in.size() && i < b; ++i) {
    storeIfChanged(table[i], reinterpret_cast<uint64_t>(in[i]));
    storeIfChanged(regions[i], findSharedRegion(in[i], 1));
  }
  for (size_t i = 0; i < out.size() && i < b; ++i) {
    storeIfChanged(table[b + i], reinterpret_cast<uint64_t>(out[i]));
    storeIfChanged(regions[b + i], findSharedRegion(out[i], 1));
  }
}

const char* ShmGroup::mapPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, size_t bytes) {
  const uint64_t address = blockAddresses(r, parity)[block] + static_cast<uint64_t>(offset);
  const char* p = peerMaps_.resolve(pid(r), blockRegions(r, parity)[block], address, bytes);
  if (p) PeerMappings::countRead(bytes);
  return p;
}

void ShmGroup::readPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, void* dst, size_t bytes) {
  crossMemoryRead(pid(r), dst, blockAddresses(r, parity)[block] + static_cast<uint64_t>(offset), bytes);
}

}  // namespace hoccl
