// all_to_all across hosts: argument checks, then one plan across hosts. With the split check (the
// default) or a forced rail form, the plan's form is picked by VarioPath's cost model from the
// gathered split matrix (planned.cpp); without the check, the direct form from each rank's own
// splits (ProcessGroupHOCCL::planFromOwnSplits).
#include "backend/multihost/legs.h"
#include "backend/multihost/host_span.h"
#include "backend/tensor_args.h"

namespace hoccl {

using Tensors = std::vector<at::Tensor>;

void checkMultiHostTensor(const at::Tensor& t, const char* op, int rank);

namespace {

// Byte blocks of a contiguous tensor cut along dim 0 by row counts.
std::vector<at::Tensor> byteBlocks(const at::Tensor& t, const std::vector<int64_t>& rows) {
  at::Tensor bytes = legs::bytesOf(t);
  int64_t total = 0;
  for (auto r : rows) total += r;
  const int64_t rowBytes = total ? bytes.numel() / total : 0;
  std::vector<at::Tensor> blocks;
  int64_t off = 0;
  for (auto r : rows) {
    blocks.push_back(bytes.narrow(0, off, r * rowBytes));
    off += r * rowBytes;
  }
  return blocks;
}

}  // namespace

// With the check (or the rail form, which relays by the whole matrix) every rank gathers the split
// matrix first, one message round before the data. Without it the direct form needs only this
// rank's own splits and its host's, traded inside the host: no round across hosts before the data
// (4 KB-1 MB on 2x2: as fast as gloo, where the split exchange costs 1.3-1.5x: docs/multihost.md).
void HostSpan::alltoallBytes(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                                   const char* op) {
  std::vector<int64_t> sendBytes, recvBytes;
  for (int r = 0; r < size_; ++r) {
    sendBytes.push_back(ins[r].numel());
    recvBytes.push_back(outs[r].numel());
  }
  if (checkAcrossHosts_ || alltoallChoice_ == AllToAllHostsForm::Relay)
    return alltoallPlanned(ins, outs, op, sendBytes, recvBytes);
  ProcessGroupHOCCL::HostsOp o{op, OpKind::AllToAll};
  for (int r = 0; r < size_; ++r) {
    o.in.push_back(ptr(ins[r]));
    o.out.push_back(ptr(outs[r]));
  }
  o.sendBytes = std::move(sendBytes);
  o.recvBytes = std::move(recvBytes);
  planned(op, [&](ProcessGroupHOCCL& host, int64_t tag) { host.runAcrossHosts(o, tag); });
  setAlgorithm("multihost_direct");
  std::lock_guard<std::mutex> lock(stateMutex_);
  lastPhases_.clear();
}

c10::intrusive_ptr<c10d::Work> HostSpan::alltoall_base(at::Tensor& output, at::Tensor& userInput,
                                                             std::vector<int64_t>& outputSplits,
                                                             std::vector<int64_t>& inputSplits,
                                                             const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  if (auto w = viaHost(op, c10d::OpType::ALLTOALL_BASE, {userInput}, {output},
                       [this, outputSplits, inputSplits, opts](const Tensors& ins, const Tensors& outs) {
                         at::Tensor i = ins[0], o = outs[0];
                         std::vector<int64_t> os = outputSplits, is = inputSplits;
                         return alltoall_base(o, i, os, is, opts);
                       }))
    return *w;
  checkMultiHostTensor(userInput, op, rank_);
  checkMultiHostTensor(output, op, rank_);
  TORCH_CHECK(userInput.scalar_type() == output.scalar_type(), "hoccl ", op, " on rank ", rank_,
              ": input dtype ", userInput.scalar_type(), " differs from output dtype ", output.scalar_type());
  auto inRows = rowSplits(userInput, inputSplits, size_, op, rank_, "input");
  auto outRows = rowSplits(output, outputSplits, size_, op, rank_, "output");
  at::Tensor in = readableWhileWriting(userInput, {output}).contiguous();
  Staged out(output);
  return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, [this, in, out, inRows, outRows, op] {
    alltoallBytes(byteBlocks(in, inRows), byteBlocks(out.work, outRows), op);
    out.writeBack();
  }, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> HostSpan::alltoall(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& userInputs,
                                                        const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  TORCH_CHECK(static_cast<int>(userInputs.size()) == size_ && static_cast<int>(outputs.size()) == size_, "hoccl ",
              op, " on rank ", rank_, ": needs ", size_, " input and output tensors, got ", userInputs.size(),
              " and ", outputs.size());
  if (auto w = viaHost(op, c10d::OpType::ALLTOALL, userInputs, outputs,
                       [this, opts](const Tensors& ins, const Tensors& outs) {
                         Tensors i = ins, o = outs;
                         return alltoall(o, i, opts);
                       }))
    return *w;
  std::vector<at::Tensor> ins;
  std::vector<Staged> outs;
  for (int r = 0; r < size_; ++r) {
    checkMultiHostTensor(userInputs[r], op, rank_);
    checkMultiHostTensor(outputs[r], op, rank_);
    TORCH_CHECK(userInputs[r].scalar_type() == outputs[r].scalar_type(), "hoccl ", op, " on rank ", rank_,
                ": input ", r, " has dtype ", userInputs[r].scalar_type(), " but output ", r, " has ",
                outputs[r].scalar_type());
    ins.push_back(readableWhileWriting(userInputs[r], outputs).contiguous());
    outs.emplace_back(outputs[r]);
  }
  return enqueue(c10d::OpType::ALLTOALL, outputs, [this, ins, outs, op] {
    std::vector<at::Tensor> i, o;
    for (auto& t : ins) i.push_back(legs::bytesOf(t));
    for (auto& s : outs) o.push_back(legs::bytesOf(s.work));
    alltoallBytes(i, o, op);
    for (auto& s : outs) s.writeBack();
  }, !opts.asyncOp);
}

}  // namespace hoccl
