// Small helpers the multi-host algorithms share: c10d options for one leg, byte views, the
// reduce op a leg runs.
#pragma once
#include <ATen/ATen.h>
#include <algorithm>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "common/reduce_kernels.h"

namespace hoccl::legs {

// The op a partial reduction runs: sums of every kind add (hoccl scales once, at the end).
inline c10d::ReduceOp partialOp(RedOp op) {
  switch (op) {
    case RedOp::Product: return c10d::ReduceOp::PRODUCT;
    case RedOp::Min: return c10d::ReduceOp::MIN;
    case RedOp::Max: return c10d::ReduceOp::MAX;
    case RedOp::BitAnd: return c10d::ReduceOp::BAND;
    case RedOp::BitOr: return c10d::ReduceOp::BOR;
    case RedOp::BitXor: return c10d::ReduceOp::BXOR;
    default: return c10d::ReduceOp::SUM;
  }
}

inline c10d::AllreduceOptions allreduceOpts(RedOp op) {
  c10d::AllreduceOptions o;
  o.reduceOp = partialOp(op);
  return o;
}

inline c10d::ReduceScatterOptions reduceScatterOpts(RedOp op) {
  c10d::ReduceScatterOptions o;
  o.reduceOp = partialOp(op);
  return o;
}

inline c10d::BroadcastOptions broadcastOpts(int root) {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  return o;
}

// A contiguous tensor's bytes as a one-dimensional uint8 tensor (data moves are dtype-blind).
inline at::Tensor bytesOf(const at::Tensor& t) {
  return t.view(-1).view(at::kByte);
}

inline bool halfWidth(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// Elements per chunk of a pipelined form: 1/8 of the buffer, at least 1 MiB, a multiple of
// `multiple` (so that every chunk but the last splits evenly across a host's ranks).
inline int64_t pipelineChunk(int64_t n, int64_t elementSize, int64_t multiple) {
  const int64_t least = std::max<int64_t>(1, (1 << 20) / elementSize);
  const int64_t chunk = std::max(least, (n + 7) / 8);
  return (chunk + multiple - 1) / multiple * multiple;
}

}  // namespace hoccl::legs

namespace hoccl::legs {

// Waits for every transfer, ignoring their errors: on a failure path, before the buffers the
// transfers write into can be freed.
inline void drain(const std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  for (const auto& w : works) {
    if (!w) continue;
    try {
      w->wait();
    } catch (...) {
    }
  }
}

// The dtype a tensor crosses hosts in: fp16/bf16 accumulate in float; integer types gloo does
// not reduce go as a wider integer (wrap-around sums and products truncate back exactly).
inline at::ScalarType acrossDtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
    case at::kBFloat16: return at::kFloat;
    case at::kShort:
    case at::kUInt16: return at::kInt;
    case at::kUInt32: return at::kLong;
    default: return t;
  }
}

}  // namespace hoccl::legs
