#include "backend/collective.h"
#include "backend/tensor_args.h"
#include "varipath/scheduler.h"

namespace hoccl {

// Null on the flat topology: with no links to tell pairs apart there is nothing to schedule, and
// one phase holding every pair is the plan (all_to_all is still named "varipath").
void ProcessGroupHOCCL::setAllToAllScheduler(std::shared_ptr<const varipath::Scheduler> scheduler) {
  hasChannels_ = true;
  scheduler_ = std::move(scheduler);
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

}  // namespace hoccl
