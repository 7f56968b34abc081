// Argument checks and tensor helpers shared by the c10d entry points: every failure names the
// op, the rank and what mismatched.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

#include "common/reduce_kernels.h"

namespace hoccl {

// c10d's reduce op as hoccl's; PREMUL_SUM's factor goes to *factor (1 otherwise).
RedOp toRedOp(const c10d::ReduceOp& op, double* factor, const char* opName);

inline char* ptr(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }
inline int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }
// A contiguous tensor's bytes as a one-dimensional uint8 tensor (data moves are dtype-blind).
inline at::Tensor bytesOf(const at::Tensor& t) { return t.view(-1).view(at::kByte); }

// A contiguous working copy of a user tensor; written back after the op when they differ.
struct Staged {
  at::Tensor user, work;
  explicit Staged(const at::Tensor& t) : user(t), work(t.is_contiguous() ? t : t.contiguous()) {}
  void writeBack() const {
    if (!work.is_same(user)) user.copy_(work);
  }
};

void checkTensor(const at::Tensor& t, const char* op, int rank);
// Peers read this rank's inputs while it writes its outputs (and copy engines run them at
// once), so an input that shares memory with an output would be overwritten before every peer
// has read it. Such an input is returned as a copy.
at::Tensor readableWhileWriting(const at::Tensor& input, const std::vector<at::Tensor>& outputs);
void checkSameAs(const at::Tensor& t, const at::Tensor& ref, const char* op, int rank, const char* what);
// Complex tensors reduce as their real view (sums only: the other ops are not elementwise).
inline at::Tensor reducible(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t) : t; }
void checkReduceArgs(const at::Tensor& t, RedOp op, const char* opName, int rank);
void checkRoot(int root, int size, const char* op, int rank);
// all_to_all_single's split sizes for `t` (input or output, `what`): the given ones, checked
// against its rows, or an even split of its rows over `size` ranks when none are given.
std::vector<int64_t> rowSplits(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* op,
                               int rank, const char* what);

}  // namespace hoccl
