// The SMs of the CPU driver model: per device, kSmCount SMs with thread, block and register slots.
// A block is resident on one SM while it runs; a kernel whose blocks do not all fit runs in waves,
// as on a GPU. Work that needs no SM (copies, stream memory operations) never waits here.
// Registers are allocated per warp in units of kRegUnit (the granularity of NVIDIA's occupancy
// calculation for sm_90), HOCCL_MODEL_KERNEL_REGS per thread for every model kernel.
#include <algorithm>
#include <map>
#include <vector>

#include "model.h"

namespace model {
namespace {

struct Sm {
  int freeThreads = kThreadsPerSm;
  int freeBlocks = kBlocksPerSm;
  int freeRegs = kRegsPerSm;
};

int warpsOf(int threads) { return (threads + 31) / 32; }

struct Device {
  std::vector<Sm> sms = std::vector<Sm>(kSmCount);
  std::condition_variable freed;
};

std::mutex mu;

Device& device(int index) {
  static auto* devices = new std::map<int, Device>();  // never freed: stream threads outlive statics
  return (*devices)[index];
}

// Caller holds mu. Places blocks first-fit, SM by SM; returns each block's SM.
std::vector<int> place(Device& d, int blocks, int threads) {
  std::vector<int> where;
  for (int i = 0; i < kSmCount; ++i) {
    Sm& sm = d.sms[i];
    const int regs = blockRegs(threads);
    while (static_cast<int>(where.size()) < blocks && sm.freeThreads >= threads && sm.freeBlocks > 0 &&
           sm.freeRegs >= regs) {
      sm.freeThreads -= threads;
      sm.freeRegs -= regs;
      --sm.freeBlocks;
      where.push_back(i);
    }
  }
  return where;
}

}  // namespace

std::vector<int> placeBlocks(int index, int blocks, int threads) {
  std::unique_lock<std::mutex> lock(mu);
  Device& d = device(index);
  std::vector<int> where;
  d.freed.wait(lock, [&] { return !(where = place(d, blocks, threads)).empty(); });
  return where;
}

void releaseBlocks(int index, const std::vector<int>& sms, int threads) {
  Device* d;
  {
    std::lock_guard<std::mutex> lock(mu);
    d = &device(index);  // map nodes never move
    for (int i : sms) {
      d->sms[i].freeThreads += threads;
      d->sms[i].freeRegs += blockRegs(threads);
      ++d->sms[i].freeBlocks;
    }
  }
  d->freed.notify_all();
}

int kernelRegs() {
  static const int regs = envInt("HOCCL_MODEL_KERNEL_REGS", 32);
  return regs;
}

int blockRegs(int threads) {
  const int perWarp = (kernelRegs() * 32 + kRegUnit - 1) / kRegUnit * kRegUnit;
  return perWarp * warpsOf(threads);
}

int blocksPerSm(int threads) {
  return std::min({kBlocksPerSm, kThreadsPerSm / (warpsOf(threads) * 32), kRegsPerSm / blockRegs(threads)});
}

bool d2dOnSms() {
  static const bool on = envInt("HOCCL_MODEL_D2D_ON_SMS", 0) != 0;
  return on;
}

}  // namespace model
