// [NOTE] ktmoe::ggml_dequantize: GGML blocks -> fp32 weights (the non-expert tensors of a GGUF file,
// and the tests' view of what every GGML kernel computes with).
//
// blocks uint8 [..., B] (B a multiple of the type's block bytes; each row of B bytes is one tensor row
// of blocks, as a GGUF file stores it), ggml_type a decodable id of kernels/ggml/ggml_types.h
// -> float32 [..., B / block_bytes * block_elems], bit for bit gguf.quants.dequantize.
// Order: checks -> shapes -> dispatch. The blocks are decoded in chunks of whole blocks in parallel
// (the decoders are exact and per block: the result does not depend on the split).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <string>

#include "ops/ggml_type.h"
#include "ops/ops.h"

namespace ktmoe {

const GgmlTypeTraits& decodable_ggml_type(int64_t id, const char* op) {
  const GgmlTypeTraits* row = id >= 0 && id <= INT32_MAX ? find_ggml_type(uint32_t(id)) : nullptr;
  TORCH_CHECK(row != nullptr, op, ": GGML type id ", id, " is not one ggml defines (a corrupt or newer file)");
  if (row->decode == nullptr) {
    int count = 0;
    const GgmlTypeTraits* rows = ggml_type_table(&count);
    std::string names;
    for (int i = 0; i < count; ++i)
      if (rows[i].decode) names += std::string(names.empty() ? "" : ", ") + rows[i].name;
    TORCH_CHECK(false, op, ": GGML type ", row->name, " (id ", id, ") is not read by torch_ktmoe; it reads ", names);
  }
  return *row;
}

at::Tensor ggml_dequantize(const at::Tensor& blocks, int64_t ggml_type) {
  const GgmlTypeTraits& t = decodable_ggml_type(ggml_type, "ktmoe::ggml_dequantize");
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.dim() >= 1,
              "ktmoe::ggml_dequantize: blocks must be a uint8 CPU tensor [..., row bytes], got ",
              blocks.scalar_type(), " ", blocks.sizes(), " on ", blocks.device());
  const int64_t row_bytes = blocks.size(-1);
  TORCH_CHECK(row_bytes % t.block_bytes == 0, "ktmoe::ggml_dequantize: a row of ", row_bytes,
              " bytes is not whole ", t.name, " blocks (", t.block_bytes, " bytes each)");
  std::vector<int64_t> sizes = blocks.sizes().vec();
  sizes.back() = row_bytes / t.block_bytes * t.block_elems;
  at::Tensor out = at::empty(sizes, blocks.options().dtype(at::kFloat));
  const at::Tensor in = blocks.contiguous();
  const int64_t nblocks = in.numel() / t.block_bytes;
  const uint8_t* src = in.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / t.block_elems);  // ~64 KiB of fp32 out per task
  at::parallel_for(0, nblocks, grain, [&](int64_t b0, int64_t b1) {
    t.decode(src + b0 * t.block_bytes, b1 - b0, dst + b0 * t.block_elems);
  });
  return out;
}

}  // namespace ktmoe
