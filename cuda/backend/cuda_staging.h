// The host-staging machinery that moves CUDA tensors through a CPU algorithm, shared by the
// single-host group (cuda_tensors.cpp) and the multi-host group (multihost/cuda_staging.cpp):
// the comm stream ordered after the caller's stream, pinned host mirrors, the device checks.
// Only c10's device-generic API is used here, so this compiles without CUDA headers too.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace hoccl::staging {

// The CUDA device of an op's tensors, or none when every tensor is on the CPU. Raises, naming
// the op and the rank, when CUDA and CPU tensors are mixed or the CUDA ones sit on two devices.
std::optional<c10::Device> cudaDeviceOf(const std::vector<at::Tensor>& tensors, const char* op, int rank);

// The group's comm stream (taken from torch's pool on first use); one device per group.
c10::Stream commStreamOn(std::optional<c10::Stream>& comm, c10::Device device, int rank);

// The comm stream waits on an event recorded on the caller's current stream (so kernels that
// wrote the inputs are seen); the CUDA tensors are record_stream()-ed on it. Refuses a caller
// stream under CUDA graph capture, naming `op`.
void orderAfterCaller(c10::Stream comm, const std::vector<at::Tensor>& tensors, const std::string& op);

// A pinned host tensor of t's shape and dtype.
at::Tensor pinnedLike(const at::Tensor& t);

// A send's or recv's host mirror of t, ordered after the caller's stream. For a send the D2H
// runs now on the comm stream and the host waits for it (the bytes must be there before the
// transfer is posted).
at::Tensor hostMirror(c10::Stream comm, const at::Tensor& t, bool copyIn);

// Pinned host mirrors of an op's tensors: a tensor that is both input and output (in-place ops)
// gets one mirror; undefined tensors stay undefined.
class HostMirrors {
 public:
  at::Tensor of(const at::Tensor& t);
  std::vector<at::Tensor> of(const std::vector<at::Tensor>& ts);

 private:
  std::unordered_map<c10::TensorImpl*, at::Tensor> mirror_;
};

// Copy-engine copies on the current stream, element by element (undefined entries skipped).
void copyAll(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src);

// A recv's last step: H2D of the arrived host bytes on the comm stream; returns the end event
// Work.wait() makes the caller's stream wait on. Blocks until the copy is done (the host mirror
// may die right after).
std::shared_ptr<c10::Event> copyBackAfterRecv(const at::Tensor& user, const at::Tensor& host, c10::Stream comm);

// A CUDA op through host mirrors runs the CPU op's entry point over the mirrors twice: on the
// caller's thread, where its checks raise, and on the worker after the D2H, where what it
// prepares before it queues (gather's copy of the input across hosts, scatter's packed inputs)
// reads bytes that are there. Both times the group's enqueue hands each body it would queue to
// the capture instead. `owner` is the group whose enqueue captures; `run` calls the entry point.
using Body = std::function<void()>;
std::vector<Body> captureBodies(const void* owner, const std::function<void()>& run);
// The first run, on the caller's thread: raises what the entry point raises, and raises naming
// the op and the rank when it queued nothing (the outputs would get the mirrors' garbage).
void checkOnMirrors(const void* owner, const std::function<void()>& run, const std::string& op, int rank);
// Is `owner` capturing on this thread? In its enqueue, `captured` takes the body when it is.
bool capturing(const void* owner);
bool captured(const void* owner, Body& body);

// The body of a host-staged op on the comm stream: D2H of the inputs into their mirrors, the CPU
// op rerun over the mirrors with its captured bodies run in order, H2D of the outputs. The host
// waits for the H2D, since the pinned mirrors die with the caller's body.
void runViaMirrors(c10::Stream comm, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                   const std::vector<at::Tensor>& hostIns, const std::vector<at::Tensor>& hostOuts,
                   const void* owner, const std::function<void()>& cpuOp);

}  // namespace hoccl::staging
