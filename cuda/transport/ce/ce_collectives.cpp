#include "transport/ce/ce_collectives.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/reduce_kernels.h"

namespace hoccl {

#ifdef HOCCL_WITH_CUDA

CeGroupOptions CeGroupOptions::fromEnv() {
  CeGroupOptions o;
  o.pathMode = cePathModeFromEnv();
  o.reduceOn = reduceOnFromEnv();
  o.reduceCtas = reduceCtasFromEnv();
  return o;
}

namespace {

// Every rank adds 1 to `key`; returns once all `world` did.
void storeBarrier(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int world, int rank,
                  std::chrono::milliseconds timeout, const char* what) {
  store->add(key, 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store->add(key, 0) < world) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("hoccl cuda-ce on rank " + std::to_string(rank) + ": timed out " + what);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Group-wide AND of "all my pairs are p2p": the reference collectives use one path for the whole
// group, so every rank's staging-publication count stays identical.
bool groupAllP2P(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int world, int rank,
                 bool mineP2P, std::chrono::milliseconds timeout) {
  if (!mineP2P) store->add(prefix + "/host_votes", 1);
  storeBarrier(store, prefix + "/votes", world, rank, timeout, "agreeing on the ce path");
  return store->add(prefix + "/host_votes", 0) == 0;
}

// Ends an op on every path out of it (also when it throws half-way: what was enqueued counts).
struct OpEnd {
  std::function<void()> end;
  ~OpEnd() { end(); }
};

}  // namespace

// Graph capture would freeze this call's sequence numbers into the graph's memop nodes; on
// replay the GEQ waits would already be satisfied and ranks would race. Refuse clearly.
void ceRefuseCapture(CUstream stream, const char* op) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cu::check(cu::driver().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  if (status != CU_STREAM_CAPTURE_STATUS_NONE)
    throw std::runtime_error(std::string("hoccl ") + op +
                             ": CUDA graph capture is not supported by the cuda-ce transport yet (its "
                             "cross-rank flags carry per-call sequence numbers that a replayed graph would reuse)");
}

CeGroup::CeGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int world,
                 int device, CeGroupOptions opts, PlanRule rule)
    : store_(store), prefix_(prefix), rank_(rank), world_(world), device_(device), opts_(opts),
      rule_(std::move(rule)), opSeq_(opts.firstSeq) {
  peers_ = discoverPeers(store, prefix + "/peers", rank, world, device, opts.pathMode, opts.timeout);
  bool mineP2P = true;
  for (int r = 0; r < world; ++r)
    if (r != rank && peers_[r].path != CePath::P2P) mineP2P = false;
  if (!groupAllP2P(store, prefix + "/path", world, rank, mineP2P, opts.timeout))
    for (auto& p : peers_) p.path = CePath::Host;
  const size_t flagBytes = CeSync::bytesNeeded(world);
  flagRegion_ = std::make_unique<SharedHostRegion>(store, prefix + "/flags", rank, world,
                                                   flagBytes + IpcExchange::bytesNeeded(world), device, opts.timeout);
  barrier_ = std::make_unique<CeSync>(*flagRegion_, 0, rank, world);
  barrier_->hostInit(opts.firstSeq);
  ipc_ = std::make_unique<IpcExchange>(store, prefix + "/ipc", rank, world, device, *flagRegion_, flagBytes,
                                       opts.firstSeq, opts.timeout);
  staging_ = std::make_unique<HostStaging>(store, prefix + "/stage", rank, world, opts.slotBytes, 2, device,
                                           opts.timeout);
  exec_ = std::make_unique<CePlanExecutor>(*barrier_, *staging_, device, opts.reduceOn, opts.reduceCtas,
                                           opts.firstSeq, [this](CUstream s, const char* what) { syncStream(s, what); });
  cu::ContextGuard guard(device);
  cu::check(cu::driver().cuEventCreate(&done_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  cu::check(cu::driver().cuEventCreate(&streamSync_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  // Every rank's flags hold firstSeq before any rank waits on them.
  storeBarrier(store, prefix + "/init", world, rank, opts.timeout, "waiting for every rank to set up its flags");
}

CeGroup::~CeGroup() {
  try {
    synchronize(opts_.timeout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s; leaving its host memory registered and mapped, since the stream may still copy "
                 "into it\n", e.what());
    ipc_.release();  // NOLINT: deliberately leaked, see above
    exec_.release();
    staging_.release();
    flagRegion_.release();
    return;
  }
  try {
    cu::ContextGuard guard(device_);
    cu::driver().cuEventDestroy(done_);
    cu::driver().cuEventDestroy(streamSync_);
  } catch (...) {
    // Teardown: the driver may already be gone.
  }
}

void CeGroup::finishOp(CUstream s) noexcept {
  cu::driver().cuEventRecord(done_, s);  // a failure here surfaces in the next driver call
}

void CeGroup::waitForEvent(CUevent e, std::chrono::steady_clock::time_point deadline, const std::string& what) {
  for (;;) {
    CUresult r = cu::driver().cuEventQuery(e);
    if (r == CUDA_SUCCESS) return;
    if (r != CUDA_ERROR_NOT_READY) cu::check(r, "cuEventQuery");
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("hoccl cuda-ce on rank " + std::to_string(rank_) + ": " + what + "; " + flagState());
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void CeGroup::synchronize(std::chrono::milliseconds timeout) {
  cu::ContextGuard guard(device_);
  waitForEvent(done_, std::chrono::steady_clock::now() + timeout,
               "the comm stream has not finished this group's work after " + std::to_string(timeout.count()) + " ms");
}

std::string CeGroup::flagState() const {
  const std::string out = barrier_->unsatisfiedWaits("BARRIER");
  return out.empty() ? "no cross-rank wait is unsatisfied (the stream is busy with copies, a kernel, or work "
                       "it was ordered after)"
                     : "unsatisfied cross-rank waits: " + out;
}

std::vector<int> CeGroup::peersOn(CePath path) const {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && peers_[r].path == path) out.push_back(r);
  return out;
}

std::string CeGroup::describePaths() const {
  std::string s;
  for (int r = 0; r < world_; ++r)
    s += (s.empty() ? "" : " ") + std::to_string(r) + ":" + (r == rank_ ? "self" : cePathName(peers_[r].path));
  return s;
}

bool CeGroup::allP2P() const { return world_ > 1 && peersOn(CePath::P2P).size() == static_cast<size_t>(world_ - 1); }

// Every request says where its plan runs: on the copy engines, reading peers in place only where
// the group agreed at creation that every peer is on the p2p path.
PlanRequest CeGroup::request(OpKind kind, int64_t elemSize, int64_t bytes, int root) const {
  PlanRequest req{kind};
  req.rank = rank_;
  req.world = world_;
  req.root = root;
  req.elemSize = elemSize;
  req.bytes = bytes;
  req.slotBytes = static_cast<int64_t>(staging_->slotBytes());
  req.onCopyEngine = true;
  req.everyPeerMapped = allP2P();
  return req;
}

void CeGroup::syncStream(CUstream s, const char* what) {
  cu::check(cu::driver().cuEventRecord(streamSync_, s), "cuEventRecord");
  waitForEvent(streamSync_, std::chrono::steady_clock::now() + opts_.timeout, what);
}

void CeGroup::allGather(CUstream stream, CUdeviceptr out, CUdeviceptr in, size_t bytes) {
  if (bytes == 0) return;
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "all_gather");
  OpEnd end{[&] { finishOp(stream); }};
  PlanRequest req = request(OpKind::AllGather, 1, bytes);
  CePlanArgs args{{in}, {}};
  for (int r = 0; r < world_; ++r) args.out.push_back(out + r * bytes);
  run(stream, req, args, {in, bytes}, {out, bytes * world_});
}

void CeGroup::allToAll(CUstream stream, CUdeviceptr out, CUdeviceptr in, size_t blockBytes) {
  if (blockBytes == 0) return;
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "all_to_all");
  OpEnd end{[&] { finishOp(stream); }};
  // One phase holding every pair: the staged plan packs each source's blocks into its slot, in
  // order; the direct-read plan reads every block between two barriers.
  PlanRequest req = request(OpKind::AllToAll, 1, blockBytes);
  TransferPhase all;
  CePlanArgs args;
  for (int r = 0; r < world_; ++r) {
    for (int d = 0; d < world_; ++d) all.push_back({r, d, static_cast<int64_t>(blockBytes)});
    args.in.push_back(in + r * blockBytes);
    args.out.push_back(out + r * blockBytes);
  }
  req.phases.push_back(all);
  run(stream, req, args, {in, blockBytes * world_}, {out, blockBytes * world_});
}

void CeGroup::broadcast(CUstream stream, CUdeviceptr buf, size_t bytes, int root) {
  if (bytes == 0 || world_ == 1) return;
  if (root < 0 || root >= world_) throw std::invalid_argument("hoccl broadcast: root out of range");
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "broadcast");
  OpEnd end{[&] { finishOp(stream); }};
  PlanRequest req = request(OpKind::Broadcast, 1, bytes, root);
  run(stream, req, CePlanArgs{{buf}, {buf}}, {buf, bytes}, {buf, bytes});
}

void CeGroup::allReduce(CUstream stream, CUdeviceptr buf, int64_t count, c10::ScalarType dtype, RedOp op,
                        double factor) {
  if (count == 0) return;
  std::string why = checkReducible(dtype, op);
  if (!why.empty()) throw std::invalid_argument("hoccl all_reduce: " + why);
  cu::ContextGuard guard(device_);
  ceRefuseCapture(stream, "all_reduce");
  OpEnd end{[&] { finishOp(stream); }};
  const int64_t elem = static_cast<int64_t>(hoccl::elementSize(dtype));
  PlanRequest req = request(OpKind::AllReduce, elem, count * elem);
  const CePlanArgs args{{buf}, {buf}, dtype, op, factor};
  const size_t bytes = static_cast<size_t>(req.bytes);
  run(stream, req, args, {buf, bytes}, {buf, bytes});
}

namespace {

// Marks, per peer, which of its regions (In, Out) `plan` reads.
void markReads(const Plan& plan, std::vector<IpcWanted>& wanted) {
  auto mark = [&](const Loc& l) {
    if (l.remote()) wanted.at(l.buf)[l.space == Space::PeerOut ? 1 : 0] = true;
  };
  for (const Step& s : plan.steps) {
    mark(s.src);
    for (const Loc& l : s.srcs) mark(l);
  }
}

// Rank r's blocks as mapped here: the same offsets into its region as this rank's blocks have
// into its own (every CeGroup op lays its blocks out alike on all ranks).
std::vector<CUdeviceptr> mirrorBlocks(const std::vector<CUdeviceptr>& mine, const IpcRegion& myRegion,
                                      const IpcTarget& theirs, int rank, int peer, const char* what) {
  if (theirs.bytes != myRegion.bytes)
    throw std::invalid_argument("hoccl cuda-ce p2p: rank " + std::to_string(peer) + "'s " + what + " for this op has " +
                                std::to_string(theirs.bytes) + " bytes, rank " + std::to_string(rank) + "'s " +
                                std::to_string(myRegion.bytes) + " (the ranks called the op with different sizes)");
  std::vector<CUdeviceptr> out;
  for (CUdeviceptr b : mine) out.push_back(theirs.ptr + (b - myRegion.ptr));
  return out;
}

}  // namespace

// The choice is the rule's, from the request alone, so every rank takes the same way.
void CeGroup::run(CUstream stream, const PlanRequest& req, const CePlanArgs& args, IpcRegion in, IpcRegion out) {
  const Plan plan = rule_.build(req);
  if (rule_.readsInPlace(req)) return runDirectRead(stream, req, plan, args, in, out);
  if (plan.readsPeers())
    throw std::logic_error("hoccl cuda-ce: plan " + plan.algo + " reads peers' buffers, but its rule says the op "
                           "does not read in place, so no rank announces its buffers");
  runPlan(stream, plan, args);
}

// The plans of every rank come from the same request, so each rank knows without asking which
// of its regions some peer reads (only those are exported) and which peers' regions it reads.
// The exchange blocks the host until the ranks this one reads from have announced this op's
// buffers; the stream work stays asynchronous: the plan's first barrier waits for the peers'
// streams to reach the op before any read, the last keeps this rank's blocks until every peer
// has read them.
void CeGroup::runDirectRead(CUstream stream, const PlanRequest& req, const Plan& plan, CePlanArgs args, IpcRegion in,
                            IpcRegion out) {
  if (req.addressesPublished)
    throw std::logic_error("hoccl cuda-ce: a direct-read plan needs its first barrier on the copy engines");
  if (!allP2P())
    throw std::logic_error("hoccl cuda-ce: the rule says plan " + plan.algo + " reads peers' buffers in place, "
                           "but not every peer's buffers are mapped in this group (everyPeerMapped unset)");
  std::vector<IpcWanted> reads(world_, IpcWanted{false, false});
  markReads(plan, reads);
  std::vector<IpcWanted> readByPeers(world_, IpcWanted{false, false});
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    PlanRequest theirs = req;
    theirs.rank = r;
    markReads(rule_.build(theirs), readByPeers);
  }
  IpcRegions mine{};
  if (readByPeers[rank_][0]) mine[0] = in;
  if (readByPeers[rank_][1]) mine[1] = out;
  const auto mapped = ipc_->exchange(++opSeq_, mine, reads, stream);
  args.peerIn.assign(world_, {});
  args.peerOut.assign(world_, {});
  for (int r = 0; r < world_; ++r) {
    if (reads[r][0]) args.peerIn[r] = mirrorBlocks(args.in, in, mapped[r][0], rank_, r, "input");
    if (reads[r][1]) args.peerOut[r] = mirrorBlocks(args.out, out, mapped[r][1], rank_, r, "output");
  }
  args.d2d = true;
  runPlan(stream, plan, args);
}

void CeGroup::runPlan(CUstream stream, const Plan& plan, const CePlanArgs& args) {
  lastAlgo_ = plan.algo;
  exec_->run(stream, plan, args);
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
