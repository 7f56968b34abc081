#include "backend/process_group.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "transport/shm/shared_tensor.h"
#include "exec/streaming_copy.h"

#include "varipath/scheduler.h"

namespace hoccl {

// ---------------------------------------------------------------- Work

WorkHOCCL::WorkHOCCL(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs_)
    if (!t.device().is_cpu()) devices.push_back(t.device());
  future_ = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), devices);
}

void WorkHOCCL::complete(std::exception_ptr error, int sourceRank) {
  sourceRank_ = sourceRank;
  // CUDA: the future records its events on the comm stream, so consumers wait on the op.
  c10::OptionalStreamGuard guard(commStream_);
  if (error) future_->setError(error);
  else future_->markCompleted(c10::IValue(outputs_));
  finish(error);
}

WorkGroupHOCCL::WorkGroupHOCCL(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {}

bool WorkGroupHOCCL::isCompleted() {
  for (auto& w : works_)
    if (!w->isCompleted()) return false;
  return true;
}

bool WorkGroupHOCCL::wait(std::chrono::milliseconds timeout) {
  for (auto& w : works_) w->wait(timeout);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkGroupHOCCL::getFuture() {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  for (auto& w : works_) futures.push_back(w->getFuture());
  auto all = c10::collectAll(c10::List<c10::intrusive_ptr<c10::ivalue::Future>>(futures));
  std::vector<at::Tensor> outputs;
  for (auto& w : works_)
    for (auto& t : w->result()) outputs.push_back(t);
  return all->then([outputs](c10::ivalue::Future&) { return c10::IValue(outputs); },
                   c10::ListType::create(c10::TensorType::get()));
}

// ---------------------------------------------------------------- config

namespace {

int64_t envBytes(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  std::string unit = end ? std::string(end) : "";
  int64_t mult = 1;
  if (unit == "K" || unit == "KB" || unit == "k") mult = 1 << 10;
  else if (unit == "M" || unit == "MB" || unit == "m") mult = 1 << 20;
  else if (unit == "G" || unit == "GB" || unit == "g") mult = 1 << 30;
  else if (!unit.empty())
    throw std::invalid_argument(std::string("hoccl: cannot parse ") + name + "=" + v +
                                " (use bytes, or a K/M/G suffix)");
  return static_cast<int64_t>(x * mult);
}

std::string envString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

RedOp toRedOp(const c10d::ReduceOp& op, double* factor, const char* opName) {
  *factor = 1.0;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return RedOp::Sum;
    case c10d::ReduceOp::AVG: return RedOp::Avg;
    case c10d::ReduceOp::PRODUCT: return RedOp::Product;
    case c10d::ReduceOp::MIN: return RedOp::Min;
    case c10d::ReduceOp::MAX: return RedOp::Max;
    case c10d::ReduceOp::BAND: return RedOp::BitAnd;
    case c10d::ReduceOp::BOR: return RedOp::BitOr;
    case c10d::ReduceOp::BXOR: return RedOp::BitXor;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s, "hoccl ", opName, ": PREMUL_SUM without a factor");
      *factor = s->tensor_factor.defined() ? s->tensor_factor.to(at::kDouble).item<double>()
                                           : s->double_factor;
      return RedOp::PremulSum;
    }
    default:
      TORCH_CHECK(false, "hoccl ", opName, ": unsupported reduce op");
  }
}

char* ptr(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }
int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }

// A contiguous working copy of a user tensor; written back after the op when they differ.
struct Staged {
  at::Tensor user, work;
  explicit Staged(const at::Tensor& t) : user(t), work(t.is_contiguous() ? t : t.contiguous()) {}
  void writeBack() const {
    if (!work.is_same(user)) user.copy_(work);
  }
};

}  // namespace

HocclConfig HocclConfig::fromEnv(int world) {
  HocclConfig c;
  c.shm.slotBytes = static_cast<size_t>(envBytes("HOCCL_SHM_SLOT_BYTES", 4 << 20));
  // Rings are per ordered pair, so shrink them as the group grows.
  int64_t ringDefault = std::max<int64_t>(64 << 10, std::min<int64_t>(1 << 20, (64LL << 20) / (world * world)));
  c.shm.ringBytes = static_cast<size_t>(envBytes("HOCCL_SHM_RING_BYTES", ringDefault));
  c.oneShotMaxBytes = envBytes("HOCCL_ALLREDUCE_ONESHOT_BYTES", 64 << 10);
  c.crossMemoryMinBytes = envBytes("HOCCL_CMA_MIN_BYTES", 256 << 10);
  std::string cma = envString("HOCCL_SHM_CMA", "auto");
  if (cma == "auto") c.shm.crossMemory = -1;
  else if (cma == "0" || cma == "off") c.shm.crossMemory = 0;
  else if (cma == "1" || cma == "on") c.shm.crossMemory = 1;
  else throw std::invalid_argument("hoccl: HOCCL_SHM_CMA=" + cma + " is not one of auto, 0, 1");
  c.inlineMaxBytes = envBytes("HOCCL_INLINE_BYTES", 64 << 10);
  c.streamingCopyMinBytes = envBytes("HOCCL_STREAMING_COPY_BYTES", static_cast<int64_t>(kStreamingCopyMinBytes));
  c.hugePageMinBytes = envBytes("HOCCL_HUGEPAGE_MIN_BYTES", 4 << 20);
  // Cross-memory reads of reused buffers on huge pages run 11-25 % faster at 64 MB (README
  // A/B), which moves the point where staging beats all_reduce's two direct reads per byte
  // further out.
  c.allReduceDirectReadMaxBytes =
      envBytes("HOCCL_ALLREDUCE_CMA_MAX_BYTES", c.hugePageMinBytes > 0 ? 256 << 20 : 64 << 20);
  c.alltoallPlanCache = envBytes("HOCCL_ALLTOALL_PLAN_CACHE", 8);
  if (c.alltoallPlanCache < 0) throw std::invalid_argument("hoccl: HOCCL_ALLTOALL_PLAN_CACHE must be >= 0");
  c.cudaViaHostOnly = envString("HOCCL_CUDA_TRANSPORT", "ce") == "host";
  std::string dbg = envString("HOCCL_DEBUG", "");
  c.debug = dbg == "TRACE" ? 2 : (dbg == "INFO" ? 1 : 0);
  std::string algo = envString("HOCCL_ALLTOALL_ALGO", "varipath");
  if (algo == "direct") c.alltoall = AllToAllAlgo::Direct;
  else if (algo == "pairwise") c.alltoall = AllToAllAlgo::Pairwise;
  else if (algo == "varipath") c.alltoall = AllToAllAlgo::VarioPath;
  else
    throw std::invalid_argument("hoccl: HOCCL_ALLTOALL_ALGO=" + algo +
                                " is not one of varipath, direct, pairwise");
  if (c.shm.slotBytes < 4096) throw std::invalid_argument("hoccl: HOCCL_SHM_SLOT_BYTES must be >= 4096");
  if (c.shm.ringBytes < 4096) throw std::invalid_argument("hoccl: HOCCL_SHM_RING_BYTES must be >= 4096");
  return c;
}

// ---------------------------------------------------------------- construction

struct ProcessGroupHOCCL::Collective {
  const char* opName;
  PlanRequest req;
  ExecContext ctx;
  std::vector<int64_t> sendBytes, recvBytes;  // all_to_all only
  std::chrono::steady_clock::time_point deadline;
};

static void checkSingleHost(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                            std::chrono::milliseconds timeout) {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  std::string host = envString("HOCCL_HOSTNAME", buf);
  store->set("hoccl/host/" + std::to_string(rank), std::vector<uint8_t>(host.begin(), host.end()));
  for (int r = 0; r < size; ++r) {
    std::string key = "hoccl/host/" + std::to_string(r);
    store->wait({key}, timeout);
    auto v = store->get(key);
    std::string other(v.begin(), v.end());
    if (other != host)
      throw std::runtime_error("hoccl: rank " + std::to_string(rank) + " is on host '" + host +
                               "' but rank " + std::to_string(r) + " is on '" + other +
                               "'; this version of hoccl runs every rank of a group on one host "
                               "(the tcp transport is not implemented yet)");
  }
}

ProcessGroupHOCCL::ProcessGroupHOCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      store_(store),
      config_(HocclConfig::fromEnv(size)),
      hugePages_(config_.hugePageMinBytes) {
  checkSingleHost(store, rank, size, timeout);
  group_ = std::make_unique<ShmGroup>(store, rank, size, config_.shm, timeout);
  executor_ = std::make_unique<Executor>(*group_, config_.streamingCopyMinBytes);
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupHOCCL::~ProcessGroupHOCCL() { shutdown(); }

void ProcessGroupHOCCL::shutdown() {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  queueCv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(p2pMutex_);
  p2p_.reset();
}

void ProcessGroupHOCCL::abort() {
  group_->abort("hoccl: rank " + std::to_string(rank_) + " called abort()");
  shutdown();
}

void ProcessGroupHOCCL::setAllToAllScheduler(std::shared_ptr<const varipath::Scheduler> scheduler) {
  hasChannels_ = scheduler != nullptr;
  scheduler_ = std::move(scheduler);
}

std::string ProcessGroupHOCCL::lastAlgorithm() const {
  std::lock_guard<std::mutex> lock(lastAlgoMutex_);
  return lastAlgo_;
}

std::vector<TransferPhase> ProcessGroupHOCCL::lastAllToAllPhases() const {
  std::lock_guard<std::mutex> lock(lastAlgoMutex_);
  return lastAllToAllPhases_;
}

// ---------------------------------------------------------------- worker (CPU stream manager)

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                          Body body, int64_t bytes) {
  auto work = c10::make_intrusive<WorkHOCCL>(rank_, type, std::move(outputs));
  issued_.fetch_add(1);
  if (capturing()) {  // host mirrors of a CUDA op: hand the body to the CUDA stream manager
    storeCapture(std::move(body));
    return work;
  }
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    TORCH_CHECK(!stopping_, "hoccl: rank ", rank_, ": the process group was shut down");
    if (coalescing_) coalesced_.push_back(work);
    // A small op with nothing ahead of it runs right here: two thread hand-offs cost more than
    // the op itself. Issue order is kept because nothing is queued or running.
    bool runHere = bytes <= config_.inlineMaxBytes && queue_.empty() && !busy_ && !coalescing_;
    if (!runHere) {
      queue_.emplace_back(work, std::move(body));
      queueCv_.notify_one();
      return work;
    }
    busy_ = true;
  }
  runTask(work, body);
  bool wakeWorker;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    busy_ = false;
    // Waking the worker for nothing costs a context switch per op on a busy core.
    wakeWorker = !queue_.empty() || stopping_;
  }
  if (wakeWorker) queueCv_.notify_one();
  return work;
}

void ProcessGroupHOCCL::runTask(const c10::intrusive_ptr<WorkHOCCL>& work, const Body& body) {
  try {
    body();
    work->complete(nullptr);
  } catch (...) {
    work->complete(std::current_exception());
  }
}

void ProcessGroupHOCCL::workerLoop() {
  while (true) {
    std::pair<c10::intrusive_ptr<WorkHOCCL>, Body> task;
    {
      std::unique_lock<std::mutex> lock(queueMutex_);
      queueCv_.wait(lock, [&] { return (stopping_ && !busy_) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    runTask(task.first, task.second);
    {
      std::lock_guard<std::mutex> lock(queueMutex_);
      busy_ = false;
    }
  }
}

void ProcessGroupHOCCL::startCoalescing() {
  std::lock_guard<std::mutex> lock(queueMutex_);
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    coalescing_ = false;
    for (auto& w : coalesced_) works.push_back(w);
    coalesced_.clear();
  }
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

// ---------------------------------------------------------------- running a collective

void ProcessGroupHOCCL::checkWait(const Collective& c, int peer) {
  std::string prefix = std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) + ": ";
  if (group_->aborted())
    throw std::runtime_error(prefix + "the group was aborted: " + group_->abortMessage());
  if (std::chrono::steady_clock::now() > c.deadline) {
    std::string msg = prefix + "Timed out after " + std::to_string(timeout_.count()) +
                      " ms waiting for rank " + std::to_string(peer) + " to reach collective #" +
                      std::to_string(c.ctx.desc.opSeq);
    group_->abort(msg);
    throw std::runtime_error(msg);
  }
  try {
    group_->checkAlive(peer, prefix + "waiting for a peer");
  } catch (const std::exception& e) {
    group_->abort(e.what());
    throw;
  }
}

void ProcessGroupHOCCL::validateDescriptors(const Collective& c, uint32_t parity) const {
  const OpDesc& mine = c.ctx.desc;
  bool agree = true;  // the common case, checked without building any message
  for (int r = 0; r < size_ && agree; ++r) {
    const OpDesc d = group_->control(r).desc[parity];
    agree = d.kind == mine.kind && d.dtype == mine.dtype && d.numel == mine.numel && d.root == mine.root &&
            d.redop == mine.redop && d.opSeq == mine.opSeq;
  }
  if (agree) return;
  std::ostringstream err;
  for (int r = 0; r < size_; ++r) {
    const OpDesc d = group_->control(r).desc[parity];
    if (d.kind != mine.kind)
      err << "; rank " << r << " called " << opKindName(static_cast<OpKind>(d.kind));
    else if (d.dtype != mine.dtype)
      err << "; rank " << r << " passed dtype " << c10::toString(static_cast<c10::ScalarType>(d.dtype))
          << " but rank " << rank_ << " passed " << c10::toString(static_cast<c10::ScalarType>(mine.dtype));
    else if (d.numel != mine.numel)
      err << "; rank " << r << " passed " << d.numel << " elements but rank " << rank_ << " passed "
          << mine.numel;
    else if (d.root != mine.root)
      err << "; rank " << r << " used root " << d.root << " but rank " << rank_ << " used " << mine.root;
    else if (d.redop != mine.redop)
      err << "; rank " << r << " used op " << redOpName(static_cast<RedOp>(d.redop)) << " but rank "
          << rank_ << " used " << redOpName(static_cast<RedOp>(mine.redop));
    else if (d.opSeq != mine.opSeq)
      err << "; rank " << r << " is at collective #" << d.opSeq << " but rank " << rank_ << " is at #"
          << mine.opSeq;
  }
  std::string e = err.str();
  if (!e.empty())
    throw std::invalid_argument(std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) +
                                ": ranks disagree (this rank called " +
                                opKindName(static_cast<OpKind>(mine.kind)) + ")" + e);
}

void ProcessGroupHOCCL::validateSplits(const Collective& c, uint32_t parity) const {
  std::ostringstream err;
  for (int s = 0; s < size_; ++s)
    for (int d = 0; d < size_; ++d) {
      int64_t sent = group_->splits(s, parity)[d];
      int64_t expected = group_->splits(d, parity)[size_ + s];
      if (sent != expected)
        err << "; rank " << s << " sends " << sent << " bytes to rank " << d << " but rank " << d
            << " expects " << expected << " bytes from rank " << s;
    }
  std::string e = err.str();
  if (!e.empty())
    throw std::invalid_argument(std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) +
                                ": split sizes disagree between senders and receivers" + e);
}

std::vector<TransferPhase> ProcessGroupHOCCL::scheduleAllToAll(const std::vector<int64_t>& m) {
  const int W = size_;
  std::vector<TransferPhase> phases;
  TransferPhase self;
  for (int r = 0; r < W; ++r) self.push_back({r, r, m[r * W + r]});
  phases.push_back(self);
  if (config_.alltoall == AllToAllAlgo::Pairwise) {
    for (int k = 1; k < W; ++k) {
      TransferPhase p;
      for (int s = 0; s < W; ++s) p.push_back({s, (s + k) % W, m[s * W + (s + k) % W]});
      phases.push_back(p);
    }
    return phases;
  }
  if (config_.alltoall == AllToAllAlgo::VarioPath && scheduler_) {
    std::vector<TransferPhase> planned = varipathPhases(m);
    phases.insert(phases.end(), planned.begin(), planned.end());
    return phases;
  }
  TransferPhase all;
  for (int s = 0; s < W; ++s)
    for (int d = 0; d < W; ++d)
      if (s != d) all.push_back({s, d, m[s * W + d]});
  phases.push_back(all);
  return phases;
}

// VarioPath's phases for a split matrix, from the cache of recent matrices when it holds it
// (moved to the front), else planned and cached (the least recently used entry goes).
std::vector<TransferPhase> ProcessGroupHOCCL::varipathPhases(const std::vector<int64_t>& m) {
  std::vector<TransferPhase> phases;
  const size_t keep = static_cast<size_t>(config_.alltoallPlanCache);
  {
    std::lock_guard<std::mutex> lock(scheduleMutex_);
    for (auto it = scheduleCache_.begin(); it != scheduleCache_.end(); ++it) {
      if (it->matrix != m) continue;
      phases = it->phases;
      if (it != scheduleCache_.begin()) {
        CachedSchedule hit = std::move(*it);
        scheduleCache_.erase(it);
        scheduleCache_.push_front(std::move(hit));
      }
      ++schedulesReused_;
      return phases;
    }
  }
  for (const auto& ph : scheduler_->plan(m)) {
    TransferPhase p;
    for (const auto& t : ph) p.push_back({t.src, t.dst, t.bytes});
    phases.push_back(std::move(p));
  }
  std::lock_guard<std::mutex> lock(scheduleMutex_);
  ++schedulesPlanned_;
  if (keep > 0) {
    scheduleCache_.push_front({m, phases});
    if (scheduleCache_.size() > keep) scheduleCache_.pop_back();
  }
  return phases;
}

std::pair<uint64_t, uint64_t> ProcessGroupHOCCL::allToAllPlanCounts() const {
  std::lock_guard<std::mutex> lock(scheduleMutex_);
  return {schedulesPlanned_, schedulesReused_};
}

std::shared_ptr<const Plan> ProcessGroupHOCCL::planFor(const PlanRequest& req) {
  const auto key = std::make_tuple(int(req.kind), req.root, int64_t(req.elemSize), req.bytes, bool(req.crossMemory),
                                   req.addressesPublished, req.everyTensorShared);
  std::lock_guard<std::mutex> lock(planMutex_);
  auto it = planCache_.find(key);
  if (it != planCache_.end()) return it->second;
  auto plan = std::make_shared<const Plan>(buildPlan(req));
  if (planCache_.size() > 256) planCache_.clear();
  planCache_[key] = plan;
  return plan;
}

bool ProcessGroupHOCCL::everyRankShared(uint32_t parity, int64_t bytes) const {
  for (int r = 0; r < size_; ++r) {
    const SharedRegionRef& ref = group_->blockRegions(r, parity)[0];
    if (!ref.covers(group_->blockAddresses(r, parity)[0], static_cast<uint64_t>(bytes))) return false;
  }
  return true;
}

// Before peers are told where this rank's buffers are: the blocks they will read with
// process_vm_readv go on huge pages when their range comes back (huge_pages.h). Only plans that
// read peers directly pin pages (the planner's own test decides); shared tensors are mapped, not
// pinned, and are left alone.
void ProcessGroupHOCCL::promoteReusedBuffers(const Collective& c) {
  if (config_.hugePageMinBytes <= 0 || !readsPeersDirectly(c.req)) return;
  std::vector<std::pair<const char*, size_t>> spans;
  for (size_t i = 0; i < c.ctx.in.size(); ++i) {
    if (!c.ctx.in[i] || (c.req.kind == OpKind::AllToAll && static_cast<int>(i) == rank_)) continue;
    size_t n = static_cast<size_t>(c.req.kind == OpKind::AllToAll ? c.sendBytes[i] : c.req.bytes);
    if (n > 0 && findSharedRegion(c.ctx.in[i], n).fd < 0) spans.emplace_back(c.ctx.in[i], n);
  }
  auto t0 = std::chrono::steady_clock::now();
  uint64_t promoted = hugePages_.notePeerReadable(std::move(spans));
  if (promoted > 0 && config_.debug >= 1)
    std::fprintf(stderr, "[hoccl rank %d] %s #%u: %.1f MiB of a reused buffer moved onto huge pages in %.1f ms\n",
                 rank_, c.opName, c.ctx.desc.opSeq, promoted / 1048576.0,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

void ProcessGroupHOCCL::runCollective(Collective& c) {
  auto start = std::chrono::steady_clock::now();
  c.deadline = start + timeout_;
  c.req.rank = rank_;
  c.req.world = size_;
  c.req.slotBytes = static_cast<int64_t>(group_->slotBytes());
  c.req.oneShotMaxBytes = config_.oneShotMaxBytes;
  c.req.crossMemory = group_->crossMemory();
  c.req.crossMemoryMinBytes = config_.crossMemoryMinBytes;
  c.req.allReduceDirectReadMaxBytes = config_.allReduceDirectReadMaxBytes;
  c.ctx.desc.opSeq = ++opSeq_;
  c.ctx.desc.kind = static_cast<int8_t>(c.req.kind);
  c.ctx.desc.dtype = static_cast<int8_t>(c.ctx.dtype);
  c.ctx.desc.redop = static_cast<int8_t>(c.ctx.op);
  c.ctx.desc.root = c.req.root;
  c.ctx.check = [&](int peer) { checkWait(c, peer); };
  if (group_->aborted())
    throw std::runtime_error(std::string("hoccl ") + c.opName + " on rank " + std::to_string(rank_) +
                             ": the group was aborted earlier: " + group_->abortMessage());

  promoteReusedBuffers(c);

  std::shared_ptr<const Plan> plan;
  if (c.req.kind == OpKind::AllToAll) {
    // First barrier: exchange split sizes (the tiny allgather) and check them.
    uint32_t parity = executor_->nextBarrier() & 1;
    std::copy(c.sendBytes.begin(), c.sendBytes.end(), group_->splits(rank_, parity));
    std::copy(c.recvBytes.begin(), c.recvBytes.end(), group_->splits(rank_, parity) + size_);
    c.ctx.validate = [&](uint32_t p) {
      validateDescriptors(c, p);
      validateSplits(c, p);
    };
    PlanRequest exchange = c.req;
    exchange.kind = OpKind::Barrier;
    executor_->run(buildPlan(exchange), c.ctx);
    std::vector<int64_t> matrix(static_cast<size_t>(size_) * size_);
    for (int s = 0; s < size_; ++s)
      for (int d = 0; d < size_; ++d) matrix[s * size_ + d] = group_->splits(s, parity)[d];
    c.req.phases = scheduleAllToAll(matrix);
    {
      std::lock_guard<std::mutex> lock(lastAlgoMutex_);
      lastAllToAllPhases_ = c.req.phases;
    }
    // Plan choices must agree on every rank: size them by the whole exchange, not by my part.
    int64_t total = 0;
    for (int64_t v : matrix) total += v;
    c.req.bytes = total / size_;
    c.ctx.validate = nullptr;
    Plan phased = buildPlan(c.req);
    std::string algo = config_.alltoall == AllToAllAlgo::Pairwise ? "pairwise"
                       : (config_.alltoall == AllToAllAlgo::VarioPath && hasChannels_) ? "varipath"
                                                                                             : "direct";
    phased.algo = "alltoall/" + algo;
    plan = std::make_shared<const Plan>(std::move(phased));
  } else if (allReduceChoosesAfterPublishing(c.req)) {
    // Past the direct-read limit, staging beats cross-memory reads but not mapped reads of
    // shared tensors. One barrier publishes every rank's address and region (and checks the
    // descriptors); every rank then reads the same table and picks the same plan. For ordinary
    // tensors this costs one barrier on an op of tens of milliseconds.
    uint32_t parity = executor_->nextBarrier() & 1;
    c.ctx.validate = [&](uint32_t p) { validateDescriptors(c, p); };
    PlanRequest publish = c.req;
    publish.kind = OpKind::Barrier;
    executor_->run(buildPlan(publish), c.ctx);
    c.ctx.validate = nullptr;
    c.req.addressesPublished = true;
    c.req.everyTensorShared = everyRankShared(parity, c.req.bytes);
    plan = planFor(c.req);
  } else {
    c.ctx.validate = [&](uint32_t p) { validateDescriptors(c, p); };
    plan = planFor(c.req);
  }
  {
    std::lock_guard<std::mutex> lock(lastAlgoMutex_);
    lastAlgo_ = plan->algo;
  }
  if (config_.debug >= 2) std::fprintf(stderr, "[hoccl rank %d] %s", rank_, plan->describe().c_str());
  const uint64_t mappedBefore = config_.debug >= 1 ? PeerMappings::bytesRead() : 0;
  executor_->run(*plan, c.ctx);
  executor_->endOp();
  if (config_.debug >= 1) {
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    // mapped = bytes read from peers' shared tensors (hoccl_backend.empty) through mappings
    // (process-wide counter: approximate while other groups run ops on other threads).
    std::fprintf(stderr, "[hoccl rank %d] %s #%u algo=%s transport=%s bytes=%lld mapped=%llu time=%.1f us\n",
                 rank_, c.opName, c.ctx.desc.opSeq, plan->algo.c_str(),
                 plan->readsPeers() ? "shm+cma" : "shm",
                 static_cast<long long>(c.req.bytes),
                 static_cast<unsigned long long>(PeerMappings::bytesRead() - mappedBefore), us);
  }
}

// ---------------------------------------------------------------- argument checks

namespace {

void checkTensor(const at::Tensor& t, const char* op, int rank) {
  TORCH_CHECK(t.defined(), "hoccl ", op, " on rank ", rank, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "hoccl ", op, " on rank ", rank, ": tensor is on ", t.device(),
              "; hoccl moves CPU and CUDA tensors only");
  TORCH_CHECK(!t.is_sparse(), "hoccl ", op, " on rank ", rank, ": sparse tensors are not supported");
}

// Peers read this rank's inputs while it writes its outputs (and copy engines run them at
// once), so an input that shares memory with an output would be overwritten before every peer
// has read it (gloo corrupts such an in-place all_to_all silently). Such an input is copied
// first, on the caller's stream for CUDA tensors.
at::Tensor readableWhileWriting(const at::Tensor& input, const std::vector<at::Tensor>& outputs) {
  for (const auto& out : outputs)
    if (input.defined() && out.defined() && input.numel() > 0 && out.numel() > 0 &&
        at::get_overlap_status(input, out) != at::MemOverlapStatus::No)
      return input.clone(at::MemoryFormat::Contiguous);
  return input;
}

void checkSameAs(const at::Tensor& t, const at::Tensor& ref, const char* op, int rank, const char* what) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "hoccl ", op, " on rank ", rank, ": ", what,
              " has dtype ", t.scalar_type(), " but the input has ", ref.scalar_type());
  TORCH_CHECK(t.numel() == ref.numel(), "hoccl ", op, " on rank ", rank, ": ", what, " has ", t.numel(),
              " elements but the input has ", ref.numel());
}

// Complex tensors reduce as their real view (sums only: the other ops are not elementwise).
at::Tensor reducible(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t) : t; }

void checkReduceArgs(const at::Tensor& t, RedOp op, const char* opName, int rank) {
  if (t.is_complex())
    TORCH_CHECK(op == RedOp::Sum || op == RedOp::Avg || op == RedOp::PremulSum, "hoccl ", opName, " on rank ",
                rank, ": ", redOpName(op), " is not defined for complex tensors");
  std::string why = checkReducible(reducible(t).scalar_type(), op);
  TORCH_CHECK(why.empty(), "hoccl ", opName, " on rank ", rank, ": ", why);
}

void checkRoot(int root, int size, const char* op, int rank) {
  TORCH_CHECK(root >= 0 && root < size, "hoccl ", op, " on rank ", rank, ": root ", root,
              " is outside the group of ", size, " ranks");
}

}  // namespace

// ---------------------------------------------------------------- collectives


void ProcessGroupHOCCL::allreduceTensor(const at::Tensor& t, RedOp op, double factor) {
  const at::Tensor tensor = reducible(t);
  Collective c{"all_reduce"};
  c.req.kind = OpKind::AllReduce;
  c.req.elemSize = tensor.element_size();
  c.req.bytes = nbytes(tensor);
  c.ctx.in = {ptr(tensor)};
  c.ctx.out = {ptr(tensor)};
  c.ctx.dtype = tensor.scalar_type();
  c.ctx.op = op;
  c.ctx.factor = factor;
  c.ctx.desc.numel = tensor.numel();
  runCollective(c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl all_reduce on rank ", rank_, ": expects one tensor, got ", tensors.size());
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "all_reduce");
  if (tensors[0].is_sparse()) return allreduceSparse(tensors, op);
  if (auto w = tryCuda("all_reduce", c10d::OpType::ALLREDUCE, tensors, tensors,
                       [&](const std::vector<at::Tensor>&, const std::vector<at::Tensor>& ho) {
                         std::vector<at::Tensor> v{ho[0]};
                         allreduce(v, opts);
                       },
                       tensors[0].is_complex() ? nullptr : ceAllReduce(tensors[0], op, factor)))
    return *w;
  checkTensor(tensors[0], "all_reduce", rank_);
  checkReduceArgs(tensors[0], op, "all_reduce", rank_);
  Staged s(tensors[0]);
  return enqueue(c10d::OpType::ALLREDUCE, tensors, [this, s, op, factor] {
    allreduceTensor(s.work, op, factor);
    s.writeBack();
  }, nbytes(tensors[0]));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allreduceSparse(std::vector<at::Tensor>& tensors, RedOp op) {
  const at::Tensor& t = tensors[0];
  TORCH_CHECK(t.layout() == at::kSparse, "hoccl all_reduce on rank ", rank_, ": ", t.layout(),
              " tensors are not supported (sparse COO is)");
  TORCH_CHECK(t.device().is_cpu(), "hoccl all_reduce on rank ", rank_,
              ": sparse tensors must be on the CPU (got ", t.device(), ")");
  TORCH_CHECK(op == RedOp::Sum || (op == RedOp::Avg && (t.is_floating_point() || t.is_complex())),
              "hoccl all_reduce on rank ", rank_, ": sparse tensors support SUM (and AVG for floating dtypes), not ",
              redOpName(op), " on ", t.scalar_type());
  return enqueue(c10d::OpType::ALLREDUCE, tensors, [this, t, op] { runSparseAllreduce(t, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (anyCuda(tensors)) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : tensors) {
      std::vector<at::Tensor> v{t};
      works.push_back(allreduce(v, opts));
    }
    return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
  }
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "allreduce_coalesced");
  std::vector<Staged> staged;
  for (auto& t : tensors) {
    checkTensor(t, "allreduce_coalesced", rank_);
    checkReduceArgs(t, op, "allreduce_coalesced", rank_);
    staged.emplace_back(t);
  }
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, staged, op, factor] {
    for (const auto& s : staged) {
      allreduceTensor(s.work, op, factor);
      s.writeBack();
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl broadcast on rank ", rank_, ": expects one tensor");
  checkRoot(static_cast<int>(opts.rootRank), size_, "broadcast", rank_);
  if (auto w = tryCuda("broadcast", c10d::OpType::BROADCAST, tensors, tensors,
                       [&](const std::vector<at::Tensor>&, const std::vector<at::Tensor>& ho) {
                         std::vector<at::Tensor> v{ho[0]};
                         broadcast(v, opts);
                       },
                       ceBroadcast(tensors[0], static_cast<int>(opts.rootRank))))
    return *w;
  checkTensor(tensors[0], "broadcast", rank_);
  Staged s(tensors[0]);
  int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::BROADCAST, tensors, [this, s, root] {
    Collective c{"broadcast"};
    c.req.kind = OpKind::Broadcast;
    c.req.root = root;
    c.req.elemSize = s.work.element_size();
    c.req.bytes = nbytes(s.work);
    c.ctx.in = c.ctx.out = {ptr(s.work)};
    c.ctx.dtype = s.work.scalar_type();
    c.ctx.desc.numel = s.work.numel();
    runCollective(c);
    s.writeBack();
  }, nbytes(tensors[0]));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "hoccl reduce on rank ", rank_, ": expects one tensor");
  if (auto w = tryCuda("reduce", c10d::OpType::REDUCE, tensors, tensors,
                       [&](const std::vector<at::Tensor>&, const std::vector<at::Tensor>& ho) {
                         std::vector<at::Tensor> v{ho[0]};
                         reduce(v, opts);
                       }))
    return *w;
  checkTensor(tensors[0], "reduce", rank_);
  checkRoot(static_cast<int>(opts.rootRank), size_, "reduce", rank_);
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce");
  checkReduceArgs(tensors[0], op, "reduce", rank_);
  Staged s(tensors[0]);
  int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::REDUCE, tensors, [this, s, root, op, factor] {
    const at::Tensor t = reducible(s.work);
    Collective c{"reduce"};
    c.req.kind = OpKind::Reduce;
    c.req.root = root;
    c.req.elemSize = t.element_size();
    c.req.bytes = nbytes(t);
    c.ctx.in = c.ctx.out = {ptr(t)};
    c.ctx.dtype = t.scalar_type();
    c.ctx.op = op;
    c.ctx.factor = factor;
    c.ctx.desc.numel = t.numel();
    runCollective(c);
    s.writeBack();
  }, nbytes(tensors[0]));
}

// Gathers `input` from every rank into out[r] (kind AllGather: everyone; Gather: root only).
void ProcessGroupHOCCL::allgatherBlocks(const at::Tensor& input, const std::vector<at::Tensor>& outputs,
                                        OpKind kind, int root) {
  Collective c{kind == OpKind::Gather ? "gather" : "all_gather"};
  c.req.kind = kind;
  c.req.root = root;
  c.req.elemSize = input.element_size();
  c.req.bytes = nbytes(input);
  c.ctx.in = {ptr(input)};
  c.ctx.out.assign(size_, nullptr);
  for (size_t r = 0; r < outputs.size(); ++r) c.ctx.out[r] = ptr(outputs[r]);
  c.ctx.dtype = input.scalar_type();
  c.ctx.desc.numel = input.numel();
  runCollective(c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions&) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "hoccl all_gather on rank ", rank_,
              ": expects one input and one output list");
  if (auto w = tryCuda("all_gather", c10d::OpType::ALLGATHER, inputs, outputs[0],
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         std::vector<std::vector<at::Tensor>> o{ho};
                         std::vector<at::Tensor> i{hi[0]};
                         allgather(o, i, c10d::AllgatherOptions());
                       }))
    return *w;
  checkTensor(inputs[0], "all_gather", rank_);
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "hoccl all_gather on rank ", rank_,
              ": output list has ", outputs[0].size(), " tensors but the group has ", size_, " ranks");
  std::vector<Staged> outs;
  for (auto& t : outputs[0]) {
    checkTensor(t, "all_gather", rank_);
    checkSameAs(t, inputs[0], "all_gather", rank_, "an output tensor");
    outs.emplace_back(t);
  }
  at::Tensor in = inputs[0].contiguous();
  return enqueue(c10d::OpType::ALLGATHER, outputs[0], [this, in, outs] {
    std::vector<at::Tensor> o;
    for (auto& s : outs) o.push_back(s.work);
    allgatherBlocks(in, o, OpKind::AllGather, 0);
    for (auto& s : outs) s.writeBack();
  }, nbytes(inputs[0]) * size_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  if (auto w = tryCuda("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, {input}, {output},
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         at::Tensor o = ho[0], i = hi[0];
                         _allgather_base(o, i, opts);
                       },
                       output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type()
                           ? ceAllGather(output, input) : nullptr))
    return *w;
  checkTensor(input, "all_gather_into_tensor", rank_);
  checkTensor(output, "all_gather_into_tensor", rank_);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hoccl all_gather_into_tensor on rank ", rank_,
              ": output dtype ", output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * size_, "hoccl all_gather_into_tensor on rank ", rank_,
              ": output has ", output.numel(), " elements but must have world_size x input = ",
              input.numel() * size_);
  Staged out(output);
  at::Tensor in = input.contiguous();
  return enqueue(c10d::OpType::_ALLGATHER_BASE, {output}, [this, in, out] {
    auto flat = out.work.view({-1});
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < size_; ++r) blocks.push_back(flat.narrow(0, r * in.numel(), in.numel()));
    allgatherBlocks(in, blocks, OpKind::AllGather, 0);
    out.writeBack();
  }, nbytes(output));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hoccl allgather_into_tensor_coalesced on rank ", rank_,
              ": ", outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputLists[r][i] receives rank r's inputs[i].
  TORCH_CHECK(static_cast<int>(outputLists.size()) == size_, "hoccl allgather_coalesced on rank ", rank_,
              ": ", outputLists.size(), " output lists for a group of ", size_, " ranks");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> o(1);
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(outputLists[r].size() == inputs.size(), "hoccl allgather_coalesced on rank ", rank_,
                  ": output list ", r, " has ", outputLists[r].size(), " tensors for ", inputs.size(), " inputs");
      o[0].push_back(outputLists[r][i]);
      all.push_back(outputLists[r][i]);
    }
    std::vector<at::Tensor> in{inputs[i]};
    works.push_back(allgather(o, in, opts));
  }
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  checkRoot(root, size_, "gather", rank_);
  TORCH_CHECK(inputs.size() == 1, "hoccl gather on rank ", rank_, ": expects one input tensor");
  if (auto w = tryCuda("gather", c10d::OpType::GATHER, inputs, outputs.empty() ? std::vector<at::Tensor>{} : outputs[0],
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         std::vector<std::vector<at::Tensor>> o;
                         if (!outputs.empty()) o.push_back(ho);
                         std::vector<at::Tensor> i{hi[0]};
                         gather(o, i, opts);
                       }))
    return *w;
  checkTensor(inputs[0], "gather", rank_);
  std::vector<Staged> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "hoccl gather on rank ",
                rank_, ": the root needs a list of ", size_, " output tensors");
    for (auto& t : outputs[0]) {
      checkTensor(t, "gather", rank_);
      checkSameAs(t, inputs[0], "gather", rank_, "an output tensor");
      outs.emplace_back(t);
    }
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "hoccl gather on rank ", rank_,
                ": only the root (rank ", root, ") may pass output tensors");
  }
  at::Tensor in = inputs[0].contiguous();
  std::vector<at::Tensor> result = outputs.empty() ? std::vector<at::Tensor>{} : outputs[0];
  return enqueue(c10d::OpType::GATHER, result, [this, in, outs, root] {
    std::vector<at::Tensor> o;
    for (auto& s : outs) o.push_back(s.work);
    allgatherBlocks(in, o, OpKind::Gather, root);
    for (auto& s : outs) s.writeBack();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  checkRoot(root, size_, "scatter", rank_);
  TORCH_CHECK(outputs.size() == 1, "hoccl scatter on rank ", rank_, ": expects one output tensor");
  if (auto w = tryCuda("scatter", c10d::OpType::SCATTER, inputs.empty() ? std::vector<at::Tensor>{} : inputs[0], outputs,
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         std::vector<std::vector<at::Tensor>> i;
                         if (!inputs.empty()) i.push_back(hi);
                         std::vector<at::Tensor> o{ho[0]};
                         scatter(o, i, opts);
                       }))
    return *w;
  checkTensor(outputs[0], "scatter", rank_);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "hoccl scatter on rank ",
                rank_, ": the root needs a list of ", size_, " input tensors");
    for (auto& t : inputs[0]) {
      checkTensor(t, "scatter", rank_);
      checkSameAs(t, outputs[0], "scatter", rank_, "an input tensor");
      ins.push_back(t.contiguous());
    }
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "hoccl scatter on rank ", rank_,
                ": only the root (rank ", root, ") may pass input tensors");
  }
  Staged out(outputs[0]);
  return enqueue(c10d::OpType::SCATTER, outputs, [this, ins, out, root] {
    Collective c{"scatter"};
    c.req.kind = OpKind::Scatter;
    c.req.root = root;
    c.req.elemSize = out.work.element_size();
    c.req.bytes = nbytes(out.work);
    c.ctx.in.assign(size_, nullptr);
    for (size_t r = 0; r < ins.size(); ++r) c.ctx.in[r] = ptr(ins[r]);
    c.ctx.out = {ptr(out.work)};
    c.ctx.dtype = out.work.scalar_type();
    c.ctx.desc.numel = out.work.numel();
    runCollective(c);
    out.writeBack();
  });
}

void ProcessGroupHOCCL::reduceScatterBlocks(const std::vector<at::Tensor>& inputs, const at::Tensor& out,
                                            RedOp op, double factor) {
  const at::Tensor output = reducible(out);
  Collective c{"reduce_scatter"};
  c.req.kind = OpKind::ReduceScatter;
  c.req.elemSize = output.element_size();
  c.req.bytes = nbytes(output);
  for (auto& t : inputs) c.ctx.in.push_back(ptr(t));
  c.ctx.out = {ptr(output)};
  c.ctx.dtype = output.scalar_type();
  c.ctx.op = op;
  c.ctx.factor = factor;
  c.ctx.desc.numel = output.numel();
  runCollective(c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "hoccl reduce_scatter on rank ", rank_,
              ": expects one output and one input list");
  if (auto w = tryCuda("reduce_scatter", c10d::OpType::REDUCE_SCATTER, inputs[0], outputs,
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         std::vector<std::vector<at::Tensor>> i{hi};
                         std::vector<at::Tensor> o{ho[0]};
                         reduce_scatter(o, i, opts);
                       }))
    return *w;
  checkTensor(outputs[0], "reduce_scatter", rank_);
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == size_, "hoccl reduce_scatter on rank ", rank_,
              ": input list has ", inputs[0].size(), " tensors but the group has ", size_, " ranks");
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce_scatter");
  checkReduceArgs(outputs[0], op, "reduce_scatter", rank_);
  std::vector<at::Tensor> ins;
  for (auto& t : inputs[0]) {
    checkTensor(t, "reduce_scatter", rank_);
    checkSameAs(t, outputs[0], "reduce_scatter", rank_, "an input tensor");
    ins.push_back(t.contiguous());
  }
  Staged out(outputs[0]);
  return enqueue(c10d::OpType::REDUCE_SCATTER, outputs, [this, ins, out, op, factor] {
    reduceScatterBlocks(ins, out.work, op, factor);
    out.writeBack();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  if (auto w = tryCuda("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, {input}, {output},
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         at::Tensor o = ho[0], i = hi[0];
                         _reduce_scatter_base(o, i, opts);
                       }))
    return *w;
  checkTensor(input, "reduce_scatter_tensor", rank_);
  checkTensor(output, "reduce_scatter_tensor", rank_);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "hoccl reduce_scatter_tensor on rank ", rank_,
              ": output dtype ", output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(input.numel() == output.numel() * size_, "hoccl reduce_scatter_tensor on rank ", rank_,
              ": input has ", input.numel(), " elements but must have world_size x output = ",
              output.numel() * size_);
  double factor;
  RedOp op = toRedOp(opts.reduceOp, &factor, "reduce_scatter_tensor");
  checkReduceArgs(output, op, "reduce_scatter_tensor", rank_);
  at::Tensor in = input.contiguous().view({-1});
  Staged out(output);
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [this, in, out, op, factor] {
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < size_; ++r) blocks.push_back(in.narrow(0, r * out.work.numel(), out.work.numel()));
    reduceScatterBlocks(blocks, out.work, op, factor);
    out.writeBack();
  }, nbytes(input));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "hoccl reduce_scatter_tensor_coalesced on rank ", rank_, ": ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<WorkGroupHOCCL>(rank_, std::move(works));
}

// Moves inputs[d] to rank d's outputs[me]; every rank's sizes are cross-checked first.
void ProcessGroupHOCCL::alltoallBlocks(const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& outputs, const char* opName) {
  Collective c{opName};
  c.req.kind = OpKind::AllToAll;
  c.req.elemSize = 1;
  for (int r = 0; r < size_; ++r) {
    c.ctx.in.push_back(ptr(inputs[r]));
    c.ctx.out.push_back(ptr(outputs[r]));
    c.sendBytes.push_back(nbytes(inputs[r]));
    c.recvBytes.push_back(nbytes(outputs[r]));
    c.req.bytes += nbytes(inputs[r]);
  }
  c.ctx.dtype = inputs.empty() ? c10::ScalarType::Byte : inputs[0].scalar_type();
  runCollective(c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::alltoall_base(at::Tensor& output, at::Tensor& userInput,
                                                                std::vector<int64_t>& outputSplits,
                                                                std::vector<int64_t>& inputSplits,
                                                                const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  at::Tensor input = readableWhileWriting(userInput, {output});
  bool even = outputSplits.empty() && inputSplits.empty() && input.numel() == output.numel() &&
              input.numel() % size_ == 0 && input.scalar_type() == output.scalar_type();
  if (auto w = tryCuda(op, c10d::OpType::ALLTOALL_BASE, {input}, {output},
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         at::Tensor o = ho[0], i = hi[0];
                         alltoall_base(o, i, outputSplits, inputSplits, opts);
                       },
                       even ? ceAllToAll(output, input) : nullptr))
    return *w;
  checkTensor(input, op, rank_);
  checkTensor(output, op, rank_);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "hoccl ", op, " on rank ", rank_,
              ": input dtype ", input.scalar_type(), " differs from output dtype ", output.scalar_type());
  auto splitsFor = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      TORCH_CHECK(rows % size_ == 0, "hoccl ", op, " on rank ", rank_, ": ", what, " has ", rows,
                  " rows, not divisible by the world size ", size_, " (pass split sizes)");
      s.assign(size_, rows / size_);
    }
    TORCH_CHECK(static_cast<int>(s.size()) == size_, "hoccl ", op, " on rank ", rank_, ": ", s.size(), " ",
                what, " split sizes for ", size_, " ranks");
    int64_t sum = 0;
    for (auto v : s) {
      TORCH_CHECK(v >= 0, "hoccl ", op, " on rank ", rank_, ": negative ", what, " split size ", v);
      sum += v;
    }
    TORCH_CHECK(sum == rows, "hoccl ", op, " on rank ", rank_, ": ", what, " split sizes sum to ", sum,
                " but the ", what, " has ", rows, " rows");
    return s;
  };
  auto inSplits = splitsFor(input, inputSplits, "input");
  auto outSplits = splitsFor(output, outputSplits, "output");
  at::Tensor in = input.contiguous();
  Staged out(output);
  return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, [this, in, out, inSplits, outSplits, op] {
    auto blocks = [&](const at::Tensor& t, const std::vector<int64_t>& s) {
      std::vector<at::Tensor> b;
      auto flat = t.dim() == 0 ? t.view({1}) : t;
      int64_t off = 0;
      for (auto n : s) {
        b.push_back(flat.narrow(0, off, n));
        off += n;
      }
      return b;
    };
    alltoallBlocks(blocks(in, inSplits), blocks(out.work, outSplits), op);
    out.writeBack();
  }, nbytes(input));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& userInputs,
                                                           const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  std::vector<at::Tensor> inputs;
  for (const auto& t : userInputs) inputs.push_back(readableWhileWriting(t, outputs));
  if (auto w = tryCuda(op, c10d::OpType::ALLTOALL, inputs, outputs,
                       [&](const std::vector<at::Tensor>& hi, const std::vector<at::Tensor>& ho) {
                         std::vector<at::Tensor> i = hi, o = ho;
                         alltoall(o, i, opts);
                       }))
    return *w;
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
              "hoccl ", op, " on rank ", rank_, ": needs ", size_, " input and output tensors, got ",
              inputs.size(), " and ", outputs.size());
  std::vector<at::Tensor> ins;
  std::vector<Staged> outs;
  for (int r = 0; r < size_; ++r) {
    checkTensor(inputs[r], op, rank_);
    checkTensor(outputs[r], op, rank_);
    TORCH_CHECK(inputs[r].scalar_type() == outputs[r].scalar_type(), "hoccl ", op, " on rank ", rank_,
                ": input ", r, " has dtype ", inputs[r].scalar_type(), " but output ", r, " has ",
                outputs[r].scalar_type());
    ins.push_back(inputs[r].contiguous());
    outs.emplace_back(outputs[r]);
  }
  return enqueue(c10d::OpType::ALLTOALL, outputs, [this, ins, outs, op] {
    std::vector<at::Tensor> o;
    for (auto& s : outs) o.push_back(s.work);
    alltoallBlocks(ins, o, op);
    for (auto& s : outs) s.writeBack();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::barrier(const c10d::BarrierOptions&) {
  return enqueue(c10d::OpType::BARRIER, {}, [this] {
    Collective c{"barrier"};
    c.req.kind = OpKind::Barrier;
    runCollective(c);
  }, 0);
}

// ---------------------------------------------------------------- send / recv

void ProcessGroupHOCCL::ensureP2P() {
  std::lock_guard<std::mutex> lock(p2pMutex_);
  if (!p2p_) p2p_ = std::make_unique<P2PEngine>(*group_, timeout_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::postP2P(std::vector<at::Tensor>& tensors, int peer, int tag,
                                                          bool send) {
  const char* op = send ? "send" : "recv";
  TORCH_CHECK(tensors.size() == 1, "hoccl ", op, " on rank ", rank_, ": expects one tensor");
  TORCH_CHECK(peer == -1 || (peer >= 0 && peer < size_ && peer != rank_), "hoccl ", op, " on rank ", rank_,
              ": invalid peer rank ", peer, " (group of ", size_, ")");
  const at::Tensor& user = tensors[0];
  const bool cuda = user.defined() && user.is_cuda();
  if (!cuda) checkTensor(user, op, rank_);
  ensureP2P();
  auto work = c10::make_intrusive<WorkHOCCL>(rank_, send ? c10d::OpType::SEND : c10d::OpType::RECV, tensors);
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
  // CUDA tensors travel through a pinned host mirror: D2H before a send (ordered after the
  // caller's stream), H2D on the comm stream after a recv.
  at::Tensor host = cuda ? cudaHostMirror(user, send) : at::Tensor();
  auto staged = std::make_shared<Staged>(cuda ? host : user);
  std::optional<c10::Stream> comm;
  if (cuda) {
    comm = commStream(user.device());
    work->setCommStream(*comm);
  }
  auto done = [work, staged, cuda, user, comm, send](std::exception_ptr e, int src) {
    if (!e) {
      try {
        staged->writeBack();
        if (cuda && !send) finishCudaRecv(user, staged->user, *comm, *work);
      } catch (...) {
        e = std::current_exception();
      }
    }
    work->complete(e, src);
  };
  if (send) p2p_->postSend(peer, tag, ptr(staged->work), nbytes(staged->work), done);
  else p2p_->postRecv(peer, tag, ptr(staged->work), nbytes(staged->work), done);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return postP2P(tensors, dst, tag, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return postP2P(tensors, src, tag, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return postP2P(tensors, -1, tag, false);
}

}  // namespace hoccl
