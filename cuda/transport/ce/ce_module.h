// The kernels scripts/embed_kernel.py compiles into the build (its KERNELS), and loading one.
//
// The generated source defines hoccl_<name>_fatbin / hoccl_<name>_fatbin_size for each kernel;
// ce_module.cpp references them weakly, so a build without nvcc still links and reports the
// kernel absent. A module is loaded with cuModuleLoadData through the dlopen'ed driver table (no
// cudart).
#pragma once
#include <cstddef>
#include <cstdint>

#include "transport/ce/cuda_driver.h"

namespace hoccl {

enum class EmbeddedKernel : int8_t { Reduce, Spin };

// The embedded fatbin of `k`; bytes 0 (and data null) when the build has none.
struct EmbeddedImage {
  const unsigned char* data = nullptr;
  size_t bytes = 0;
};
EmbeddedImage embeddedImage(EmbeddedKernel k);
const char* embeddedKernelName(EmbeddedKernel k);  // "reduction", "spin"

#ifdef HOCCL_WITH_CUDA

// One embedded image loaded on one device; unloaded with the object. Throws when the image is
// absent or the driver refuses it.
class EmbeddedModule {
 public:
  EmbeddedModule(EmbeddedKernel k, int device);
  ~EmbeddedModule();
  EmbeddedModule(const EmbeddedModule&) = delete;
  EmbeddedModule& operator=(const EmbeddedModule&) = delete;
  CUmodule get() const { return module_; }

 private:
  int device_;
  CUmodule module_ = nullptr;
};

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
