// Copies that bypass the cache on the way out (non-temporal stores).
//
// A plain memcpy of a large block reads the destination's cache lines before overwriting them
// (read-for-ownership) and evicts useful lines; a non-temporal store writes whole lines
// straight to memory. On the 2-core CI VM a 64 MiB copy runs ~25 % faster this way (9.5 vs
// 7.6 GB/s). glibc switches to such stores only above a threshold derived from the last-level
// cache size, which a VM reports as its host's (300 MiB here), so it never does. Use it only
// for destinations nobody reads again soon: the user's output buffers of a large collective.
// HOCCL_STREAMING_COPY_BYTES sets the op output size (per rank) from which the backend asks for
// it (0: never). From 4 MiB by default, not per copy: a caller usually reads a collective's
// output next (the residual add after a tensor-parallel all_reduce), and an output that fits in
// cache is then a cache hit that streaming would turn into a memory read. World 2, 1 MiB fp32
// all_reduce (two 512 KiB copies out): 151 us with those copies streamed, 96 us plain; from
// 4 MiB outputs stop fitting next to the op's staging and streaming pays (4 MiB: ~335 against
// ~400 us).
#pragma once
#include <cstddef>

namespace hoccl {

// memcpy with non-temporal stores where the CPU has them (x86-64: always, SSE2); ends with a
// store fence, so the bytes are visible to other processes before a later barrier publishes them.
void streamingCopy(void* dst, const void* src, size_t bytes);

}  // namespace hoccl
