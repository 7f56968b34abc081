#include "exec/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define HOCCL_HAVE_SSE2_STREAM 1
#endif

namespace hoccl {

void streamingCopy(void* dst, const void* src, size_t bytes) {
#ifdef HOCCL_HAVE_SSE2_STREAM
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  // Plain copy up to the first 16-byte-aligned destination address (stream stores need it).
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  // 64 bytes (one cache line) per iteration: four loads, then four streaming stores.
  size_t lines = bytes / 64;
  for (size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes % 64);
  _mm_sfence();  // streaming stores are weakly ordered: drain them before anyone is told
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace hoccl
