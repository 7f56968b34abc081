// A CPU model of the CUDA driver entry points hoccl loads (HOCCL_LIBCUDA=<this library>).
//
// It implements what the driver documentation (cuda.h) promises, and nothing more:
//  * streams are FIFO queues, each drained by its own worker thread after a random delay, so
//    work runs asynchronously to the caller and streams interleave arbitrarily;
//  * events complete when their stream reaches them; cuStreamWaitEvent waits for the record
//    that was most recent when it was called;
//  * "device memory" (cuMemAlloc) is a memfd mapping, so cuIpcGetMemHandle can export it and
//    another process can map it (cuIpcOpenMemHandle, through /proc/<pid>/fd);
//  * cuMemHostRegister of a shared mapping gives a device pointer that is a second mapping of
//    the same pages at a different address (the documentation does not promise host and device
//    addresses agree), so mixing them up fails here;
//  * stream memory operations act on device addresses only, with the documented conditions
//    (cyclic GEQ, EQ, AND, NOR);
//  * pageable host memory follows the documented copy rules (D2H returns when done, H2D returns
//    once the source was staged);
//  * the only kernels are hoccl's reductions and the sm_free check's spin kernel, found by name
//    and run on the CPU from their argument struct;
//  * each device has SMs with thread, block and register slots (the device attributes): a
//    kernel's blocks hold slots while they run and wait for free ones, as resident blocks do on
//    a GPU; cuOccupancyMaxActiveBlocksPerMultiprocessor answers from the same slots and the
//    function's attributes (__launch_bounds__, registers), and cuLaunchKernel refuses blocks
//    larger than the function allows;
//  * cuMemHostRegister populates the pages it locks, and fails with CUDA_ERROR_OUT_OF_MEMORY
//    where they cannot be backed;
//  * cuGetProcAddress_v2 hands out each entry point by base name and CUDA version (proc.cpp).
// Knobs (environment): HOCCL_MODEL_DRIVER_VERSION (13000), HOCCL_MODEL_DEVICES (1),
// HOCCL_MODEL_MAX_DELAY_US (200), HOCCL_MODEL_SEED, HOCCL_MODEL_KERNEL_REGS (32),
// HOCCL_MODEL_FAIL_<WHAT>=<CUresult number> for REGISTER, IPC_GET, IPC_OPEN, MEMOPS, INIT,
// PROC_ADDRESS (failure injection), and
// HOCCL_MODEL_D2D_ON_SMS=1: same-device device-to-device copies run as a kernel (one block on the
// SMs), which the documentation allows (it never promises a copy engine for them and calls the
// batch-copy overlap flag a hint); default 0: they run on a copy engine like every other copy.
#pragma once
#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace model {

// ---- process state -------------------------------------------------------------------------
bool initialized();
int envInt(const char* name, int fallback);
// CUDA_SUCCESS, or the code HOCCL_MODEL_FAIL_<what> asks to inject.
CUresult injected(const char* what);
void count(const char* counter, long long delta = 1);
// Entry points that need a current context return CUDA_ERROR_INVALID_CONTEXT without one.
bool hasCurrentContext();
[[noreturn]] void fault(const std::string& why);  // an asynchronous device fault: abort loudly

// ---- devices and SMs ------------------------------------------------------------------------
constexpr int kSmCount = 132;
constexpr int kThreadsPerSm = 2048;
constexpr int kBlocksPerSm = 32;
constexpr int kThreadsPerBlock = 1024;
constexpr int kRegsPerSm = 65536;
constexpr int kRegUnit = 256;  // registers are allocated per warp in multiples of this
// HOCCL_MODEL_KERNEL_REGS (32): registers per thread of every model kernel.
int kernelRegs();
// Registers one block of `threads` holds, and how many such blocks fit on one SM.
int blockRegs(int threads);
int blocksPerSm(int threads);
// The device of the calling thread's current context (0 without one).
int currentDevice();
// Places up to `blocks` blocks of `threads` threads on `device`'s SMs, waiting until at least one
// fits; returns the SM of each resident block (give them back with releaseBlocks).
std::vector<int> placeBlocks(int device, int blocks, int threads);
void releaseBlocks(int device, const std::vector<int>& sms, int threads);
// HOCCL_MODEL_D2D_ON_SMS: same-device D2D copies need an SM block.
bool d2dOnSms();

// ---- streams -------------------------------------------------------------------------------
class Stream {
 public:
  Stream();
  void push(std::function<void()> op);
  void synchronize();
  bool idle();
  void destroy();
  std::atomic<int> captureStatus{CU_STREAM_CAPTURE_STATUS_NONE};

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool destroyed_ = false;
};

// The stream behind a handle (0 and the legacy/per-thread handles map to one default stream).
Stream* streamOf(CUstream s);
bool isLegacyDefault(CUstream s);
// CUDA_SUCCESS, or why `s` cannot take work now.
CUresult enqueue(CUstream s, std::function<void()> op);
void randomDelay();

// ---- memory --------------------------------------------------------------------------------
// True when [p, p + bytes) lies inside one device-addressable range: a cuMemAlloc allocation,
// an opened IPC mapping, or the device alias of a registered host range.
bool isDevice(CUdeviceptr p, size_t bytes);
// True for device memory proper: a cuMemAlloc allocation or an opened IPC mapping (not host memory
// mapped for the device).
bool isDeviceMemory(CUdeviceptr p, size_t bytes);
// True when [p, p + bytes) lies inside one registered (page-locked) host range, by host address.
bool isPinnedHost(const void* p, size_t bytes);
// Enqueues a copy with the documented pageable-memory rules; both ends already validated.
CUresult copyAsync(void* dst, const void* src, size_t bytes, CUstream s, bool dstDevice, bool srcDevice);

}  // namespace model
