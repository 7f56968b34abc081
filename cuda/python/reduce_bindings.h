// Registers the host reduction's instruction-set hooks: _C.reduce_isas() and
// _C._reduce_into_on(dst, srcs, op, isa, repeat), so tests can hold every path to the portable
// one's bits and the micro-benchmark can time them side by side. Call bindReductions(m) from
// PYBIND11_MODULE(_C).
#pragma once
#include <pybind11/pybind11.h>

void bindReductions(pybind11::module& m);
