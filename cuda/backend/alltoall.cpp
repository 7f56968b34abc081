#include "backend/collective.h"
#include "backend/multihost/host_span.h"
#include "backend/tensor_args.h"
#include "varipath/scheduler.h"

namespace hoccl {

using Tensors = std::vector<at::Tensor>;

namespace {

// Pointers and byte sizes of consecutive row blocks of a contiguous tensor (a 0-d tensor is one row).
void rowBlocks(const at::Tensor& t, const std::vector<int64_t>& splits, std::vector<char*>& ptrs,
               std::vector<int64_t>& bytes) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t rowBytes = rows > 0 ? nbytes(t) / rows : 0;
  char* base = rows > 0 ? ptr(t) : nullptr;
  int64_t offset = 0;
  for (int64_t n : splits) {
    ptrs.push_back(base ? base + offset : nullptr);
    bytes.push_back(n * rowBytes);
    offset += n * rowBytes;
  }
}

}  // namespace

// Null on the flat topology: with no links to tell pairs apart there is nothing to schedule, and
// one phase holding every pair is the plan (all_to_all is still named "varipath").
void ProcessGroupHOCCL::setAllToAllScheduler(std::shared_ptr<const varipath::Scheduler> scheduler) {
  hasChannels_ = true;
  scheduler_ = std::move(scheduler);
}

std::vector<TransferPhase> ProcessGroupHOCCL::scheduleAllToAll(const std::vector<int64_t>& m) {
  const int W = localSize_;
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

// VarioPath's phases for a split matrix (allToAllPlan caches them with the plan).
std::vector<TransferPhase> ProcessGroupHOCCL::varipathPhases(const std::vector<int64_t>& m) {
  std::vector<TransferPhase> phases;
  for (const auto& ph : scheduler_->plan(m)) {
    TransferPhase p;
    for (const auto& t : ph) p.push_back({t.src, t.dst, t.bytes});
    phases.push_back(std::move(p));
  }
  return phases;
}

std::pair<uint64_t, uint64_t> ProcessGroupHOCCL::allToAllPlanCounts() const {
  std::lock_guard<std::mutex> lock(scheduleMutex_);
  return {schedulesPlanned_, schedulesReused_};
}

// The plan for a split matrix, from the cache of recent matrices when it holds it (moved to the
// front), else scheduled, built and cached (the least recently used entry goes). `published`:
// an earlier barrier of this op already published every rank's buffer addresses.
std::shared_ptr<const Plan> ProcessGroupHOCCL::allToAllPlan(Collective& c, const std::vector<int64_t>& matrix,
                                                            bool published) {
  int64_t total = 0;
  for (int64_t v : matrix) total += v;
  // Plan choices must agree on every rank: size them by the whole exchange, not by my part.
  c.req.bytes = total / localSize_;
  c.req.slotBytes = stagingRoundBytes(c.req.kind, c.req.bytes);
  c.req.addressesPublished = published;
  const size_t keep = static_cast<size_t>(config_.alltoallPlanCache);
  CachedSchedule entry;
  bool hit = false;
  {
    std::lock_guard<std::mutex> lock(scheduleMutex_);
    for (auto it = scheduleCache_.begin(); it != scheduleCache_.end(); ++it) {
      if (it->matrix != matrix) continue;
      entry = std::move(*it);
      scheduleCache_.erase(it);
      hit = true;
      ++schedulesReused_;
      break;
    }
    if (!hit) ++schedulesPlanned_;
  }
  if (!hit) {
    entry.matrix = matrix;
    entry.phases = std::make_shared<const std::vector<TransferPhase>>(scheduleAllToAll(matrix));
  }
  std::shared_ptr<const Plan>& plan = entry.plans[published];
  if (!plan) {
    c.req.phases = *entry.phases;
    Plan phased = buildPlan(c.req);
    c.req.phases.clear();
    std::string algo = config_.alltoall == AllToAllAlgo::Pairwise ? "pairwise"
                       : (config_.alltoall == AllToAllAlgo::VarioPath && hasChannels_) ? "varipath"
                                                                                             : "direct";
    phased.algo = "alltoall/" + algo;
    plan = std::make_shared<const Plan>(std::move(phased));
  }
  std::shared_ptr<const Plan> result = plan;
  {
    std::lock_guard<std::mutex> lock(lastAlgoMutex_);
    lastAllToAllPhases_ = entry.phases;
  }
  if (keep > 0) {
    std::lock_guard<std::mutex> lock(scheduleMutex_);
    scheduleCache_.push_front(std::move(entry));
    if (scheduleCache_.size() > keep) scheduleCache_.pop_back();
  }
  return result;
}

bool ProcessGroupHOCCL::everySplitIs(uint32_t parity, int64_t bytes) const {
  for (int r = 0; r < localSize_; ++r) {
    const int64_t* s = group_->splits(r, parity);
    for (int k = 0; k < 2 * localSize_; ++k)
      if (s[k] != bytes) return false;
  }
  return true;
}

namespace {
// The first barrier of an even all_to_all found a rank whose splits are not even.
struct PeersNotEven {};

// The size of every send and receive block when they are all the same, else -1.
int64_t evenBlockBytes(const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  const int64_t b = send.empty() ? 0 : send[0];
  for (int64_t v : send)
    if (v != b) return -1;
  for (int64_t v : recv)
    if (v != b) return -1;
  return b;
}
}  // namespace

// Every all_to_all publishes its split sizes with its first barrier. A rank whose own blocks are
// all the same size (all_to_all_single without split lists, the usual case) assumes every rank's
// are and runs its data plan at once, so that first barrier doubles as the split exchange: one
// barrier less per call. If the table then shows another rank's splits are uneven, it goes on
// with the plan of the real matrix, exactly as the uneven ranks do after their exchange barrier.
void ProcessGroupHOCCL::runAllToAll(Collective& c) {
  uint32_t parity = executor_->nextBarrier() & 1;
  group_->publishSplits(parity, c.sendBytes, c.recvBytes);
  const int64_t block = evenBlockBytes(c.sendBytes, c.recvBytes);
  const size_t cells = static_cast<size_t>(localSize_) * localSize_;
  if (block >= 0) {
    c.ctx.validate = [&](uint32_t p) {
      validateDescriptors(c, p);
      validateSplits(c, p);
      if (!everySplitIs(p, block)) throw PeersNotEven{};
    };
    try {
      runPlan(c, allToAllPlan(c, std::vector<int64_t>(cells, block), false));
      return;
    } catch (const PeersNotEven&) {
    }
  } else {
    c.ctx.validate = [&](uint32_t p) {
      validateDescriptors(c, p);
      validateSplits(c, p);
    };
    PlanRequest exchange = c.req;
    exchange.kind = OpKind::Barrier;
    executor_->run(buildPlan(exchange), c.ctx);
  }
  c.ctx.validate = nullptr;
  std::vector<int64_t> matrix(cells);
  for (int s = 0; s < localSize_; ++s)
    for (int d = 0; d < localSize_; ++d) matrix[s * localSize_ + d] = group_->splits(s, parity)[d];
  runPlan(c, allToAllPlan(c, matrix, true));
}

void ProcessGroupHOCCL::alltoallBlocks(AllToAllBlocks blocks, c10::ScalarType dtype, const char* opName) {
  if (span_) return span_->alltoallBlocks(blocks, opName);
  Collective c{opName};
  c.req.kind = OpKind::AllToAll;
  c.req.elemSize = 1;
  c.ctx.in = std::move(blocks.in);
  c.ctx.out = std::move(blocks.out);
  c.sendBytes = std::move(blocks.sendBytes);
  c.recvBytes = std::move(blocks.recvBytes);
  // This rank's part, until the agreed size replaces it (allToAllPlan): what decides whether
  // its buffers are promoted onto huge pages before peers read them.
  for (int64_t b : c.sendBytes) c.req.bytes += b;
  c.ctx.dtype = dtype;
  runCollective(c);
}

// One entry per form for every host layout: the checks are the same, routeCuda takes CUDA
// tensors the layout's way, and a group spanning hosts runs the exchange as one plan across hosts
// (HostSpan::alltoallBlocks).
c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::alltoall_base(at::Tensor& output, at::Tensor& userInput,
                                                                std::vector<int64_t>& outputSplits,
                                                                std::vector<int64_t>& inputSplits,
                                                                const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  at::Tensor input = readableWhileWriting(userInput, {output});
  if (span_ || input.is_cuda() || output.is_cuda()) {  // the CUDA routing builds closures: test the device first
    bool even = outputSplits.empty() && inputSplits.empty() && input.numel() == output.numel() &&
                input.numel() % size_ == 0 && input.scalar_type() == output.scalar_type();
    if (auto w = routeCuda(op, c10d::OpType::ALLTOALL_BASE, {input}, {output},
                           [this, outputSplits, inputSplits, opts](const Tensors& hi, const Tensors& ho) {
                             at::Tensor i = hi[0], o = ho[0];
                             std::vector<int64_t> os = outputSplits, is = inputSplits;
                             return alltoall_base(o, i, os, is, opts);
                           },
                           even ? ceAllToAll(output, input) : nullptr))
      return *w;
  }
  checkTensor(input, op, rank_);
  checkTensor(output, op, rank_);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "hoccl ", op, " on rank ", rank_,
              ": input dtype ", input.scalar_type(), " differs from output dtype ", output.scalar_type());
  auto inSplits = rowSplits(input, inputSplits, size_, op, rank_, "input");
  auto outSplits = rowSplits(output, outputSplits, size_, op, rank_, "output");
  at::Tensor in = input.contiguous();
  Staged out(output);
  return submit(c10d::OpType::ALLTOALL_BASE, {output}, [this, in, out, inSplits, outSplits, op] {
    AllToAllBlocks b;
    rowBlocks(in, inSplits, b.in, b.sendBytes);
    rowBlocks(out.work, outSplits, b.out, b.recvBytes);
    alltoallBlocks(std::move(b), in.scalar_type(), op);
    out.writeBack();
  }, nbytes(input), !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHOCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& userInputs,
                                                           const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  std::vector<at::Tensor> inputs;
  for (const auto& t : userInputs) inputs.push_back(readableWhileWriting(t, outputs));
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
              "hoccl ", op, " on rank ", rank_, ": needs ", size_, " input and output tensors, got ",
              inputs.size(), " and ", outputs.size());
  if (auto w = routeCuda(op, c10d::OpType::ALLTOALL, inputs, outputs, [this, opts](const Tensors& hi, const Tensors& ho) {
        Tensors i = hi, o = ho;
        return alltoall(o, i, opts);
      }))
    return *w;
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
  return submit(c10d::OpType::ALLTOALL, outputs, [this, ins, outs, op] {
    AllToAllBlocks b;
    for (int r = 0; r < size_; ++r) {
      b.in.push_back(ptr(ins[r]));
      b.sendBytes.push_back(nbytes(ins[r]));
      b.out.push_back(ptr(outs[r].work));
      b.recvBytes.push_back(nbytes(outs[r].work));
    }
    alltoallBlocks(std::move(b), ins[0].scalar_type(), op);
    for (auto& s : outs) s.writeBack();
  }, INT64_MAX, !opts.asyncOp);
}

}  // namespace hoccl
