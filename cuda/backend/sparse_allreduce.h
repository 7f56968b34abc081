// all_reduce of sparse COO tensors, written once over an all_gather of equal blocks that the
// group supplies: the group of one host's ranks and the group spanning hosts run the same steps.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "common/red_op.h"

namespace hoccl {

// All-gathers `block` (the same bytes on every rank) into outputs[r] for every rank r, in order
// with the group's other ops; returns when the outputs hold every rank's block.
using GatherBlocks = std::function<void(const at::Tensor& block, const std::vector<at::Tensor>& outputs)>;

// The arguments a sparse all_reduce accepts (CPU COO, SUM, or AVG of floating dtypes), checked
// on the caller's thread.
void checkSparseAllreduce(const at::Tensor& t, RedOp op, int rank);

// Every rank's (indices, values) gathered and summed with coalesce(); `tensor` becomes the
// coalesced sum on every rank. Layouts are compared first, so a mismatch raises on every rank.
void sparseAllreduce(const at::Tensor& tensor, RedOp op, int rank, int world, const GatherBlocks& gather);

}  // namespace hoccl
