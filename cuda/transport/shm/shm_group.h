// The shm transport: one shared segment per process group holding, for every local rank,
// a control block (barrier sequence, op descriptors), double-buffered staging slots, and one
// single-producer/single-consumer byte ring per ordered pair for send/recv.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "transport/local_transport.h"
#include "transport/shm/shared_tensor.h"
#include "transport/shm/shm_segment.h"

namespace hoccl {

struct alignas(64) RankControl {
  std::atomic<uint32_t> seq;  // barrier arrivals: futex word
  std::atomic<uint32_t> seqWaiters;
  int32_t pid;
  char pad1[52];
  std::atomic<uint32_t> doorbell;  // bumped whenever one of this rank's p2p rings changes
  std::atomic<uint32_t> doorbellWaiters;
  char pad2[56];
  OpDesc desc[2];  // indexed by barrier parity
  uint64_t probeAddress;  // a word in this rank's private memory, for the cross-memory probe
  uint64_t probeValue;
};

struct alignas(64) RingControl {
  std::atomic<uint64_t> head;  // bytes ever written by the sender
  char pad1[56];
  std::atomic<uint64_t> tail;  // bytes ever consumed by the receiver
  char pad2[56];
};

struct alignas(64) GroupHeader {
  uint64_t magic;
  int32_t world;
  std::atomic<uint32_t> aborted;  // nonzero once a rank declared the group broken
  char abortMessage[512];
};

struct ShmConfig {
  size_t slotBytes = 4 << 20;  // per rank, per buffer (two buffers)
  size_t ringBytes = 1 << 20;  // per ordered pair
  int crossMemory = -1;        // -1 auto (probe), 0 off, 1 required
  int64_t spinMicros = 0;      // busy-wait this long at a barrier before yielding the core
  int64_t sharedSpinMicros = 0;  // the same while cores are shared (futex_wait.h coresShared)
  // Entries per side (inputs, outputs) of each rank's published block table; 0: the group's
  // size. A host's group running plans of a group across hosts names blocks of the whole group.
  int blocksPerSide = 0;
};

// Copies `bytes` from address `remote` in process `pid` into local `dst` (process_vm_readv).
void crossMemoryRead(int pid, void* dst, uint64_t remote, size_t bytes);

class ShmGroup : public LocalTransport {
 public:
  ShmGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world, ShmConfig cfg,
           std::chrono::milliseconds timeout);
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  size_t blocksPerSide() const override { return blocks_; }
  size_t slotBytes() const { return cfg_.slotBytes; }
  size_t ringBytes() const { return cfg_.ringBytes; }

  char* slot(int r, int buf) const override;

  // Transport (transport/local_transport.h). Peer blocks are read through mappings of shared tensors where
  // the peer's block lies in one, else with cross-memory copies.
  void publishDescriptor(uint32_t parity, const OpDesc& desc) override { control(rank_).desc[parity] = desc; }
  OpDesc descriptor(int r, uint32_t parity) const override { return control(r).desc[parity]; }
  void publishBlocks(uint32_t parity, const std::vector<char*>& in, const std::vector<char*>& out) override;
  void barrier(uint32_t index, const std::function<void(int waitingFor)>& check) override {
    arrive(index);
    waitAll(index, check);
  }
  const char* mapPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, size_t bytes) override;
  void readPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, void* dst, size_t bytes) override;
  void endOp() override { peerMaps_.endOp(); }
  RankControl& control(int r) const;
  int64_t* splits(int r, int parity) const;  // 2*world entries: send bytes then recv bytes
  // This rank's entries of splits(rank, parity), for an op whose first barrier has that parity.
  void publishSplits(uint32_t parity, const std::vector<int64_t>& send, const std::vector<int64_t>& recv);
  // 2*blocksPerSide() entries: addresses (in rank r's own address space) of its input blocks, then output
  // blocks, for the op whose first barrier had this parity. Read with cross-memory copies.
  uint64_t* blockAddresses(int r, int parity) const;
  // Same layout: where each of those blocks lives, for peers that can map it (shared tensors).
  SharedRegionRef* blockRegions(int r, int parity) const;
  // True when every rank can read every peer's memory directly (process_vm_readv).
  bool crossMemory() const { return crossMemory_; }
  int pid(int r) const { return control(r).pid; }
  RingControl& ringControl(int src, int dst) const;
  char* ringData(int src, int dst) const;
  GroupHeader& header() const { return *header_; }

  // Barrier number `barrierIndex` (counting from 1): publish arrival, wait for every peer.
  // `check` runs periodically while blocked (timeouts, dead peers, abort).
  void arrive(uint32_t barrierIndex);
  void waitAll(uint32_t barrierIndex, const std::function<void(int waitingFor)>& check);

  // Marks the group broken for every rank with a message; first writer wins.
  void abort(const std::string& message);
  bool aborted() const { return header_->aborted.load() != 0; }
  std::string abortMessage() const;
  // Throws if rank r's process is gone.
  // `shownAs`: how the error names rank r (its rank in a larger group), r itself when negative.
  void checkAlive(int r, const std::string& what, int shownAs = -1) const;

 private:
  size_t controlOffset_ = 0, splitsOffset_ = 0, addressesOffset_ = 0, regionsOffset_ = 0, ringCtlOffset_ = 0, slotOffset_ = 0,
         ringDataOffset_ = 0, totalBytes_ = 0;
  void computeLayout();
  void rendezvous(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout);
  void probeCrossMemory(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout);
  bool crossMemory_ = false;
  uint64_t probeWord_ = 0;

  int rank_, world_;
  size_t blocks_;  // blocksPerSide()
  ShmConfig cfg_;
  ShmSegment segment_;
  PeerMappings peerMaps_;
  char* base_ = nullptr;
  GroupHeader* header_ = nullptr;
};

}  // namespace hoccl
