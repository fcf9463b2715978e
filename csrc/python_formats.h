// The weight format table's Python face (python_formats.cpp), bound into torch_ktmoe._C.
#pragma once
#include <pybind11/pybind11.h>

void bind_weight_formats(pybind11::module& m);
