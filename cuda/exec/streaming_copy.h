// Copies that bypass the cache on the way out (non-temporal stores).
//
// A plain memcpy of a large block reads the destination's cache lines before overwriting them
// (read-for-ownership) and evicts useful lines; a non-temporal store writes whole lines
// straight to memory. On the 2-core CI VM a 64 MiB copy runs ~25 % faster this way (9.5 vs
// 7.6 GB/s). glibc switches to such stores only above a threshold derived from the last-level
// cache size, which a VM reports as its host's (300 MiB here), so it never does. Use it only
// for destinations nobody reads again soon: the user's output buffers of a large collective.
// HOCCL_STREAMING_COPY_BYTES sets the size from which the executor uses it (0: never).
// From 512 KiB by default: a world-2 1 MiB all_to_all, whose reads and writes (2.5 MiB a rank)
// overflow a 2 MiB L2, runs ~8 % faster with its 512 KiB own-half copy streamed; below, the copy
// stays in cache and plain stores win (a 128 KiB copy streamed: 16 against 12 us per 256 KiB
// all_to_all).
#pragma once
#include <cstddef>

namespace hoccl {

// memcpy with non-temporal stores where the CPU has them (x86-64: always, SSE2); ends with a
// store fence, so the bytes are visible to other processes before a later barrier publishes them.
void streamingCopy(void* dst, const void* src, size_t bytes);

}  // namespace hoccl
