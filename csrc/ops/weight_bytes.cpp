// [NOTE] empty_weight_bytes (see weight_bytes.h): a map_huge_pages mapping owned by the tensor's
// storage (unmapped by its deleter), or torch's allocator when mmap fails or the tensor is small.
#include "ops/weight_bytes.h"

#include <c10/util/accumulate.h>

#include <memory>

#include "common/huge_pages.h"

namespace ktmoe {

at::Tensor empty_weight_bytes(at::IntArrayRef sizes) {
  const auto bytes_options = at::TensorOptions().dtype(at::kByte);
  const int64_t bytes = c10::multiply_integers(sizes);
  const auto unmap = [bytes](void* q) { unmap_huge_pages(q, bytes); };
  if (bytes >= kHugePageBytes) {
    std::unique_ptr<void, decltype(unmap)> mapping(map_huge_pages(bytes), unmap);  // until the tensor owns it
    if (mapping) {
      at::Tensor t = at::from_blob(mapping.get(), sizes, unmap, bytes_options);
      mapping.release();
      return t;
    }
  }
  return at::empty(sizes, bytes_options);
}

}  // namespace ktmoe
