// all_to_all across hosts. With the split check (the default), a forced rail form or
// HOCCL_MULTIHOST_PATH=plans it is one plan across hosts (planned.cpp), whose form VarioPath's
// cost model picks from the gathered split matrix. Without the check no rank needs the matrix,
// and these legs skip gathering it: blocks between ranks of one host move through the host's
// shared memory while the blocks that cross hosts go straight to their destination over the
// global gloo group, at the same time (the direct form of docs/multihost.md).
#include "backend/multihost/legs.h"
#include "backend/multihost/multihost_group.h"
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

// A plan needs every rank's splits, one message round before the data; the legs' direct form needs
// only this rank's own, so without the check it saves that round (4 KB-1 MB on 2x2: as fast as
// gloo, where the plan with its split exchange takes 1.3-1.5x: docs/multihost.md).
void MultiHostGroup::alltoallBytes(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                                   const char* op) {
  std::vector<int64_t> sendBytes, recvBytes;
  for (int r = 0; r < size_; ++r) {
    sendBytes.push_back(ins[r].numel());
    recvBytes.push_back(outs[r].numel());
  }
  if (checkAcrossHosts_ || plansOnly_ || alltoallChoice_ == AllToAllHostsForm::Relay)
    return alltoallPlanned(ins, outs, op, sendBytes, recvBytes);
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    lastPhases_.clear();
  }
  alltoallDirect(ins, outs, op);
}

void MultiHostGroup::alltoallDirect(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                                    const char* op) {
  setAlgorithm("multihost_direct");
  std::vector<at::Tensor> localIns, localOuts;
  for (int r = 0; r < size_; ++r) {
    if (layout_.hostOf(r) != host_) continue;
    localIns.push_back(ins[r]);
    localOuts.push_back(outs[r]);
  }
  // Cross-host blocks go point to point straight from the input and into the output (a packed
  // all_to_all would copy every crossing byte twice more); a tag of their own per op keeps them
  // apart from the global group's collectives.
  const int tag = crossTag();
  std::vector<c10::intrusive_ptr<c10d::Work>> crossing;
  const auto posted = std::chrono::steady_clock::now();
  auto post = [&](bool isSend, int peer, const at::Tensor& block) {
    if (layout_.hostOf(peer) == host_ || block.numel() == 0) return;
    crossing.push_back(startTransfer(op, *groups_.global, allRanks_, isSend, peer, block, tag));
  };
  for (int r = 0; r < size_; ++r) post(false, r, outs[r]);
  for (int r = 0; r < size_; ++r) post(true, r, ins[r]);
  try {
    local(op, [&](ProcessGroupHOCCL& g) { return g.alltoall(localOuts, localIns, c10d::AllToAllOptions()); });
  } catch (...) {
    // gloo may still be writing into the outputs: let the transfers end before they can be freed.
    legs::drain(crossing, posted + timeout_);
    throw;
  }
  for (auto& w : crossing) waitAcross(op, allRanks_, w);
}

c10::intrusive_ptr<c10d::Work> MultiHostGroup::alltoall_base(at::Tensor& output, at::Tensor& userInput,
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

c10::intrusive_ptr<c10d::Work> MultiHostGroup::alltoall(std::vector<at::Tensor>& outputs,
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
