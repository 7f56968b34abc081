// Registers the cuda-ce Python functions on a module: call bindCuda(m) from PYBIND11_MODULE(_C).
#pragma once
#include <pybind11/pybind11.h>

void bindCuda(pybind11::module& m);
