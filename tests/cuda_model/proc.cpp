// cuGetProcAddress of the CPU driver model, by the rule cuda.h documents: for a base name and a
// CUDA version, the newest ABI of that name introduced at or before the version; a version above
// the driver's is CUDA_ERROR_INVALID_VALUE; an unknown name is CUDA_SUCCESS with a NULL pointer and
// CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND. The versions are those of cudaTypedefs.h's
// PFN_<name>_v<version> typedefs (tests/test_ce_model.py checks this table against it). An older
// ABI the model does not implement is refused with CUDA_ERROR_NOT_SUPPORTED rather than served with
// the new prototype. The model has no per-thread default stream, so it refuses that flag the same way.
#include <cstring>
#include <string>

#include "model.h"

namespace model {
namespace {

struct Abi {
  const char* base;
  int version;
  void* fn;  // nullptr: an ABI the model does not implement
};

// `fn` goes through cuda.h's macros (cuMemAlloc -> cuMemAlloc_v2): the prototype cuda.h declares.
#define HOCCL_ABI(base, version, fn) {#base, version, reinterpret_cast<void*>(&fn)},
#define HOCCL_OLD_ABI(base, version) {#base, version, nullptr},
const Abi kAbis[] = {
  HOCCL_ABI(cuInit, 2000, cuInit)
  HOCCL_ABI(cuDriverGetVersion, 2020, cuDriverGetVersion)
  HOCCL_ABI(cuGetErrorName, 6000, cuGetErrorName)
  HOCCL_ABI(cuGetErrorString, 6000, cuGetErrorString)
  HOCCL_ABI(cuDeviceGetCount, 2000, cuDeviceGetCount)
  HOCCL_ABI(cuDeviceGet, 2000, cuDeviceGet)
  HOCCL_ABI(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute)
  HOCCL_ABI(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer)
  HOCCL_ABI(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId)
  HOCCL_ABI(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain)
  HOCCL_OLD_ABI(cuDevicePrimaryCtxRelease, 7000)
  HOCCL_ABI(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease)
  HOCCL_ABI(cuCtxGetCurrent, 4000, cuCtxGetCurrent)
  HOCCL_ABI(cuCtxSetCurrent, 4000, cuCtxSetCurrent)
  HOCCL_OLD_ABI(cuCtxPushCurrent, 2000)
  HOCCL_ABI(cuCtxPushCurrent, 4000, cuCtxPushCurrent)
  HOCCL_OLD_ABI(cuCtxPopCurrent, 2000)
  HOCCL_ABI(cuCtxPopCurrent, 4000, cuCtxPopCurrent)
  // 13.0 gave the base name a second argument without a cuda.h macro: the one-argument
  // cuCtxGetDevice is what requests below 13000 get.
  HOCCL_ABI(cuCtxGetDevice, 2000, cuCtxGetDevice)
  HOCCL_ABI(cuCtxGetDevice, 13000, cuCtxGetDevice_v2)
  HOCCL_ABI(cuModuleLoadData, 2000, cuModuleLoadData)
  HOCCL_ABI(cuModuleUnload, 2000, cuModuleUnload)
  HOCCL_ABI(cuModuleGetFunction, 2000, cuModuleGetFunction)
  HOCCL_ABI(cuLaunchKernel, 4000, cuLaunchKernel)
  HOCCL_ABI(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, cuOccupancyMaxActiveBlocksPerMultiprocessor)
  HOCCL_OLD_ABI(cuMemAlloc, 2000)
  HOCCL_ABI(cuMemAlloc, 3020, cuMemAlloc)
  HOCCL_OLD_ABI(cuMemFree, 2000)
  HOCCL_ABI(cuMemFree, 3020, cuMemFree)
  HOCCL_OLD_ABI(cuMemGetAddressRange, 2000)
  HOCCL_ABI(cuMemGetAddressRange, 3020, cuMemGetAddressRange)
  HOCCL_ABI(cuPointerGetAttribute, 4000, cuPointerGetAttribute)
  HOCCL_OLD_ABI(cuMemHostRegister, 4000)
  HOCCL_ABI(cuMemHostRegister, 6050, cuMemHostRegister)
  HOCCL_ABI(cuMemHostUnregister, 4000, cuMemHostUnregister)
  HOCCL_OLD_ABI(cuMemHostGetDevicePointer, 2020)
  HOCCL_ABI(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer)
  HOCCL_ABI(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle)
  HOCCL_OLD_ABI(cuIpcOpenMemHandle, 4010)
  HOCCL_ABI(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle)
  HOCCL_ABI(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle)
  HOCCL_ABI(cuMemcpyAsync, 4000, cuMemcpyAsync)
  HOCCL_OLD_ABI(cuMemcpyHtoDAsync, 2000)
  HOCCL_ABI(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync)
  HOCCL_OLD_ABI(cuMemcpyDtoHAsync, 2000)
  HOCCL_ABI(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync)
  HOCCL_OLD_ABI(cuMemcpyDtoDAsync, 3000)
  HOCCL_ABI(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync)
  HOCCL_OLD_ABI(cuMemcpyBatchAsync, 12080)
  HOCCL_ABI(cuMemcpyBatchAsync, 13000, cuMemcpyBatchAsync)
  HOCCL_ABI(cuStreamCreate, 2000, cuStreamCreate)
  HOCCL_OLD_ABI(cuStreamDestroy, 2000)
  HOCCL_ABI(cuStreamDestroy, 4000, cuStreamDestroy)
  HOCCL_ABI(cuStreamSynchronize, 2000, cuStreamSynchronize)
  HOCCL_ABI(cuStreamQuery, 2000, cuStreamQuery)
  HOCCL_ABI(cuStreamIsCapturing, 10000, cuStreamIsCapturing)
  HOCCL_ABI(cuEventCreate, 2000, cuEventCreate)
  HOCCL_OLD_ABI(cuEventDestroy, 2000)
  HOCCL_ABI(cuEventDestroy, 4000, cuEventDestroy)
  HOCCL_ABI(cuEventRecord, 2000, cuEventRecord)
  HOCCL_ABI(cuEventQuery, 2000, cuEventQuery)
  HOCCL_ABI(cuEventSynchronize, 2000, cuEventSynchronize)
  HOCCL_OLD_ABI(cuEventElapsedTime, 2000)
  HOCCL_ABI(cuEventElapsedTime, 12080, cuEventElapsedTime)
  HOCCL_ABI(cuStreamWaitEvent, 3020, cuStreamWaitEvent)
  HOCCL_OLD_ABI(cuStreamWriteValue32, 8000)
  HOCCL_ABI(cuStreamWriteValue32, 11070, cuStreamWriteValue32)
  HOCCL_OLD_ABI(cuStreamWaitValue32, 8000)
  HOCCL_ABI(cuStreamWaitValue32, 11070, cuStreamWaitValue32)
  HOCCL_OLD_ABI(cuStreamBatchMemOp, 8000)
  HOCCL_ABI(cuStreamBatchMemOp, 11070, cuStreamBatchMemOp)
  HOCCL_OLD_ABI(cuGetProcAddress, 11030)
  HOCCL_ABI(cuGetProcAddress, 12000, cuGetProcAddress)
};
#undef HOCCL_ABI
#undef HOCCL_OLD_ABI

// The newest ABI of `symbol` introduced at or before `version`; nullptr when none is; sets
// *known when the name exists at all.
const Abi* newestAbi(const char* symbol, int version, bool* known) {
  const Abi* best = nullptr;
  *known = false;
  for (const Abi& a : kAbis) {
    if (std::strcmp(a.base, symbol) != 0) continue;
    *known = true;
    if (a.version <= version && (!best || a.version > best->version)) best = &a;
  }
  return best;
}

}  // namespace
}  // namespace model

using namespace model;

extern "C" {

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status) {
  if (CUresult r = injected("PROC_ADDRESS"); r != CUDA_SUCCESS) return r;
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  if (cudaVersion > envInt("HOCCL_MODEL_DRIVER_VERSION", 13000)) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
    return CUDA_ERROR_INVALID_VALUE;
  if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) return CUDA_ERROR_NOT_SUPPORTED;
  bool known = false;
  const Abi* abi = newestAbi(symbol, cudaVersion, &known);
  *pfn = nullptr;
  if (status) *status = !known ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                        : abi ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  if (!abi) return CUDA_SUCCESS;
  if (!abi->fn) return CUDA_ERROR_NOT_SUPPORTED;
  *pfn = abi->fn;
  count("proc_address_lookups");
  return CUDA_SUCCESS;
}

// Test control: the ABI table, "<base> <version> <1 if implemented>" per line, for the check
// against cudaTypedefs.h.
const char* hoccl_model_abi_table() {
  static const std::string table = [] {
    std::string t;
    for (const Abi& a : kAbis) t += std::string(a.base) + " " + std::to_string(a.version) + " " + (a.fn ? "1" : "0") + "\n";
    return t;
  }();
  return table.c_str();
}

}  // extern "C"
