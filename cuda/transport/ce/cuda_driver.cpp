#include "transport/ce/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace hoccl {
namespace cu {

#ifndef HOCCL_WITH_CUDA

bool builtWithCuda() { return false; }
std::string loadError() {
  return "hoccl was built without CUDA headers (cuda.h not found at build time): "
         "the copy-engine transport is unavailable";
}

#else  // HOCCL_WITH_CUDA

bool builtWithCuda() { return true; }

namespace {

#define HOCCL_STR2(x) #x
#define HOCCL_STR(x) HOCCL_STR2(x)

// Oldest driver whose stream memory operations are on by default and whose versioned entry
// points (_v2 of cuStreamWaitValue32 & co.) match the prototypes in cuda.h.
constexpr int kMinDriverVersion = 12000;

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

struct Loader {
  DriverApi api;
  std::string error;  // "" once loaded
  void* handle = nullptr;
  GetProcV2 getProcV2 = nullptr;
  GetProcV1 getProcV1 = nullptr;
  int requestVersion = CUDA_VERSION;

  // `base` is the unversioned name cuGetProcAddress wants; `versioned` is what cuda.h's macros
  // turned the name into (e.g. cuMemcpyDtoHAsync_v2), the right dlsym fallback.
  // LEGACY_STREAM explicitly: what DEFAULT means for code built without per-thread streams, and
  // what torch's default stream is.
  void* resolve(const char* base, const char* versioned) {
    void* fn = nullptr;
    std::string why = "no cuGetProcAddress";
    if (getProcV2) {
      CUdriverProcAddressQueryResult status{};
      const CUresult r = getProcV2(base, &fn, requestVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
      if (r == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS && fn) return fn;
      why = "cuGetProcAddress_v2 returned " + std::to_string(r) + ", symbolStatus " + std::to_string(status);
    } else if (getProcV1) {
      const CUresult r = getProcV1(base, &fn, requestVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
      if (r == CUDA_SUCCESS && fn) return fn;
      why = "cuGetProcAddress returned " + std::to_string(r);
    }
    fn = dlsym(handle, versioned);
    if (fn) api.dlsymFallbacks.push_back(std::string(base) + ": " + why);
    return fn;
  }

  std::string open() {
    const char* env = std::getenv("HOCCL_LIBCUDA");
    api.libraryPath = (env && *env) ? env : "libcuda.so.1";
    handle = dlopen(api.libraryPath.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      return "hoccl: cannot load the CUDA driver library " + api.libraryPath + " (" +
             (why ? why : "unknown dlopen error") +
             "); is an NVIDIA driver installed? CUDA tensors need it, CPU tensors do not";
    }
    getProcV2 = reinterpret_cast<GetProcV2>(dlsym(handle, "cuGetProcAddress_v2"));
    if (!getProcV2) getProcV1 = reinterpret_cast<GetProcV1>(dlsym(handle, "cuGetProcAddress"));
    return "";
  }

  std::string readVersion() {
    auto getVersion = reinterpret_cast<decltype(&::cuDriverGetVersion)>(dlsym(handle, "cuDriverGetVersion"));
    if (!getVersion) return "hoccl: " + api.libraryPath + " lacks cuDriverGetVersion (not a CUDA driver?)";
    if (getVersion(&api.driverVersion) != CUDA_SUCCESS) return "hoccl: cuDriverGetVersion failed";
    if (api.driverVersion < kMinDriverVersion)
      return "hoccl: CUDA driver " + std::to_string(api.driverVersion) + " in " + api.libraryPath +
             " is older than the 12.0 the copy-engine transport needs";
    // Ask for the ABI of the headers we compiled against, never newer than the driver has.
    requestVersion = api.driverVersion < CUDA_VERSION ? api.driverVersion : CUDA_VERSION;
    return "";
  }

  std::string resolveAll() {
    std::vector<std::string> missing;
#define HOCCL_CU_RESOLVE_REQUIRED(name)                                                  \
  api.name = reinterpret_cast<decltype(api.name)>(resolve(#name, HOCCL_STR(name)));       \
  if (!api.name) missing.push_back(#name);
    HOCCL_CU_REQUIRED(HOCCL_CU_RESOLVE_REQUIRED)
#undef HOCCL_CU_RESOLVE_REQUIRED
    // cuMemcpyBatchAsync changed its prototype in CUDA 13; only take the one cuda.h declares.
#define HOCCL_CU_RESOLVE_OPTIONAL(name) \
  api.name = reinterpret_cast<decltype(api.name)>(resolve(#name, HOCCL_STR(name)));
    if (requestVersion >= CUDA_VERSION) {
      HOCCL_CU_OPTIONAL(HOCCL_CU_RESOLVE_OPTIONAL)
    }
    HOCCL_CU_OPTIONAL_STABLE(HOCCL_CU_RESOLVE_OPTIONAL)
#undef HOCCL_CU_RESOLVE_OPTIONAL
    if (missing.empty()) return "";
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    return "hoccl: the CUDA driver " + api.libraryPath + " lacks required entry point(s): " + list;
  }

  void load() {
    error = open();
    if (error.empty()) error = readVersion();
    if (error.empty()) error = resolveAll();
    if (error.empty()) {
      CUresult r = api.cuInit(0);
      if (r != CUDA_SUCCESS) {
        const char* name = nullptr;
        api.cuGetErrorName(r, &name);
        error = "hoccl: cuInit failed in " + api.libraryPath + ": " + (name ? name : std::to_string(r)) +
                " (no usable GPU visible to this process?)";
      }
    }
  }
};

Loader& loader() {
  static Loader* l = [] {
    auto* p = new Loader();  // never freed: the driver must outlive every static destructor
    p->load();
    return p;
  }();
  return *l;
}

}  // namespace

std::string loadError() { return loader().error; }

const DriverApi& driver() {
  Loader& l = loader();
  if (!l.error.empty()) throw std::runtime_error(l.error);
  return l.api;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const DriverApi& api = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  api.cuGetErrorName(r, &name);
  api.cuGetErrorString(r, &text);
  throw std::runtime_error(std::string("hoccl: ") + what + " failed: " + (name ? name : "CUDA error") +
                           " (" + (text ? text : std::to_string(r)) + ")");
}

CUcontext primaryContext(int device) {
  static std::mutex mu;
  static std::vector<CUcontext> contexts;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) throw std::invalid_argument("hoccl: negative CUDA device index");
  if (contexts.size() <= static_cast<size_t>(device)) contexts.resize(device + 1, nullptr);
  if (!contexts[device]) {
    const DriverApi& api = driver();
    CUdevice dev;
    check(api.cuDeviceGet(&dev, device), "cuDeviceGet");
    // Same context torch's runtime uses, so pointers and streams from torch are valid in it.
    check(api.cuDevicePrimaryCtxRetain(&contexts[device], dev), "cuDevicePrimaryCtxRetain");
  }
  return contexts[device];
}

ContextGuard::ContextGuard(int device) {
  const DriverApi& api = driver();
  ctx_ = primaryContext(device);
  CUcontext current = nullptr;
  check(api.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != ctx_) {
    check(api.cuCtxPushCurrent(ctx_), "cuCtxPushCurrent");
    pushed_ = true;
  }
}

ContextGuard::~ContextGuard() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  driver().cuCtxPopCurrent(&popped);  // cannot throw from a destructor; nothing to recover
}

#endif  // HOCCL_WITH_CUDA

}  // namespace cu
}  // namespace hoccl
