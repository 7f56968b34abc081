#include "transport/ce/ce_sm_check.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>

#ifdef HOCCL_WITH_CUDA
#include "transport/ce/ce_copy.h"
#include "transport/ce/ce_host_memory.h"
#include "transport/ce/ce_spin.h"
#endif

namespace hoccl {

#ifndef HOCCL_WITH_CUDA

SmCheckReport runSmCheck(int device, const SmCheckOptions&) {
  SmCheckReport r;
  r.device = device;
  r.errors.push_back(cu::loadError());
  return r;
}

#else  // HOCCL_WITH_CUDA

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

double microsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// RAII stream and event of the current context.
class Stream {
 public:
  Stream() { cu::check(cu::driver().cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"); }
  ~Stream() { cu::driver().cuStreamDestroy(s_); }  // documented safe with work still queued
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return s_; }

 private:
  CUstream s_ = nullptr;
};

class Event {
 public:
  Event() { cu::check(cu::driver().cuEventCreate(&e_, CU_EVENT_DISABLE_TIMING), "cuEventCreate"); }
  ~Event() { cu::driver().cuEventDestroy(e_); }  // documented safe while pending
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return e_; }

 private:
  CUevent e_ = nullptr;
};

// Polls `e` until it completes, fails, or `deadline` passes (then CUDA_ERROR_NOT_READY).
CUresult pollEvent(CUevent e, Clock::time_point deadline) {
  for (;;) {
    CUresult r = cu::driver().cuEventQuery(e);
    if (r != CUDA_ERROR_NOT_READY || Clock::now() > deadline) return r;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::string resultText(CUresult r, const char* what) {
  try {
    cu::check(r, what);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The host side of the spinner's flags: word 0 releases every block, words 1.. are per-block states.
class SpinFlags {
 public:
  SpinFlags(int blocks, int device) : blocks_(blocks), memory_(sizeof(unsigned) * (blocks + 1), device) {}
  HocclSpinArgs args(double limitS) const {
    HocclSpinArgs a{};
    a.release = reinterpret_cast<const unsigned*>(memory_.devicePtr(0));
    a.state = reinterpret_cast<unsigned*>(memory_.devicePtr(sizeof(unsigned)));
    a.limitNs = static_cast<unsigned long long>(limitS * 1e9);
    a.pollNs = 20000;  // 20 us: one PCIe read per block per poll keeps the bus free for the copies
    return a;
  }
  int count(unsigned state) const {
    int n = 0;
    for (int b = 0; b < blocks_; ++b) n += word(b + 1) == state;
    return n;
  }
  void release() {
    *static_cast<volatile unsigned*>(memory_.hostPtr(0)) = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

 private:
  unsigned word(int i) const { return static_cast<volatile unsigned*>(memory_.hostPtr(0))[i]; }
  int blocks_;
  PinnedHostBuffer memory_;
};

// One kind of copy the transport makes, with its own stream so a copy stuck behind the spinner
// cannot hold back the next one.
struct Direction {
  const char* name;
  const char* usedBy;
  std::function<const char*(CUstream)> issue;  // returns the driver call that carried the copy
  SmCheckRow row;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Event> done;
  Clock::time_point issuedAt;
  bool pending = false;
};

struct Buffers {
  std::unique_ptr<DeviceBuffer> a, b;
  std::unique_ptr<PinnedHostBuffer> host;
};

std::vector<Direction> directions(const Buffers& m, size_t bytes) {
  const CUdeviceptr a = m.a->ptr(), b = m.b->ptr();
  void* host = m.host->hostPtr();
  std::vector<Direction> d;
  d.push_back({"d2h", "host", [=](CUstream s) {
                 ceCopyToHost(s, host, a, bytes);
                 return "cuMemcpyDtoHAsync";
               }});
  d.push_back({"h2d", "host", [=](CUstream s) {
                 ceCopyFromHost(s, b, host, bytes);
                 return "cuMemcpyHtoDAsync";
               }});
  // Exactly as the p2p path issues it (the hinted batch copy from CUDA 13.1, else cuMemcpyAsync).
  d.push_back({"d2d", "p2p", [=](CUstream s) { return ceCopyCallName(ceCopyAsync(s, b, a, bytes)); }});
  // Both variants on their own, whatever the driver version, for comparison.
  d.push_back({"d2d_memcpy", "", [=](CUstream s) { return ceCopyCallName(ceCopyAsync(s, b, a, bytes, false)); }});
  d.push_back({"d2d_batch", "", [=](CUstream s) {
                 if (!cu::driver().cuMemcpyBatchAsync)
                   throw std::runtime_error("cuMemcpyBatchAsync is not in this driver (or it is older than cuda.h)");
                 cu::check(ceBatchCopyAsync(s, b, a, bytes), "cuMemcpyBatchAsync");
                 return ceCopyCallName(CeCopyCall::Batch);
               }});
  for (auto& x : d) {
    x.row.direction = x.name;
    x.row.usedBy = x.usedBy;
    x.row.bytes = bytes;
  }
  return d;
}

// Issues the copy and records the event behind it; false (row.error set) when a call failed.
bool issue(Direction& d) {
  try {
    d.issuedAt = Clock::now();
    d.row.call = d.issue(d.stream->get());
    cu::check(cu::driver().cuEventRecord(d.done->get(), d.stream->get()), "cuEventRecord");
    d.pending = true;
    return true;
  } catch (const std::exception& e) {
    d.row.error = e.what();
    return false;
  }
}

// Outside the measurement: first-use costs (lazy loading, mappings) must not look like waiting.
void warmUp(std::vector<Direction>& dirs, double deadlineS) {
  for (auto& d : dirs) issue(d);
  const auto deadline = after(deadlineS);
  for (auto& d : dirs) {
    if (!d.pending) continue;
    CUresult r = pollEvent(d.done->get(), deadline);
    d.pending = r != CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) d.row.error = "warm-up: " + resultText(r, "cuEventQuery (copy before the spinner)");
  }
}

bool waitResident(const SpinFlags& flags, int blocks, double deadlineS, int* resident) {
  const auto deadline = after(deadlineS);
  for (;;) {
    *resident = flags.count(HocclSpinRunning);
    if (*resident == blocks) return true;
    if (Clock::now() > deadline || flags.count(HocclSpinTimedOut) > 0) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// One copy while the SMs are held: issue, then poll its event until the copy deadline.
void measure(Direction& d, const SpinFlags& flags, int blocks, double deadlineS) {
  if (!d.row.error.empty() || !issue(d)) return;
  CUresult r = pollEvent(d.done->get(), after(deadlineS));
  if (r == CUDA_ERROR_NOT_READY) return;  // still pending: it waits for SMs (resolved after release)
  d.pending = false;
  if (r != CUDA_SUCCESS) {
    d.row.error = resultText(r, "cuEventQuery (copy)");
    return;
  }
  d.row.microseconds = microsSince(d.issuedAt);
  d.row.completed = true;
  // Only a verdict if the spinner still held every SM when the copy was seen done.
  d.row.completedWhileSmsFull = flags.count(HocclSpinRunning) == blocks;
  if (!d.row.completedWhileSmsFull)
    d.row.error = "the spinner no longer held every SM when the copy was seen complete (kernel time limit?)";
}

// After the release: every pending copy and the spinner must finish before the deadline.
bool drain(std::vector<Direction>& dirs, CUstream spin, double deadlineS, std::vector<std::string>& errors) {
  const auto deadline = after(deadlineS);
  bool all = true;
  for (auto& d : dirs) {
    if (!d.pending) continue;
    CUresult r = pollEvent(d.done->get(), deadline);
    if (r == CUDA_SUCCESS) {
      d.pending = false;
      d.row.completed = true;
      d.row.microseconds = microsSince(d.issuedAt);
    } else {
      d.row.error = resultText(r, "cuEventQuery (copy after the release)");
      all = false;
    }
  }
  for (;;) {
    CUresult r = cu::driver().cuStreamQuery(spin);
    if (r == CUDA_SUCCESS) break;
    if (r != CUDA_ERROR_NOT_READY || Clock::now() > deadline) {
      errors.push_back("spin kernel did not finish after the release: " + resultText(r, "cuStreamQuery (spin stream)"));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return all;
}

bool anyPeerAccess(int device) {
  const auto& api = cu::driver();
  int count = 0;
  CUdevice self, other;
  cu::check(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  cu::check(api.cuDeviceGet(&self, device), "cuDeviceGet");
  for (int i = 0; i < count; ++i) {
    if (i == device) continue;
    int can = 0;
    cu::check(api.cuDeviceGet(&other, i), "cuDeviceGet");
    cu::check(api.cuDeviceCanAccessPeer(&can, self, other), "cuDeviceCanAccessPeer");
    if (can) return true;
  }
  return false;
}

void fillShape(SmCheckReport& rep, const SpinShape& s) {
  rep.sms = s.sms;
  rep.threadsPerBlock = s.threadsPerBlock;
  rep.blocksPerSm = s.blocksPerSm;
  rep.maxThreadsPerSm = s.maxThreadsPerSm;
  rep.occupancySource = s.occupancySource;
  rep.blocks = s.blocks();
}

// The part that owns device resources. Memory a pending copy or the spinner may still touch is
// leaked rather than freed when the drain deadline passes.
void runWithContext(int device, const SmCheckOptions& o, SmCheckReport& rep) {
  rep.driverVersion = cu::driver().driverVersion;
  rep.peerAccess = anyPeerAccess(device);
  SpinKernel kernel(device);
  const SpinShape shape = kernel.shape();
  fillShape(rep, shape);
  Buffers mem{std::make_unique<DeviceBuffer>(o.bytes, device), std::make_unique<DeviceBuffer>(o.bytes, device),
              std::make_unique<PinnedHostBuffer>(o.bytes, device)};
  auto dirs = directions(mem, o.bytes);
  for (auto& d : dirs) {
    d.stream = std::make_unique<Stream>();
    d.done = std::make_unique<Event>();
  }
  warmUp(dirs, o.copyDeadlineS * dirs.size() + o.startDeadlineS);
  auto flags = std::make_unique<SpinFlags>(shape.blocks(), device);
  Stream spin;
  // The kernel's own limit outlasts everything the host waits for before it releases the flag.
  const double limitS = o.startDeadlineS + o.copyDeadlineS * dirs.size() + 2.0;
  try {
    kernel.launch(spin.get(), flags->args(limitS), shape);
    rep.smsFull = waitResident(*flags, shape.blocks(), o.startDeadlineS, &rep.blocksResident) && shape.fillsEverySm();
    if (!rep.smsFull)
      rep.errors.push_back("SMs not full: " + std::to_string(rep.blocksResident) + " of " +
                           std::to_string(shape.blocks()) + " spin blocks resident (" +
                           std::to_string(shape.threadsPerBlock) + " threads each, " +
                           std::to_string(shape.maxThreadsPerSm) + " per SM); is another process using the GPU?");
    else
      for (auto& d : dirs) measure(d, *flags, shape.blocks(), o.copyDeadlineS);
  } catch (const std::exception& e) {
    rep.errors.push_back(e.what());
  }
  flags->release();
  // Released blocks leave within one poll interval; a spinner that does not is reported (and
  // still ends at its own limit), its flags leaked rather than unmapped under it.
  const bool drained = drain(dirs, spin.get(), o.drainDeadlineS, rep.errors);
  rep.blocksTimedOut = flags->count(HocclSpinTimedOut);
  for (auto& d : dirs) rep.rows.push_back(d.row);
  if (!drained) {
    rep.errors.push_back("work still pending after the drain deadline: its memory is leaked, not freed");
    flags.release();
    mem.a.release();
    mem.b.release();
    mem.host.release();
  }
}

}  // namespace

SmCheckReport runSmCheck(int device, const SmCheckOptions& options) {
  SmCheckReport rep;
  rep.device = device;
  const std::string loadError = cu::loadError();
  if (!loadError.empty()) {
    rep.errors.push_back(loadError);
    return rep;
  }
  try {
    cu::ContextGuard guard(device);
    runWithContext(device, options, rep);
  } catch (const std::exception& e) {
    rep.errors.push_back(e.what());
  }
  return rep;
}

#endif  // HOCCL_WITH_CUDA

}  // namespace hoccl
