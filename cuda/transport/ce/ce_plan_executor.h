// Runs a Plan (common/plan_types.h) on the copy-engine transport by enqueueing its steps on one stream:
// the same plans the CPU executor (exec/executor.cpp) runs, so an algorithm is written once for
// both. The host is not blocked, except by host-side reductions.
//
//  Copy   Slot <- In/Out   D2H into this rank's pinned shared staging slot (copy engine)
//         In/Out <- Slot   H2D out of any rank's slot (copy engine)
//         In/Out <- PeerIn/PeerOut
//                          one D2D out of the peer's block, IPC-mapped by the caller (p2p path)
//         In/Out <- In/Out through a private pinned bounce buffer (D2H + H2D): a same-device
//                          D2D might run on SMs, a copy to or from pinned host memory does not;
//                          on the p2p path (CePlanArgs::d2d) one D2D, that path's own copy
//  Barrier                 stream write of this rank's barrier count to every peer, then one batch
//                          of stream waits for every peer's count (ce_sync: cyclic >=). Like the
//                          CPU's barrier it is full, so the plans' slot-reuse rule holds as is: a
//                          slot is rewritten only after a barrier every reader of its previous
//                          contents reached after reading them; and a direct-read plan's final
//                          barrier keeps each rank's blocks unchanged until every reader is done.
//  Reduce                  in passes of one staging slot's size;
//                          gpu: slot sources H2D and peer sources D2D into device scratch, this
//                          rank's own blocks read in place, one bounded kernel (ce_reduce); a slot
//                          destination gets the result by D2H;
//                          host: device sources D2H into private pinned scratch, then the CPU
//                          waits for the stream and reduces from there and the shared slots.
//
// Like the CPU executor it owns the counters every rank advances identically (barrier sequence,
// staging-buffer cursor), so every rank of a group must run the same sequence of plan shapes.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/plan_types.h"
#include "transport/ce/ce_copy.h"
#include "transport/ce/ce_reduce.h"
#include "transport/ce/ce_sync.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

// One op's device blocks (plan locations In(i) / Out(i)) and its reduction.
struct CePlanArgs {
  std::vector<CUdeviceptr> in, out;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  RedOp op = RedOp::Sum;
  double factor = 1.0;  // PREMUL_SUM
  // Plans that read peers in place: peerIn[r][i] / peerOut[r][i] is rank r's block In(i) /
  // Out(i) mapped into this process (empty for ranks the plan does not read).
  std::vector<std::vector<CUdeviceptr>> peerIn, peerOut;
  // The op runs on the p2p path, whose copies are D2D anyway (and checked by sm_free's d2d
  // row): copies between this rank's own blocks take one D2D instead of the pinned bounce.
  bool d2d = false;
};

class CePlanExecutor {
 public:
  // Blocks the host until `stream` ran everything enqueued so far (throws on timeout, naming
  // the unsatisfied waits): host reductions read what the stream copied.
  using SyncStream = std::function<void(CUstream stream, const char* what)>;

  // `barrier` flags hold `firstSeq` on every rank; `staging` has two slots per rank.
  CePlanExecutor(CeSync& barrier, const HostStaging& staging, int device, ReduceOn reduceOn, int reduceCtas,
                 uint32_t firstSeq, SyncStream syncStream);
  CePlanExecutor(const CePlanExecutor&) = delete;
  CePlanExecutor& operator=(const CePlanExecutor&) = delete;

  // Enqueues `plan` on `stream` (the caller's context is the device's primary context).
  void run(CUstream stream, const Plan& plan, const CePlanArgs& args);

 private:
  struct Where {
    bool host;          // a staging slot (pinned host memory), else device memory
    void* hostPtr;      // when host
    CUdeviceptr dev;    // when device
    bool remote;        // a peer's block, IPC-mapped
  };
  Where resolve(const Loc& loc, const CePlanArgs& args, int64_t bytes) const;
  void copy(CUstream s, const Step& step, const CePlanArgs& args);
  void deviceCopy(CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t bytes, bool d2d);
  void barrier(CUstream s);
  void reduce(CUstream s, const Step& step, const CePlanArgs& args);
  void reduceOnGpu(CUstream s, int64_t count, bool finalize, const Where& dst, const std::vector<Where>& srcs,
                   const CePlanArgs& args);
  void reduceOnHost(CUstream s, int64_t count, bool finalize, const Where& dst, const std::vector<Where>& srcs,
                    const CePlanArgs& args);

  CeSync& barrier_;
  const HostStaging& staging_;
  int device_;
  SyncStream syncStream_;
  std::vector<int> peers_;
  PinnedHostBuffer bounce_;                 // device-local copies, one slot's size per pass
  std::unique_ptr<ReduceKernel> kernel_;    // gpu reductions only
  std::unique_ptr<DeviceBuffer> scratch_;   // gpu reductions: world source slots + one result slot
                                            // (+ running values: accScratchOffset())
  size_t accScratchOffset() const;          // 0: no chained 16-bit reduction at this world size
  std::unique_ptr<PinnedHostBuffer> hostScratch_;  // host reductions of device sources: world slots
  uint32_t barrierSeq_;                     // last barrier (same on every rank; cyclic)
  uint32_t bufCursor_ = 0;                  // staging-buffer cursor, as in exec/executor.cpp
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
