// The reduction arithmetic on the GPU: the only SM work of the cuda-ce transport.
//
// The kernel (cuda/transport/ce/kernels/reduce.cu) is compiled by nvcc at build time into a fatbin that
// scripts/embed_kernel.py embeds in a generated source; ce_module loads it (cuModuleLoadData) and
// this file launches it with cuLaunchKernel (no cudart). Built without nvcc, the
// kernel is unavailable and reductions must run on the host (HOCCL_REDUCE_ON=host).
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/reduce_kernels.h"
#include "transport/ce/ce_module.h"
#include "transport/ce/cuda_driver.h"
#include "transport/ce/kernels/reduce_args.h"

namespace hoccl {

enum class ReduceOn : int8_t { Gpu, Host };

// Bytes of the embedded fatbin (0: built without nvcc).
size_t reduceKernelImageBytes();
// HOCCL_REDUCE_CTAS (default 4, clamped to [1, 1024]): the most CTAs one reduction may occupy.
int reduceCtasFromEnv();
// HOCCL_REDUCE_ON=gpu|host; default gpu when the kernel is embedded, else host. Asking for gpu
// without the kernel throws, naming the reason.
ReduceOn reduceOnFromEnv();
// Threads per CTA the launcher uses: the kernels' __launch_bounds__.
constexpr int kReduceThreads = HOCCL_REDUCE_MAX_THREADS;
// Bytes of float scratch launch() needs for `nsrc` sources of `count` elements: 16-bit floats past
// HOCCL_REDUCE_MAX_SRCS sources keep their running value in float between chained launches
// (rounding it per launch would break "round once"); 0 otherwise.
size_t reduceScratchBytes(c10::ScalarType dtype, size_t nsrc, int64_t count);

#ifdef HOCCL_WITH_CUDA

// One loaded module per device (RAII: unloaded with the object); cheap to launch repeatedly.
class ReduceKernel {
 public:
  ReduceKernel(int device, int maxCtas);
  ~ReduceKernel();
  ReduceKernel(const ReduceKernel&) = delete;
  ReduceKernel& operator=(const ReduceKernel&) = delete;

  // dst[i] = srcs[0][i] op srcs[1][i] op ... (rank order), then AVG divides by `world` and
  // PREMUL_SUM multiplies by `factor` when `finalize`. More than HOCCL_REDUCE_MAX_SRCS sources
  // chain several launches: 16-bit floats through `scratch` (reduceScratchBytes() of device
  // memory, else std::logic_error), other types through dst (exact: they accumulate in their own
  // type), so for those dst may alias only one of the first HOCCL_REDUCE_MAX_SRCS sources (else
  // std::invalid_argument). Enqueued on `stream`; the caller's context must be `device`'s
  // primary context (cu::ContextGuard).
  void launch(CUstream stream, CUdeviceptr dst, const std::vector<CUdeviceptr>& srcs, int64_t count,
              c10::ScalarType dtype, RedOp op, double factor, int world, bool finalize, CUdeviceptr scratch = 0);

  // Grid size launch() uses for `count` elements: never more than maxCtas.
  int gridFor(int64_t count) const;
  int maxCtas() const { return maxCtas_; }

 private:
  CUfunction function(c10::ScalarType dtype);
  int maxCtas_;
  std::unique_ptr<EmbeddedModule> module_;
  std::vector<std::pair<c10::ScalarType, CUfunction>> functions_;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
