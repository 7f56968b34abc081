// The in-place all_reduce that inference code calls as a torch operator,
// torch.ops.hoccl.all_reduce_(tensor, group, op): tensor-parallel decoding calls it several
// times per token on small tensors, where c10d's per-call path (Python wrapper, dispatcher
// round trip, Work and future objects) costs as much as the data movement. The operator goes
// from the dispatcher straight to the group's collective on the caller's thread.
#include "backend/direct_allreduce.h"

#include <ATen/core/op_registration/op_registration.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

#include "backend/collective.h"
#include "backend/cuda_staging.h"
#include "backend/multihost/host_span.h"
#include "backend/tensor_args.h"
#include "transport/shm/futex_wait.h"

namespace hoccl {
namespace {

// Handles name groups inside the operator's schema (an int: schemas cannot carry a backend
// object). Weak references: a destroyed group makes the handle fail, never dangle.
std::mutex registryMutex;
std::unordered_map<int64_t, c10::weak_intrusive_ptr<c10d::Backend>> registry;
int64_t nextHandle = 1;

c10::intrusive_ptr<c10d::Backend> groupOf(int64_t handle) {
  std::lock_guard<std::mutex> lock(registryMutex);
  auto it = registry.find(handle);
  TORCH_CHECK(it != registry.end(), "hoccl all_reduce_: no hoccl group has handle ", handle,
              " (take it from hoccl_backend.direct_handle(group))");
  auto pg = it->second.lock();
  TORCH_CHECK(pg, "hoccl all_reduce_: the group of handle ", handle, " was destroyed");
  return pg;
}

// Compared in place: the operator is called per token, and a std::string per call shows.
c10d::ReduceOp reduceOpNamed(c10::string_view name) {
  static constexpr std::pair<c10::string_view, c10d::ReduceOp::RedOpType> ops[] = {
      {"sum", c10d::ReduceOp::SUM}, {"avg", c10d::ReduceOp::AVG}, {"max", c10d::ReduceOp::MAX},
      {"min", c10d::ReduceOp::MIN}, {"product", c10d::ReduceOp::PRODUCT}};
  for (const auto& [known, type] : ops)
    if (name == known) return c10d::ReduceOp(type);
  TORCH_CHECK(false, "hoccl all_reduce_: unknown op '", std::string(name), "' (sum, avg, max, min, product)");
}

void allReduceOp(at::Tensor& tensor, int64_t group, c10::string_view op) {
  const c10::intrusive_ptr<c10d::Backend> pg = groupOf(group);
  auto* hoccl = dynamic_cast<ProcessGroupHOCCL*>(pg.get());
  TORCH_CHECK(hoccl, "hoccl all_reduce_: handle ", group, " names no hoccl group");
  hoccl->allreduceNow(tensor, reduceOpNamed(op));
}

// Under torch.compile's fake tensors the operator only mutates its argument in place.
void allReduceFake(at::Tensor&, int64_t, c10::string_view) {}

}  // namespace

int64_t directHandle(const c10::intrusive_ptr<c10d::Backend>& pg) {
  std::lock_guard<std::mutex> lock(registryMutex);
  for (auto& [handle, weak] : registry) {
    if (weak.lock() == pg) return handle;
  }
  int64_t handle = nextHandle++;
  registry.emplace(handle, c10::weak_intrusive_ptr<c10d::Backend>(pg));
  return handle;
}

void ProcessGroupHOCCL::allreduceNow(const at::Tensor& tensor, const c10d::ReduceOp& reduceOp) {
  if (span_) {
    // A group spanning hosts runs its all_reduce and waits: its time is the network's, not c10d's.
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduceOp;
    opts.asyncOp = false;
    allreduce(tensors, opts)->wait();
    return;
  }
  TORCH_CHECK(tensor.device().is_cpu() && tensor.layout() == at::kStrided, "hoccl all_reduce_ on rank ",
              rank_, ": the direct path takes dense CPU tensors (got ", tensor.device(), ", ",
              tensor.layout(), "); use dist.all_reduce for others");
  double factor;
  RedOp op = toRedOp(reduceOp, &factor, "all_reduce");
  checkTensor(tensor, "all_reduce", rank_);
  checkReduceArgs(tensor, op, "all_reduce", rank_);
  Staged s(tensor);
  auto body = [this, s, op, factor] {
    allreduceTensor(s.work, op, factor);
    s.writeBack();
  };
  // With nothing queued ahead it runs here, spinning as synchronous ops do, without the Work and
  // the queued body an asynchronous op needs (a fifth of a 4 KB op's time on this path).
  if (!staging::capturing(this)) {
    SpinAtLeast spin{callerSpin()};
    if (queue_.runIfIdle([&] {
          issued_.fetch_add(1);
          body();
        }))
      return;
  }
  enqueue(c10d::OpType::ALLREDUCE, {tensor}, body, nbytes(tensor), /*callerWaits=*/true)->wait();
}

}  // namespace hoccl

TORCH_LIBRARY(hoccl, m) {
  m.def("all_reduce_(Tensor(a!) tensor, int group, str op='sum') -> ()");
}

TORCH_LIBRARY_IMPL(hoccl, CPU, m) { m.impl("all_reduce_", &hoccl::allReduceOp); }

TORCH_LIBRARY_IMPL(hoccl, Meta, m) { m.impl("all_reduce_", &hoccl::allReduceFake); }
