// Small helpers the multi-host legs share: byte views, chunking, draining.
#pragma once
#include <ATen/ATen.h>
#include <algorithm>
#include <chrono>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace hoccl::legs {

// A contiguous tensor's bytes as a one-dimensional uint8 tensor (data moves are dtype-blind).
inline at::Tensor bytesOf(const at::Tensor& t) {
  return t.view(-1).view(at::kByte);
}

// Elements per chunk of a pipelined form: 1/8 of the buffer, at least 1 MiB, a multiple of
// `multiple` (so that every chunk but the last splits evenly across a host's ranks).
inline int64_t pipelineChunk(int64_t n, int64_t elementSize, int64_t multiple) {
  const int64_t least = std::max<int64_t>(1, (1 << 20) / elementSize);
  const int64_t chunk = std::max(least, (n + 7) / 8);
  return (chunk + multiple - 1) / multiple * multiple;
}

// Waits for every gloo transfer posted together, ignoring their errors: on a failure path, before
// the buffers the transfers write into can be freed. Each waits at most until `deadline` (their
// post plus the group's timeout): gloo's wait would give each a whole timeout from the moment it
// is drained, so a lost host would cost one timeout per transfer still in flight. A gloo wait
// that expires breaks its context, so nothing writes into the buffers after it either.
inline void drain(const std::vector<c10::intrusive_ptr<c10d::Work>>& works,
                  std::chrono::steady_clock::time_point deadline) {
  for (const auto& w : works) {
    if (!w) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      w->wait(std::max(left, std::chrono::milliseconds(1)));  // 0 would mean gloo's whole timeout
    } catch (...) {
    }
  }
}

}  // namespace hoccl::legs
