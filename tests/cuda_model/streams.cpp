// Streams, events and stream memory operations of the CPU driver model (see model.h).
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "model.h"

namespace model {

void randomDelay() {
  static const int maxUs = envInt("HOCCL_MODEL_MAX_DELAY_US", 200);
  if (maxUs <= 0) return;
  thread_local std::mt19937 rng(static_cast<unsigned>(envInt("HOCCL_MODEL_SEED", 0)) ^
                                static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  // A quarter of the operations start late: enough to reorder streams against each other.
  if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (maxUs + 1)));
}

Stream::Stream() { std::thread([this] { loop(); }).detach(); }

void Stream::loop() {
  for (;;) {
    std::function<void()> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || destroyed_; });
      if (queue_.empty()) return;  // destroyed and drained; the object is never freed
      op = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    randomDelay();
    op();
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    cv_.notify_all();
  }
}

void Stream::push(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
}

void Stream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !running_; });
}

bool Stream::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() && !running_;
}

void Stream::destroy() {
  // Documented: returns at once; resources go once the stream's work has completed.
  {
    std::lock_guard<std::mutex> lock(mu_);
    destroyed_ = true;
  }
  cv_.notify_all();
}

bool isLegacyDefault(CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY; }

Stream* streamOf(CUstream s) {
  static Stream* defaultStream = new Stream();  // never freed: threads may outlive statics
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return defaultStream;
  return reinterpret_cast<Stream*>(s);
}

CUresult enqueue(CUstream s, std::function<void()> op) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) && !hasCurrentContext())
    return CUDA_ERROR_INVALID_CONTEXT;
  Stream* st = streamOf(s);
  // Work issued to a capturing stream goes into the graph being built, not to the device.
  if (st->captureStatus.load() != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_SUCCESS;
  st->push(std::move(op));
  return CUDA_SUCCESS;
}

namespace {

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // highest record the stream reached
  std::chrono::steady_clock::time_point at;
  bool timing = true;
};

Event* eventOf(CUevent e) { return reinterpret_cast<Event*>(e); }

// The documented wait conditions of cuStreamWaitValue32/64.
template <typename T, typename S>
bool satisfied(T now, T value, unsigned flags) {
  switch (flags & 0x3u) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<S>(now - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return now == value;
    case CU_STREAM_WAIT_VALUE_AND: return (now & value) != 0;
    default: return static_cast<T>(~(now | value)) != 0;  // NOR
  }
}

template <typename T, typename S>
void waitOn(CUdeviceptr addr, T value, unsigned flags) {
  auto* word = reinterpret_cast<std::atomic<T>*>(addr);
  for (int spin = 0; !satisfied<T, S>(word->load(std::memory_order_acquire), value, flags); ++spin)
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

template <typename T>
void writeTo(CUdeviceptr addr, T value) {
  // The default write is fenced: everything the stream did before is visible first.
  reinterpret_cast<std::atomic<T>*>(addr)->store(value, std::memory_order_seq_cst);
}

bool validWord(CUdeviceptr addr, size_t bytes) { return addr % bytes == 0 && isDevice(addr, bytes); }

}  // namespace
}  // namespace model

using namespace model;

extern "C" {

CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ph || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
  *ph = reinterpret_cast<CUstream>(new Stream());
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream s) {
  if (isLegacyDefault(s) || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  streamOf(s)->destroy();
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Stream* st = streamOf(s);
  if (st->captureStatus.load() != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  st->synchronize();
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream s) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Stream* st = streamOf(s);
  if (st->captureStatus.load() != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return st->idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  *status = static_cast<CUstreamCaptureStatus>(streamOf(s)->captureStatus.load());
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* ph, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hasCurrentContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ph) return CUDA_ERROR_INVALID_VALUE;
  auto* e = new Event();
  e->timing = !(flags & CU_EVENT_DISABLE_TIMING);
  *ph = reinterpret_cast<CUevent>(e);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;  // documented to be safe while pending; the model never frees events
}

CUresult cuEventRecord(CUevent h, CUstream s) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  Event* e = eventOf(h);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = ++e->recorded;
  }
  CUresult r = enqueue(s, [e, gen] {
    {
      std::lock_guard<std::mutex> lock(e->mu);
      if (gen > e->completed) e->completed = gen;
      e->at = std::chrono::steady_clock::now();
    }
    e->cv.notify_all();
  });
  if (r != CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(e->mu);
    --e->recorded;
  }
  return r;
}

CUresult cuEventQuery(CUevent h) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  Event* e = eventOf(h);
  std::lock_guard<std::mutex> lock(e->mu);
  return e->completed >= e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent h) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  Event* e = eventOf(h);
  std::unique_lock<std::mutex> lock(e->mu);
  const uint64_t target = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= target; });
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  if (!ms || !start || !end) return CUDA_ERROR_INVALID_VALUE;
  Event* a = eventOf(start);
  Event* b = eventOf(end);
  std::scoped_lock lock(a->mu, b->mu);
  if (!a->timing || !b->timing) return CUDA_ERROR_INVALID_HANDLE;
  if (a->recorded == 0 || b->recorded == 0 || a->completed < a->recorded || b->completed < b->recorded)
    return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream s, CUevent h, unsigned int flags) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  Event* e = eventOf(h);
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = e->recorded;  // the most recent record at the time of this call
  }
  if (target == 0) return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
  return enqueue(s, [e, target] {
    std::unique_lock<std::mutex> lock(e->mu);
    e->cv.wait(lock, [&] { return e->completed >= target; });
  });
}

CUresult cuStreamWriteValue32(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  if (CUresult r = injected("MEMOPS"); r != CUDA_SUCCESS) return r;
  if (!validWord(addr, 4) || (flags & ~static_cast<unsigned>(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)))
    return CUDA_ERROR_INVALID_VALUE;
  return enqueue(s, [addr, value] { writeTo<uint32_t>(addr, value); });
}

CUresult cuStreamWaitValue32(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  if (CUresult r = injected("MEMOPS"); r != CUDA_SUCCESS) return r;
  if (!validWord(addr, 4) || (flags & ~(0x3u | CU_STREAM_WAIT_VALUE_FLUSH))) return CUDA_ERROR_INVALID_VALUE;
  return enqueue(s, [addr, value, flags] { waitOn<uint32_t, int32_t>(addr, value, flags); });
}

CUresult cuStreamBatchMemOp(CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops, unsigned int flags) {
  if (CUresult r = injected("MEMOPS"); r != CUDA_SUCCESS) return r;
  if (flags != 0 || count >= 256 || (count > 0 && !ops)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUstreamBatchMemOpParams> copy(ops, ops + count);
  for (const auto& op : copy) {
    switch (op.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        if (!validWord(op.waitValue.address, 4)) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        if (!validWord(op.waitValue.address, 8)) return CUDA_ERROR_INVALID_VALUE;
        break;
      default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  // Documented: the operations are enqueued in the order they appear in the array.
  return enqueue(s, [copy] {
    for (const auto& op : copy) {
      if (op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32)
        waitOn<uint32_t, int32_t>(op.waitValue.address, op.waitValue.value, op.waitValue.flags);
      else if (op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64)
        waitOn<uint64_t, int64_t>(op.waitValue.address, op.waitValue.value64, op.waitValue.flags);
      else if (op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32)
        writeTo<uint32_t>(op.writeValue.address, op.writeValue.value);
      else
        writeTo<uint64_t>(op.writeValue.address, op.writeValue.value64);
    }
  });
}

// Test control: puts a stream into (or out of) the capture state cuStreamBeginCapture would.
int hoccl_model_set_capture(CUstream s, int status) {
  streamOf(s)->captureStatus.store(status);
  return 0;
}

}  // extern "C"
