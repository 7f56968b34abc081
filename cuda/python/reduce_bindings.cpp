// _C.reduce_isas and _C._reduce_into_on: reduceInto on a named instruction set (common/reduce_kernels.h).
#include "python/reduce_bindings.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "common/reduce_kernels.h"

namespace py = pybind11;
using hoccl::ReduceIsa;
using hoccl::RedOp;

namespace {

constexpr ReduceIsa kIsas[] = {ReduceIsa::Portable, ReduceIsa::Avx2, ReduceIsa::Avx512};

ReduceIsa parseIsa(const std::string& name) {
  for (ReduceIsa isa : kIsas)
    if (name == hoccl::reduceIsaName(isa)) return isa;
  throw py::value_error("_reduce_into_on: unknown instruction set '" + name + "' (portable, avx2 or avx512)");
}

// c10d's spelling, as redOpName gives it ("SUM", "PREMUL_SUM", ...).
RedOp parseRedOp(const std::string& name) {
  for (int i = static_cast<int>(RedOp::Sum); i <= static_cast<int>(RedOp::BitXor); ++i)
    if (name == hoccl::redOpName(static_cast<RedOp>(i))) return static_cast<RedOp>(i);
  throw py::value_error("_reduce_into_on: unknown reduce op '" + name + "'");
}

void checkOperand(const at::Tensor& t, const at::Tensor& dst, const char* what) {
  auto fail = [&](const std::string& why) { throw py::value_error(std::string("_reduce_into_on: ") + what + " " + why); };
  if (!t.device().is_cpu()) fail("is not a CPU tensor");
  if (!t.is_contiguous()) fail("is not contiguous");
  if (t.scalar_type() != dst.scalar_type())
    fail(std::string("has dtype ") + c10::toString(t.scalar_type()) + ", dst " + c10::toString(dst.scalar_type()));
  if (t.numel() != dst.numel())
    fail("has " + std::to_string(t.numel()) + " elements, dst " + std::to_string(dst.numel()));
}

void reduceIntoOn(const at::Tensor& dst, const std::vector<at::Tensor>& srcs, const std::string& op,
                  const std::string& isa, int64_t repeat) {
  const ReduceIsa which = parseIsa(isa);
  const RedOp redOp = parseRedOp(op);
  if (srcs.empty()) throw py::value_error("_reduce_into_on: needs at least one source");
  checkOperand(dst, dst, "dst");
  for (const auto& s : srcs) checkOperand(s, dst, "a source");
  const std::string why = hoccl::checkReducible(dst.scalar_type(), redOp);
  if (!why.empty()) throw py::value_error("_reduce_into_on: " + why);
  std::vector<const void*> ptrs;
  for (const auto& s : srcs) ptrs.push_back(s.data_ptr());
  py::gil_scoped_release release;
  for (int64_t r = 0; r < repeat; ++r)
    hoccl::reduceIntoOn(which, dst.data_ptr(), ptrs.data(), static_cast<int>(ptrs.size()), dst.numel(),
                        dst.scalar_type(), redOp);
}

}  // namespace

void bindReductions(py::module& m) {
  m.def(
      "reduce_isas",
      [] {
        py::dict out;
        py::list available;
        for (ReduceIsa isa : kIsas)
          if (hoccl::cpuHasReduceIsa(isa)) available.append(hoccl::reduceIsaName(isa));
        out["available"] = available;
        out["used"] = hoccl::reduceIsaName(hoccl::bestReduceIsa());
        return out;
      },
      "{'available': instruction sets this CPU can reduce on, 'used': the one host reductions use}");
  m.def("_reduce_into_on", &reduceIntoOn, py::arg("dst"), py::arg("srcs"), py::arg("op"), py::arg("isa"),
        py::arg("repeat") = 1,
        "Test and benchmark hook: dst = srcs[0] op srcs[1] op ... (Avg and PremulSum as a sum, unscaled) on "
        "the named instruction set, repeat times; raises ValueError when this CPU lacks it.");
}
