// Registers the VarioPath scheduler as the submodule `varipath` of a module: call
// bindVariPath(m) from PYBIND11_MODULE(_C).
#pragma once
#include <pybind11/pybind11.h>

void bindVariPath(pybind11::module& m);
