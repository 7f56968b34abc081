#include "transport/ce/ce_module.h"

#include <stdexcept>
#include <string>

// Weak: without the generated source both resolve to null (see ce_module.h).
extern "C" {
__attribute__((weak, visibility("hidden"))) extern const unsigned char hoccl_reduce_fatbin[];
__attribute__((weak, visibility("hidden"))) extern const unsigned long long hoccl_reduce_fatbin_size;
__attribute__((weak, visibility("hidden"))) extern const unsigned char hoccl_spin_fatbin[];
__attribute__((weak, visibility("hidden"))) extern const unsigned long long hoccl_spin_fatbin_size;
}

namespace hoccl {

namespace {

EmbeddedImage imageOf(const unsigned char* data, const unsigned long long* size) {
  if (data == nullptr || size == nullptr) return {};
  return {data, static_cast<size_t>(*size)};
}

}  // namespace

EmbeddedImage embeddedImage(EmbeddedKernel k) {
  switch (k) {
    case EmbeddedKernel::Reduce: return imageOf(hoccl_reduce_fatbin, &hoccl_reduce_fatbin_size);
    case EmbeddedKernel::Spin: return imageOf(hoccl_spin_fatbin, &hoccl_spin_fatbin_size);
  }
  return {};
}

const char* embeddedKernelName(EmbeddedKernel k) { return k == EmbeddedKernel::Reduce ? "reduction" : "spin"; }

#ifdef HOCCL_WITH_CUDA

EmbeddedModule::EmbeddedModule(EmbeddedKernel k, int device) : device_(device) {
  const EmbeddedImage image = embeddedImage(k);
  const std::string name = embeddedKernelName(k);
  if (!image.bytes)
    throw std::runtime_error("hoccl: no " + name + " kernel in this build (nvcc was not found at build time)");
  cu::ContextGuard guard(device_);
  cu::check(cu::driver().cuModuleLoadData(&module_, image.data), ("cuModuleLoadData (" + name + " kernel)").c_str());
}

EmbeddedModule::~EmbeddedModule() {
  if (!module_) return;
  try {
    cu::ContextGuard guard(device_);
    cu::driver().cuModuleUnload(module_);
  } catch (...) {
    // Teardown: the context may already be gone.
  }
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
