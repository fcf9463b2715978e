// The Python module torch_ktmoe._C: weight arenas, the persistent cache, its
// inspection, packed sizes, ISA selection (one bind_* file per topic, see
// python_bindings.h). The ops themselves are registered in torch_bindings.cpp.
//
// Includes: everything computed goes through ops/ (ISA choice, packing plan,
// cache keys and protocol, inspection). arena/ is included only for the objects
// Python holds and calls 1:1 (WeightArena, the cache file names, the NUMA node
// count): a pass-through layer in ops/ would only repeat their declarations.
#include "python_bindings.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_ktmoe native extension: weight arenas, cache helpers, ISA selection (ops: torch.ops.ktmoe)";
  ktmoe::PyArenaClass arena = ktmoe::bind_arena(m);
  ktmoe::bind_cache(m, arena);
  ktmoe::bind_inspection(m);
  ktmoe::bind_packing(m);
  ktmoe::bind_isa(m);
  ktmoe::bind_threads(m);
  ktmoe::bind_weight_formats(m);
}
