// The CUDA driver API, loaded at run time.
//
// Why dlopen: one build of hoccl_backend._C must import on a CPU-only machine (no libcuda) and
// run on a GPU machine, without a link-time dependency on libcuda or libcudart and without a
// CUDA build of torch. `driver()` opens libcuda.so.1 once per process (HOCCL_LIBCUDA overrides
// the path, for tests), resolves every entry point in HOCCL_CU_REQUIRED through
// cuGetProcAddress (falling back to dlsym of the versioned name the header declares), and throws
// one clear error naming the library or the missing symbol. The table is the only global of
// the CUDA pieces.
//
// Without CUDA headers at build time (HOCCL_WITH_CUDA undefined) only the status functions
// exist and report "built without CUDA headers".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#ifdef HOCCL_WITH_CUDA
#include <cuda.h>
#endif

namespace hoccl {
namespace cu {

// True when the CUDA pieces were compiled in (cuda.h found at build time).
bool builtWithCuda();

// "" when the driver loads and every required entry point resolves, else the reason.
// Never throws; the first call pays for dlopen.
std::string loadError();

#ifdef HOCCL_WITH_CUDA

// Entry points the copy-engine transport needs: X(name). Each member is typed from cuda.h's own
// prototype (decltype), so the table cannot drift from the headers we compiled against.
#define HOCCL_CU_REQUIRED(X)                                                        \
  X(cuGetErrorString) X(cuGetErrorName) X(cuInit) X(cuDriverGetVersion)             \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceCanAccessPeer) \
  X(cuDeviceGetPCIBusId) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)    \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent)       \
  X(cuMemcpyAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoDAsync)    \
  X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemHostGetDevicePointer)           \
  X(cuMemGetAddressRange) X(cuPointerGetAttribute) X(cuMemAlloc) X(cuMemFree)          \
  X(cuStreamWriteValue32) X(cuStreamWaitValue32) X(cuStreamBatchMemOp)               \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)       \
  X(cuStreamWaitEvent) X(cuStreamIsCapturing)                                        \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)                  \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)     \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)          \
  X(cuEventQuery) X(cuEventElapsedTime)

// Present only on newer drivers; null when absent (callers check). Resolved only when the driver
// is at least as new as cuda.h, because the prototype changed between major versions.
#define HOCCL_CU_OPTIONAL(X) X(cuMemcpyBatchAsync)

// Optional with a prototype that never changed: resolved from any driver; null when absent. Only
// the sm_free check uses them, so a driver without them still runs the transport.
#define HOCCL_CU_OPTIONAL_STABLE(X) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)

struct DriverApi {
#define HOCCL_CU_MEMBER(name) decltype(&::name) name = nullptr;
  HOCCL_CU_REQUIRED(HOCCL_CU_MEMBER)
  HOCCL_CU_OPTIONAL(HOCCL_CU_MEMBER)
  HOCCL_CU_OPTIONAL_STABLE(HOCCL_CU_MEMBER)
#undef HOCCL_CU_MEMBER
  int driverVersion = 0;  // e.g. 13000 for CUDA 13.0 (driver 580)
  std::string libraryPath;
  // Entry points cuGetProcAddress did not give ("name: why"), found by dlsym instead: a GPU run
  // shows which path its table came from.
  std::vector<std::string> dlsymFallbacks;
};

// The loaded table; throws std::runtime_error with loadError() when unusable.
const DriverApi& driver();

// Throws std::runtime_error "hoccl: <what> failed: CUDA_ERROR_X (text)" unless r == CUDA_SUCCESS.
void check(CUresult r, const char* what);

// Makes the device's primary context (the one torch uses) current on this thread for the
// guard's lifetime. The PG worker thread has no current context, so every driver call made
// there must sit under one of these.
class ContextGuard {
 public:
  explicit ContextGuard(int device);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  CUcontext context() const { return ctx_; }

 private:
  CUcontext ctx_ = nullptr;
  bool pushed_ = false;
};

// The primary context of `device`, retained once per process (released at exit by the driver).
CUcontext primaryContext(int device);

#endif  // HOCCL_WITH_CUDA

}  // namespace cu
}  // namespace hoccl
