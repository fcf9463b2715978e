// [NOTE] The Python module torch_ktmoe._C is bound topic by topic (python_module.cpp
// calls each): one short function per topic, each in its own bind_*.cpp file.
#pragma once
#include <torch/extension.h>

#include <memory>

#include "arena/weight_arena.h"

namespace ktmoe {

// The Python face of an arena: the shared_ptr (lifetime).
struct PyArena {
  std::shared_ptr<WeightArena> arena;
};
using PyArenaClass = pybind11::class_<PyArena>;

PyArenaClass bind_arena(pybind11::module_& m);                // WeightArena: memory, residency, statistics
void bind_cache(pybind11::module_& m, PyArenaClass& arena);    // the persistent cache: keys, names, load_or_build
void bind_inspection(pybind11::module_& m);                    // inspect_cache_file, cache_dir_problem
void bind_packing(pybind11::module_& m);                       // packed sizes
void bind_isa(pybind11::module_& m);                           // ISA selection, NUMA node count
void bind_threads(pybind11::module_& m);                       // the forward ops' threads (op_threads.h)
void bind_weight_formats(pybind11::module_& m);                // the weight format table: weight_formats(), layout version

}  // namespace ktmoe
