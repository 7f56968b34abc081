#include "backend/tensor_args.h"

#include <ATen/MemoryOverlap.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace hoccl {

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

std::vector<int64_t> rowSplits(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* op,
                               int rank, const char* what) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    TORCH_CHECK(rows % size == 0, "hoccl ", op, " on rank ", rank, ": ", what, " has ", rows,
                " rows, not divisible by the world size ", size, " (pass split sizes)");
    s.assign(size, rows / size);
  }
  TORCH_CHECK(static_cast<int>(s.size()) == size, "hoccl ", op, " on rank ", rank, ": ", s.size(), " ", what,
              " split sizes for ", size, " ranks");
  int64_t sum = 0;
  for (auto v : s) {
    TORCH_CHECK(v >= 0, "hoccl ", op, " on rank ", rank, ": negative ", what, " split size ", v);
    sum += v;
  }
  TORCH_CHECK(sum == rows, "hoccl ", op, " on rank ", rank, ": ", what, " split sizes sum to ", sum, " but the ",
              what, " has ", rows, " rows");
  return s;
}

}  // namespace hoccl
