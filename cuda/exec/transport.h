// What the executor needs from a transport: the interface every transport of ranks that share
// memory implements (transport/shm today; the copy-engine transport and the inter-host leg go
// beside it, each in its own folder under transport/).
//
// A Plan names locations (plan/plan.h): the op's own blocks, staging slots of any rank, and
// peers' published blocks. The executor resolves local ones itself and asks the transport for
// the rest; barriers carry each rank's op descriptor, which ranks compare after the first
// barrier of an op.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace hoccl {

// What each rank says it is doing; peers compare these after the first barrier of every op.
struct OpDesc {
  uint32_t opSeq;
  int8_t kind;
  int8_t dtype;
  int8_t redop;
  int8_t coresShared;  // the publisher's view (backend/core_sharing.h): its group agrees on the next op's rounds
  int32_t root;
  int32_t pad2;
  int64_t numel;  // the size every rank must agree on (op-specific meaning)
  int64_t aux;    // op-specific second check (e.g. output numel)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // Staging buffer `buf` (0 or 1) of rank r: written by r, read by every rank after a barrier.
  virtual char* slot(int r, int buf) const = 0;

  // Published with the first barrier of an op (parity = that barrier's index & 1): this rank's
  // descriptor and the addresses of its input and output blocks, so peers can read them.
  virtual void publishDescriptor(uint32_t parity, const OpDesc& desc) = 0;
  virtual OpDesc descriptor(int r, uint32_t parity) const = 0;
  virtual void publishBlocks(uint32_t parity, const std::vector<char*>& in, const std::vector<char*>& out) = 0;

  // Barrier number `index` (counting from 1) across every rank; `check` runs periodically while
  // blocked and throws on a timeout, an abort or a dead peer.
  virtual void barrier(uint32_t index, const std::function<void(int waitingFor)>& check) = 0;

  // Peer r's published block `block` (inputs first, then outputs: world() + i is output i), from
  // `offset`: a local pointer valid for `bytes` when the transport can map it, else nullptr.
  virtual const char* mapPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, size_t bytes) = 0;
  // The same bytes copied into dst (for blocks mapPeerBlock could not map).
  virtual void readPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, void* dst, size_t bytes) = 0;

  // Once per op, after its last plan: lets go of peer resources idle for a while.
  virtual void endOp() {}
};

}  // namespace hoccl
