// Initialisation, devices, contexts, errors and test counters of the CPU driver model.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "model.h"

namespace model {
namespace {

std::atomic<bool> inited{false};

struct Context {
  int device;
  int retains = 0;
};

Context* primary(int device) {
  static std::mutex mu;
  static std::map<int, Context*> contexts;  // never freed: handles outlive static destructors
  std::lock_guard<std::mutex> lock(mu);
  Context*& c = contexts[device];
  if (!c) c = new Context{device};
  return c;
}

thread_local std::vector<CUcontext> contextStack;

int deviceCount() { return envInt("HOCCL_MODEL_DEVICES", 1); }

std::mutex counterMu;
std::map<std::string, long long>& counters() {
  static auto* m = new std::map<std::string, long long>();
  return *m;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
const ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

}  // namespace

bool initialized() { return inited.load(); }

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

CUresult injected(const char* what) {
  const std::string name = std::string("HOCCL_MODEL_FAIL_") + what;
  return static_cast<CUresult>(envInt(name.c_str(), 0));
}

void count(const char* counter, long long delta) {
  std::lock_guard<std::mutex> lock(counterMu);
  counters()[counter] += delta;
}

bool hasCurrentContext() { return !contextStack.empty() && contextStack.back() != nullptr; }

int currentDevice() { return hasCurrentContext() ? reinterpret_cast<Context*>(contextStack.back())->device : 0; }

void fault(const std::string& why) {
  std::fprintf(stderr, "hoccl CUDA model: device fault: %s\n", why.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace model

using namespace model;

extern "C" {

CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = injected("INIT"); r != CUDA_SUCCESS) return r;
  if (deviceCount() < 1) return CUDA_ERROR_NO_DEVICE;
  inited.store(true);
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = envInt("HOCCL_MODEL_DRIVER_VERSION", 13000);
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char** name) {
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors)
    if (e.code == r) {
      *name = e.name;
      return CUDA_SUCCESS;
    }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char** text) {
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors)
    if (e.code == r) {
      *text = e.text;
      return CUDA_SUCCESS;
    }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* n) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *n = deviceCount();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = kSmCount; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = kThreadsPerSm; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *v = kBlocksPerSm; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *v = 2; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = kThreadsPerBlock; break;
    default: *v = 0;  // in particular CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: host != device address
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= deviceCount() || peer < 0 || peer >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer && envInt("HOCCL_MODEL_PEER_ACCESS", 1) != 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* buf, int len, CUdevice dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!buf || len < 13) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(buf, len, "0000:%02x:00.0", 0x10 + dev);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  Context* c = primary(dev);
  ++c->retains;
  *ctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || dev >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  --primary(dev)->retains;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  *ctx = contextStack.empty() ? nullptr : contextStack.back();
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (contextStack.empty()) {
    if (ctx) contextStack.push_back(ctx);
  } else if (ctx) {
    contextStack.back() = ctx;
  } else {
    contextStack.pop_back();
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  contextStack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (contextStack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = contextStack.back();
  contextStack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = reinterpret_cast<Context*>(contextStack.back())->device;
  return CUDA_SUCCESS;
}

// CUDA 13.0's second ABI of cuCtxGetDevice (what cuGetProcAddress returns for it at 13000): the
// device of `ctx`, or of the current context when ctx is NULL.
CUresult cuCtxGetDevice_v2(CUdevice* dev, CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (!ctx && !hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = reinterpret_cast<Context*>(ctx ? ctx : contextStack.back())->device;
  return CUDA_SUCCESS;
}

// Test control: the value of a model counter (0 when never touched).
long long hoccl_model_counter(const char* name) {
  std::lock_guard<std::mutex> lock(counterMu);
  auto it = counters().find(name);
  return it == counters().end() ? 0 : it->second;
}

}  // extern "C"
