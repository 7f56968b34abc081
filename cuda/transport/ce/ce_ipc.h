// Which peer buffers this rank reads in place, for the p2p path of the copy-engine transport.
//
// Per op, every rank announces the regions of its own memory that peers' plans read (the op's
// input and output, as allocation id, base, offset, length) in a two-entry ring in the group's
// shared host memory: no Store round trip per op. The legacy IPC handle that lets a peer map an
// allocation travels through the Store once per allocation (`<prefix>/<rank>/<buffer id>`);
// readers cache the mapping per (peer, allocation), at most kIpcMappingsPerPeer per peer (the
// least recently used one is retired past that). When a rank announces a new allocation where
// an old one was (torch's caching allocator freed and reused the range), readers retire the old
// mapping and close it once the copies issued out of it have completed, and the exporter deletes
// the old key once every peer has read past the last op that named it. Everything left is
// closed/deleted on destruction.
//
// The buffer id is CU_POINTER_ATTRIBUTE_BUFFER_ID, unique per allocation within a process, so
// a new allocation at a reused address is never mistaken for the old one.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "transport/ce/ce_host_memory.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

// An op announces two regions: its input (plan blocks In) and its output (Out).
constexpr int kIpcRegions = 2;
constexpr size_t kIpcMappingsPerPeer = 8;

// A region of this rank's device memory; bytes 0: nothing announced (no peer reads it).
struct IpcRegion {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
};
using IpcRegions = std::array<IpcRegion, kIpcRegions>;
using IpcWanted = std::array<bool, kIpcRegions>;  // which of a peer's regions this rank reads

// A peer's region as mapped in this process (ptr 0: not mapped).
struct IpcTarget {
  CUdeviceptr ptr = 0;
  uint64_t bytes = 0;
};
using IpcTargets = std::array<IpcTarget, kIpcRegions>;

class IpcExchange {
 public:
  // Shared host bytes the announcement rings of a `world`-rank group need.
  static size_t bytesNeeded(int world);

  // `region` (zeroed, identical on every rank) holds the rings at `offset`. Collective: every
  // rank initialises its own ring before any rank calls exchange() (the caller's barrier).
  IpcExchange(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int world,
              int device, const SharedHostRegion& region, size_t offset, uint32_t firstSeq,
              std::chrono::milliseconds timeout);
  ~IpcExchange();
  IpcExchange(const IpcExchange&) = delete;
  IpcExchange& operator=(const IpcExchange&) = delete;

  // Op `seq` (one more than the previous call's, on every rank): announces `mine` (regions with
  // bytes 0 are not exported) and returns, per rank, the regions `wanted[rank]` marks, as that
  // rank announced them for `seq`, mapped here (the rest: empty). Blocks the host until every
  // rank it reads from has announced. `stream` is the one the caller's copies out of the mapped
  // regions go to. Throws std::logic_error when a wanted region was not announced (the ranks'
  // plans disagree on who reads what).
  std::vector<IpcTargets> exchange(uint32_t seq, const IpcRegions& mine, const std::vector<IpcWanted>& wanted,
                                   CUstream stream);

  size_t openMappings() const;  // cached peer mappings (tests)
  size_t exportedKeys() const { return exported_.size() + retiredKeys_.size(); }

 private:
  struct Entry;
  struct Announcement;
  struct Exported {
    uint64_t base, bytes;
    uint32_t lastSeq;
  };
  struct Mapping {
    uint64_t bufferId, base, bytes;  // the exporter's allocation
    CUdeviceptr mapped;
  };
  struct Retired {
    CUdeviceptr mapped;
    CUevent done;  // recorded after the last copy into the mapping
  };
  Announcement* slot(int r, uint32_t seq) const;
  volatile uint32_t* readUpTo(int r) const;
  void exportBuffer(uint64_t id, uint64_t base, uint64_t bytes, uint32_t seq);
  Entry describe(const IpcRegion& region, uint32_t seq);
  Announcement awaitAnnouncement(int peer, uint32_t seq) const;
  CUdeviceptr mapPeer(int peer, const Entry& e, CUstream stream);
  void retire(CUdeviceptr mapped, CUstream stream);
  void collectGarbage();
  std::string key(int r, uint64_t id) const;

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_, world_, device_;
  const SharedHostRegion& region_;
  size_t offset_;
  std::chrono::milliseconds timeout_;
  std::map<uint64_t, Exported> exported_;              // buffer id -> what peers may map
  std::vector<std::pair<uint64_t, uint32_t>> retiredKeys_;  // (buffer id, last seq naming it)
  std::vector<std::vector<Mapping>> mappings_;         // per peer, least recently used first
  std::vector<Retired> retired_;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
