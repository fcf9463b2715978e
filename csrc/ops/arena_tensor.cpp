// Tensors over arena memory (see arena_tensor.h).
#include "ops/arena_tensor.h"

namespace ktmoe {

at::Tensor arena_empty(const std::shared_ptr<WeightArena>& arena, at::IntArrayRef sizes) {
  int64_t bytes = 1;
  for (int64_t s : sizes) bytes *= s;
  bool file_backed = false;
  return arena_tensor(arena, arena->alloc(bytes, &file_backed), sizes);
}

at::Tensor arena_tensor(const std::shared_ptr<WeightArena>& arena, void* data, at::IntArrayRef sizes) {
  return at::from_blob(
      data, sizes, [arena](void*) {}, at::TensorOptions().dtype(at::kByte));
}

}  // namespace ktmoe
