#include "transport/ce/ce_spin.h"

#include <algorithm>
#include <stdexcept>

namespace hoccl {

size_t spinKernelImageBytes() { return embeddedImage(EmbeddedKernel::Spin).bytes; }

#ifdef HOCCL_WITH_CUDA

namespace {

constexpr const char* kSpinName = "hoccl_spin_until_flag";
constexpr int kSpinMaxThreads = HOCCL_SPIN_MAX_THREADS;  // the kernel's __launch_bounds__

int attribute(CUdevice dev, CUdevice_attribute a, const char* what) {
  int v = 0;
  cu::check(cu::driver().cuDeviceGetAttribute(&v, a, dev), what);
  return v;
}

}  // namespace

SpinKernel::SpinKernel(int device) : device_(device) {
  if (!spinKernelImageBytes())
    throw std::runtime_error("hoccl: no SM spin kernel in this build (nvcc was not found at build time)");
  module_ = std::make_unique<EmbeddedModule>(EmbeddedKernel::Spin, device);
  cu::ContextGuard guard(device_);
  cu::check(cu::driver().cuModuleGetFunction(&function_, module_->get(), kSpinName),
            "cuModuleGetFunction (spin kernel)");
}

SpinKernel::~SpinKernel() = default;

SpinShape SpinKernel::shape() const {
  const auto& api = cu::driver();
  CUdevice dev;
  cu::check(api.cuDeviceGet(&dev, device_), "cuDeviceGet");
  SpinShape s;
  s.sms = attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "cuDeviceGetAttribute (MULTIPROCESSOR_COUNT)");
  s.maxThreadsPerSm = attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                                "cuDeviceGetAttribute (MAX_THREADS_PER_MULTIPROCESSOR)");
  const int perBlock = attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                 "cuDeviceGetAttribute (MAX_THREADS_PER_BLOCK)");
  const int maxBlocksPerSm = attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
                                       "cuDeviceGetAttribute (MAX_BLOCKS_PER_MULTIPROCESSOR)");
  if (s.sms < 1 || s.maxThreadsPerSm < 1 || perBlock < 1)
    throw std::runtime_error("hoccl: the driver reports no SMs or threads for device " + std::to_string(device_));
  // Largest block that divides an SM's thread slots: whole blocks can then fill every slot.
  s.threadsPerBlock = std::min({kSpinMaxThreads, perBlock, s.maxThreadsPerSm});
  while (s.threadsPerBlock > 32 && s.maxThreadsPerSm % s.threadsPerBlock != 0) s.threadsPerBlock /= 2;
  if (api.cuOccupancyMaxActiveBlocksPerMultiprocessor) {
    cu::check(api.cuOccupancyMaxActiveBlocksPerMultiprocessor(&s.blocksPerSm, function_, s.threadsPerBlock, 0),
              "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    s.occupancySource = "cuOccupancyMaxActiveBlocksPerMultiprocessor";
  } else {
    // Without the query: thread slots bound residency (the kernel uses no shared memory and
    // few registers), and so does the per-SM block limit when the driver reports one.
    s.blocksPerSm = s.maxThreadsPerSm / s.threadsPerBlock;
    if (maxBlocksPerSm > 0) s.blocksPerSm = std::min(s.blocksPerSm, maxBlocksPerSm);
    s.occupancySource = "device attributes";
  }
  if (s.blocksPerSm < 1)
    throw std::runtime_error("hoccl: the spin kernel cannot be resident on device " + std::to_string(device_));
  return s;
}

void SpinKernel::launch(CUstream stream, const HocclSpinArgs& args, const SpinShape& shape) {
  HocclSpinArgs a = args;
  void* params[] = {&a};
  cu::check(cu::driver().cuLaunchKernel(function_, shape.blocks(), 1, 1, shape.threadsPerBlock, 1, 1, 0, stream, params,
                                        nullptr),
            "cuLaunchKernel (spin kernel)");
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
