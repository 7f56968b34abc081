// Modules and kernels of the CPU driver model: hoccl's reduction kernels and the sm_free
// check's spin kernel, found by name and run on the stream's thread from their argument struct
// (transport/ce/kernels/reduce_args.h, spin_args.h), each holding SM slots (sms.cpp) while it
// runs. The arithmetic follows reduce.cu: rank order, 16-bit floats accumulate in float and round
// once to nearest even (a chained launch starts from, or leaves, the float running value in
// args.acc), AVG/PREMUL_SUM scale after rounding to the element type. Each function has the
// attributes a driver reads from its image: the __launch_bounds__ the kernels are compiled with
// (a larger block fails to launch) and HOCCL_MODEL_KERNEL_REGS registers per thread, which with
// the thread and block slots decide how many blocks an SM holds (sms.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "model.h"
#include "transport/ce/kernels/reduce_args.h"
#include "transport/ce/kernels/spin_args.h"

namespace model {
namespace {

enum class DType { Float, Double, Half, BFloat16, Char, Byte, Short, Int, Long, Bool };

struct Module {
  int unused = 0;
};
enum class Kind { Reduce, Spin };
struct Function {
  Kind kind;
  DType dtype;  // Reduce only
  int maxThreads;  // the kernel's __launch_bounds__
};

constexpr const char* kSpinName = "hoccl_spin_until_flag";

float halfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    f = man ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  _Float16 h = static_cast<_Float16>(f);  // IEEE binary16, round to nearest even
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

struct Half { uint16_t bits; };
struct BF16 { uint16_t bits; };

template <typename T> struct Acc { using type = T; static T in(T v) { return v; } static T out(T v) { return v; } };
template <> struct Acc<Half> {
  using type = float;
  static float in(Half v) { return halfToFloat(v.bits); }
  static Half out(float v) { return {floatToHalf(v)}; }
};
template <> struct Acc<BF16> {
  using type = float;
  static float in(BF16 v) { return bf16ToFloat(v.bits); }
  static BF16 out(float v) { return {floatToBf16(v)}; }
};

template <typename A>
A combine(A a, A b, int op) {
  if constexpr (std::is_same_v<A, bool>) {
    switch (op) {
      case HOCCL_OP_SUM: case HOCCL_OP_BOR: return a || b;
      case HOCCL_OP_PROD: case HOCCL_OP_BAND: return a && b;
      case HOCCL_OP_MIN: return b < a ? b : a;
      case HOCCL_OP_MAX: return a < b ? b : a;
      case HOCCL_OP_BXOR: return a != b;
      default: return a;
    }
  } else {
    switch (op) {
      case HOCCL_OP_SUM: return static_cast<A>(a + b);
      case HOCCL_OP_PROD: return static_cast<A>(a * b);
      case HOCCL_OP_MIN: return b < a ? b : a;
      case HOCCL_OP_MAX: return a < b ? b : a;
      default: break;
    }
    if constexpr (std::is_integral_v<A>) {
      if (op == HOCCL_OP_BAND) return static_cast<A>(a & b);
      if (op == HOCCL_OP_BOR) return static_cast<A>(a | b);
      if (op == HOCCL_OP_BXOR) return static_cast<A>(a ^ b);
    }
    return a;
  }
}

template <typename T>
T scale(T v, const HocclReduceArgs& a) {
  using A = typename Acc<T>::type;
  if (a.scale == HOCCL_SCALE_NONE) return v;
  if constexpr (std::is_integral_v<A>) {
    if (a.scale == HOCCL_SCALE_DIV_WORLD) return static_cast<T>(v / static_cast<T>(a.world));
    return static_cast<T>(static_cast<double>(v) * a.factor);
  } else {
    A x = Acc<T>::in(v);
    if (a.scale == HOCCL_SCALE_DIV_WORLD) return Acc<T>::out(x / static_cast<A>(a.world));
    return Acc<T>::out(x * static_cast<A>(a.factor));
  }
}

template <typename T>
void reduce(const HocclReduceArgs& a) {
  using A = typename Acc<T>::type;
  for (long long i = 0; i < a.count; ++i) {
    int k = 0;
    A acc = (a.accMode & HOCCL_ACC_LOAD) ? static_cast<const A*>(a.acc)[i]
                                         : Acc<T>::in(static_cast<const T*>(a.src[k++])[i]);
    for (; k < a.nsrc; ++k) acc = combine<A>(acc, Acc<T>::in(static_cast<const T*>(a.src[k])[i]), a.op);
    if (a.accMode & HOCCL_ACC_STORE) static_cast<A*>(a.acc)[i] = acc;
    else static_cast<T*>(a.dst)[i] = scale<T>(Acc<T>::out(acc), a);
  }
}

// Bytes of one accumulator element: float for the 16-bit types, the element itself otherwise.
size_t accSize(DType t) { return t == DType::Half || t == DType::BFloat16 ? 4 : 0; }

size_t elementSize(DType t) {
  switch (t) {
    case DType::Double: case DType::Long: return 8;
    case DType::Float: case DType::Int: return 4;
    case DType::Half: case DType::BFloat16: case DType::Short: return 2;
    default: return 1;
  }
}

void run(DType t, const HocclReduceArgs& a) {
  switch (t) {
    case DType::Float: return reduce<float>(a);
    case DType::Double: return reduce<double>(a);
    case DType::Half: return reduce<Half>(a);
    case DType::BFloat16: return reduce<BF16>(a);
    case DType::Char: return reduce<signed char>(a);
    case DType::Byte: return reduce<unsigned char>(a);
    case DType::Short: return reduce<short>(a);
    case DType::Int: return reduce<int>(a);
    case DType::Long: return reduce<long long>(a);
    case DType::Bool: return reduce<bool>(a);
  }
}

bool dtypeNamed(const std::string& name, DType* out) {
  static const std::pair<const char*, DType> names[] = {
      {"Float", DType::Float}, {"Double", DType::Double}, {"Half", DType::Half}, {"BFloat16", DType::BFloat16},
      {"Char", DType::Char}, {"Byte", DType::Byte}, {"Short", DType::Short}, {"Int", DType::Int},
      {"Long", DType::Long}, {"Bool", DType::Bool}};
  const std::string prefix = "hoccl_reduce_";
  if (name.rfind(prefix, 0) != 0) return false;
  for (const auto& [n, t] : names)
    if (name.substr(prefix.size()) == n) {
      *out = t;
      return true;
    }
  return false;
}

// The spin kernel, wave by wave: the blocks that fit become resident together, say so in their
// state words, and wait (each with the kernel's time limit) for the release word; blocks that
// did not fit start when those leave, as on a GPU.
void spin(const HocclSpinArgs& a, int device, int blocks, int threads) {
  auto* release = reinterpret_cast<const std::atomic<unsigned>*>(a.release);
  auto* state = reinterpret_cast<std::atomic<unsigned>*>(a.state);
  int next = 0;
  while (next < blocks) {
    const auto where = placeBlocks(device, blocks - next, threads);
    const int first = next;
    next += static_cast<int>(where.size());
    for (int b = first; b < next; ++b) state[b].store(HocclSpinRunning);
    const auto start = std::chrono::steady_clock::now();
    unsigned result = HocclSpinReleased;
    while (release->load() == 0) {
      if (std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(a.limitNs)) {
        result = HocclSpinTimedOut;
        break;
      }
      std::this_thread::sleep_for(std::chrono::nanoseconds(a.pollNs));
    }
    for (int b = first; b < next; ++b) state[b].store(result);
    releaseBlocks(device, where, threads);
  }
}

CUresult launchSpin(int blocks, int threads, CUstream s, void** params) {
  HocclSpinArgs a;
  std::memcpy(&a, params[0], sizeof(a));  // documented: parameters are copied at launch
  const int device = currentDevice();
  count("spin_launches");
  return enqueue(s, [a, device, blocks, threads] {
    if (!isDevice(reinterpret_cast<CUdeviceptr>(a.release), sizeof(unsigned)))
      fault("spin kernel reads a non-device address (release word)");
    if (!isDevice(reinterpret_cast<CUdeviceptr>(a.state), sizeof(unsigned) * blocks))
      fault("spin kernel writes a non-device address (state words)");
    spin(a, device, blocks, threads);
  });
}

CUresult launchReduce(DType t, int blocks, int threads, CUstream s, void** params) {
  HocclReduceArgs a;
  std::memcpy(&a, params[0], sizeof(a));  // documented: parameters are copied at launch
  if (a.nsrc < 1 || a.nsrc > HOCCL_REDUCE_MAX_SRCS || a.count < 0) return CUDA_ERROR_INVALID_VALUE;
  const int device = currentDevice();
  count("kernel_launches");
  return enqueue(s, [t, a, device, blocks, threads] {
    const size_t bytes = static_cast<size_t>(a.count) * elementSize(t);
    // A kernel touching memory the device cannot address faults the context.
    if (!isDevice(reinterpret_cast<CUdeviceptr>(a.dst), bytes)) fault("reduction kernel writes a non-device address");
    const size_t accBytes = static_cast<size_t>(a.count) * (accSize(t) ? accSize(t) : elementSize(t));
    if (a.accMode && !isDevice(reinterpret_cast<CUdeviceptr>(a.acc), accBytes))
      fault("reduction kernel touches a non-device address (running values)");
    for (int k = 0; k < a.nsrc; ++k)
      if (!isDevice(reinterpret_cast<CUdeviceptr>(a.src[k]), bytes))
        fault("reduction kernel reads a non-device address (source " + std::to_string(k) + ")");
    // The arithmetic runs once its (first wave of) blocks is resident.
    const auto where = placeBlocks(device, blocks, threads);
    run(t, a);
    releaseBlocks(device, where, threads);
  });
}

}  // namespace
}  // namespace model

using namespace model;

extern "C" {

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  uint32_t magic;
  std::memcpy(&magic, image, 4);
  const bool fatbin = magic == 0xBA55ED50u;
  const bool elf = std::memcmp(image, "\x7f" "ELF", 4) == 0;
  if (!fatbin && !elf) return CUDA_ERROR_INVALID_IMAGE;
  *module = reinterpret_cast<CUmodule>(new Module());
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
  if (!module) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<Module*>(module);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule module, const char* name) {
  if (!f || !module || !name) return CUDA_ERROR_INVALID_VALUE;
  if (std::string(name) == kSpinName) {
    *f = reinterpret_cast<CUfunction>(new Function{Kind::Spin, DType::Float, HOCCL_SPIN_MAX_THREADS});
    return CUDA_SUCCESS;
  }
  DType t;
  if (!dtypeNamed(name, &t)) return CUDA_ERROR_NOT_FOUND;
  *f = reinterpret_cast<CUfunction>(new Function{Kind::Reduce, t, HOCCL_REDUCE_MAX_THREADS});
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sharedBytes, CUstream s, void** params, void** extra) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  // Documented limits: blocks of at most MAX_THREADS_PER_BLOCK threads.
  if (gx * gy * gz == 0 || bx * by * bz == 0 || bx * by * bz > kThreadsPerBlock || !params || extra)
    return CUDA_ERROR_INVALID_VALUE;
  const Function* fn = reinterpret_cast<Function*>(f);
  const int blocks = static_cast<int>(gx * gy * gz);
  const int threads = static_cast<int>(bx * by * bz);
  // More threads than the function allows (its __launch_bounds__, or what its registers leave):
  // "the kernel launch specifies too many threads for the kernel's register count" (cuda.h).
  if (threads > fn->maxThreads || blocksPerSm(threads) < 1) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  if (fn->kind == Kind::Spin) return launchSpin(blocks, threads, s, params);
  return launchReduce(fn->dtype, blocks, threads, s, params);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction f, int blockSize, size_t smem) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!numBlocks || !f || blockSize < 1 || blockSize > kThreadsPerBlock || smem != 0) return CUDA_ERROR_INVALID_VALUE;
  // The kernels use no shared memory: thread, block and register slots decide; a block larger
  // than the function can launch is never resident.
  const Function* fn = reinterpret_cast<Function*>(f);
  *numBlocks = blockSize > fn->maxThreads ? 0 : blocksPerSm(blockSize);
  return CUDA_SUCCESS;
}

}  // extern "C"
