// Registers the plan builders for Python: _C.build_plan(request dict) -> plan dict, so tests can
// build every rank's Plan of a request and run them together. Call
// bindPlans(m) from PYBIND11_MODULE(_C).
#pragma once
#include <pybind11/pybind11.h>

void bindPlans(pybind11::module& m);
