// What the executor needs from a transport: the interface every transport of ranks that share
// memory implements (transport/shm today; the copy-engine transport and the inter-host leg go
// beside it, each in its own folder under transport/).
//
// A Plan names locations (common/plan_types.h): the op's own blocks, staging slots of any rank, and
// peers' published blocks. The executor resolves local ones itself and asks the transport for
// the rest; barriers carry each rank's op descriptor, which ranks compare after the first
// barrier of an op.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/op_desc.h"

namespace hoccl {

class LocalTransport {
 public:
  virtual ~LocalTransport() = default;
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

  // Entries of each side of a published block table: inputs 0.., outputs from here on.
  virtual size_t blocksPerSide() const { return static_cast<size_t>(world()); }

  // Peer r's published block `block` (inputs first, then outputs: blocksPerSide() + i is output i), from
  // `offset`: a local pointer valid for `bytes` when the transport can map it, else nullptr.
  virtual const char* mapPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, size_t bytes) = 0;
  // The same bytes copied into dst (for blocks mapPeerBlock could not map).
  virtual void readPeerBlock(int r, uint32_t parity, size_t block, int64_t offset, void* dst, size_t bytes) = 0;

  // Once per op, after its last plan: lets go of peer resources idle for a while.
  virtual void endOp() {}
};

}  // namespace hoccl
