// The SM-occupying kernel of the sm_free check (kernels/spin.cu), loaded like the reduction
// kernel (ce_module: embedded fatbin, cuModuleLoadData) and launched through the driver table.
//
// Why a kernel: the profiler cannot tell whether a copy ran on a copy engine (a same-device D2D
// that the driver implements as a kernel is still labelled "Memcpy DtoD"). Filling every SM's
// resident-thread capacity with blocks that wait on a host-mapped flag makes the difference
// observable: only copy-engine work can finish while they hold the SMs.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "transport/ce/ce_module.h"
#include "transport/ce/cuda_driver.h"
#include "transport/ce/kernels/spin_args.h"

namespace hoccl {

// Bytes of the embedded spin fatbin (0: built without nvcc).
size_t spinKernelImageBytes();

#ifdef HOCCL_WITH_CUDA

// How many blocks of how many threads fill every SM of a device, and where the numbers came from.
struct SpinShape {
  int sms = 0;
  int threadsPerBlock = 0;
  int blocksPerSm = 0;         // resident blocks of this kernel per SM (occupancy query or derived)
  int maxThreadsPerSm = 0;
  std::string occupancySource; // "cuOccupancyMaxActiveBlocksPerMultiprocessor" or "device attributes"
  int blocks() const { return sms * blocksPerSm; }
  // True when the resident blocks take every thread slot of every SM: no other block fits.
  bool fillsEverySm() const { return blocksPerSm * threadsPerBlock >= maxThreadsPerSm; }
};

// One loaded module on one device (RAII: unloaded with the object). The caller's context must be
// `device`'s primary context (cu::ContextGuard) for shape() and launch().
class SpinKernel {
 public:
  explicit SpinKernel(int device);
  ~SpinKernel();
  SpinKernel(const SpinKernel&) = delete;
  SpinKernel& operator=(const SpinKernel&) = delete;

  SpinShape shape() const;
  void launch(CUstream stream, const HocclSpinArgs& args, const SpinShape& shape);

 private:
  int device_;
  std::unique_ptr<EmbeddedModule> module_;
  CUfunction function_ = nullptr;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
