#include "transport/ce/ce_reduce.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace hoccl {

size_t reduceKernelImageBytes() { return embeddedImage(EmbeddedKernel::Reduce).bytes; }

namespace {

// Half and BFloat16 accumulate in float (reduce.cu's Acc); every other type in itself.
bool accumulatesInFloat(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16;
}

}  // namespace

size_t reduceScratchBytes(c10::ScalarType dtype, size_t nsrc, int64_t count) {
  if (nsrc <= HOCCL_REDUCE_MAX_SRCS || !accumulatesInFloat(dtype)) return 0;
  return static_cast<size_t>(count) * sizeof(float);
}

int reduceCtasFromEnv() {
  const char* v = std::getenv("HOCCL_REDUCE_CTAS");
  if (!v || !*v) return 4;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 1) throw std::invalid_argument(std::string("hoccl: HOCCL_REDUCE_CTAS must be a positive integer, got '") + v + "'");
  return static_cast<int>(std::min<long>(n, 1024));
}

ReduceOn reduceOnFromEnv() {
  const char* v = std::getenv("HOCCL_REDUCE_ON");
  std::string s = v ? v : "";
  if (s.empty()) return reduceKernelImageBytes() ? ReduceOn::Gpu : ReduceOn::Host;
  if (s == "host") return ReduceOn::Host;
  if (s != "gpu") throw std::invalid_argument("hoccl: HOCCL_REDUCE_ON must be gpu or host, got '" + s + "'");
  if (!reduceKernelImageBytes())
    throw std::runtime_error("hoccl: HOCCL_REDUCE_ON=gpu but this build has no reduction kernel "
                             "(nvcc was not found at build time); use HOCCL_REDUCE_ON=host");
  return ReduceOn::Gpu;
}

#ifdef HOCCL_WITH_CUDA

namespace {

int toKernelOp(RedOp op) {
  switch (op) {
    case RedOp::Sum: case RedOp::Avg: case RedOp::PremulSum: return HOCCL_OP_SUM;
    case RedOp::Product: return HOCCL_OP_PROD;
    case RedOp::Min: return HOCCL_OP_MIN;
    case RedOp::Max: return HOCCL_OP_MAX;
    case RedOp::BitAnd: return HOCCL_OP_BAND;
    case RedOp::BitOr: return HOCCL_OP_BOR;
    case RedOp::BitXor: return HOCCL_OP_BXOR;
  }
  return HOCCL_OP_SUM;
}

int toKernelScale(RedOp op) {
  if (op == RedOp::Avg) return HOCCL_SCALE_DIV_WORLD;
  if (op == RedOp::PremulSum) return HOCCL_SCALE_MUL_FACTOR;
  return HOCCL_SCALE_NONE;
}

}  // namespace

ReduceKernel::ReduceKernel(int device, int maxCtas) : maxCtas_(std::max(1, maxCtas)) {
  if (!reduceKernelImageBytes())
    throw std::runtime_error("hoccl: no GPU reduction kernel in this build (nvcc was not found at build "
                             "time); set HOCCL_REDUCE_ON=host");
  module_ = std::make_unique<EmbeddedModule>(EmbeddedKernel::Reduce, device);
}

ReduceKernel::~ReduceKernel() = default;

CUfunction ReduceKernel::function(c10::ScalarType dtype) {
  for (auto& [t, f] : functions_)
    if (t == dtype) return f;
  std::string name = std::string("hoccl_reduce_") + c10::toString(dtype);
  CUfunction f = nullptr;
  CUresult r = cu::driver().cuModuleGetFunction(&f, module_->get(), name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND)
    throw std::invalid_argument(std::string("hoccl: no GPU reduction for dtype ") + c10::toString(dtype));
  cu::check(r, "cuModuleGetFunction");
  functions_.emplace_back(dtype, f);
  return f;
}

int ReduceKernel::gridFor(int64_t count) const {
  int64_t needed = (count + kReduceThreads - 1) / kReduceThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, maxCtas_)));
}

namespace {

// Chaining through dst: after the first launch dst holds the running result, so a later source
// must not be dst.
void refuseLateAlias(CUdeviceptr dst, const std::vector<CUdeviceptr>& srcs) {
  for (size_t k = HOCCL_REDUCE_MAX_SRCS; k < srcs.size(); ++k)
    if (srcs[k] == dst)
      throw std::invalid_argument("hoccl: reduction source " + std::to_string(k) + " is the destination, but more than " +
                                  std::to_string(HOCCL_REDUCE_MAX_SRCS) +
                                  " sources chain launches through it: that source would be overwritten");
}

}  // namespace

void ReduceKernel::launch(CUstream stream, CUdeviceptr dst, const std::vector<CUdeviceptr>& srcs, int64_t count,
                          c10::ScalarType dtype, RedOp op, double factor, int world, bool finalize,
                          CUdeviceptr scratch) {
  if (count == 0) return;
  if (srcs.empty()) throw std::invalid_argument("hoccl: reduction without sources");
  const bool viaScratch = reduceScratchBytes(dtype, srcs.size(), count) > 0;
  if (viaScratch && !scratch)
    throw std::logic_error("hoccl: a 16-bit reduction of " + std::to_string(srcs.size()) +
                           " sources needs float scratch to round once, and none was given");
  if (!viaScratch) refuseLateAlias(dst, srcs);
  CUfunction f = function(dtype);
  // Chunks of at most MAX_SRCS sources; after the first, scratch (or dst) carries the running result.
  size_t next = 0;
  bool first = true;
  while (next < srcs.size()) {
    HocclReduceArgs a{};
    a.dst = reinterpret_cast<void*>(dst);
    a.nsrc = 0;
    if (viaScratch) {
      a.acc = reinterpret_cast<void*>(scratch);
      if (!first) a.accMode |= HOCCL_ACC_LOAD;
    } else if (!first) {
      a.src[a.nsrc++] = reinterpret_cast<const void*>(dst);
    }
    while (next < srcs.size() && a.nsrc < HOCCL_REDUCE_MAX_SRCS) a.src[a.nsrc++] = reinterpret_cast<const void*>(srcs[next++]);
    a.count = count;
    a.op = toKernelOp(op);
    const bool last = next == srcs.size();
    if (viaScratch && !last) a.accMode |= HOCCL_ACC_STORE;
    a.scale = (finalize && last) ? toKernelScale(op) : HOCCL_SCALE_NONE;
    a.world = world;
    a.factor = factor;
    void* params[] = {&a};
    cu::check(cu::driver().cuLaunchKernel(f, gridFor(count), 1, 1, kReduceThreads, 1, 1, 0, stream, params, nullptr),
              "cuLaunchKernel (reduction)");
    first = false;
  }
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
