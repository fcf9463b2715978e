// [NOTE] ktmoe::pack_experts: dense expert weights -> packed [E, bytes] tensors.
//
// Accepts the Hugging Face layout (gate_up_proj [E, 2I, H]: gate rows then up
// rows; down_proj [E, H, I]) or kt-kernel's separate gate/up [E, I, H]. fp32,
// bf16 or fp16. Output tensors live in the arena named by `arena` (empty: the
// default CPU allocator). Experts are packed in parallel, one expert matrix per
// task, straight into the output: no second copy of the layer is made.
// Order: checks -> shapes -> allocation -> pack.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "kernels/pack.h"
#include "ops/arena_registry.h"
#include "ops/ops.h"
#include "ops/weight_format.h"

namespace ktmoe {
namespace {

void check_dense(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "ktmoe::pack_experts: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 3, "ktmoe::pack_experts: ", name, " must be 3-D [E, rows, cols], got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 ||
                  t.scalar_type() == at::kHalf,
              "ktmoe::pack_experts: ", name, " must be float32, bfloat16 or float16, got ",
              t.scalar_type());
}

// Packs experts' matrices: rows of expert e come from parts (each [E, r_i, k]) in order.
at::Tensor pack_role(const std::vector<at::Tensor>& parts, const PackedMatrixHeader& header,
                     const std::string& arena) {
  const int64_t experts = parts[0].size(0);
  at::Tensor out = arena_empty(arena, {experts, header.total_bytes});
  uint8_t* base = out.data_ptr<uint8_t>();
  at::parallel_for(0, experts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      std::vector<at::Tensor> dense;
      std::vector<const float*> rows;
      for (const at::Tensor& p : parts) {
        dense.push_back(p.select(0, e).to(at::kFloat).contiguous());
        const float* d = dense.back().data_ptr<float>();
        for (int64_t r = 0; r < p.size(1); ++r) rows.push_back(d + r * p.size(2));
      }
      pack_matrix(header, rows.data(), base + e * header.total_bytes);
    }
  });
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> pack_experts(const at::Tensor& gate_up,
                                                const c10::optional<at::Tensor>& up,
                                                const at::Tensor& down, c10::string_view weight_format,
                                                int64_t group_size, c10::string_view arena) {
  // checks
  const WeightFormat format = parse_weight_format(std::string(weight_format));
  check_dense(gate_up, up ? "gate" : "gate_up");
  check_dense(down, "down");
  if (up) check_dense(*up, "up");
  TORCH_CHECK(group_size == 0 || (group_size > 0 && group_size % kAlignK == 0),
              "ktmoe::pack_experts: group_size must be 0 (default) or a positive multiple of ",
              kAlignK, ", got ", group_size);
  // shapes
  const int64_t experts = gate_up.size(0), hidden = gate_up.size(2);
  int64_t inter = 0;
  std::vector<at::Tensor> gate_up_parts;
  if (up) {
    inter = gate_up.size(1);
    TORCH_CHECK(up->sizes() == gate_up.sizes(), "ktmoe::pack_experts: up ", up->sizes(),
                " must have the shape of gate ", gate_up.sizes());
    gate_up_parts = {gate_up, *up};
  } else {
    TORCH_CHECK(gate_up.size(1) % 2 == 0, "ktmoe::pack_experts: gate_up [E, 2I, H] needs an even ",
                "row count, got ", gate_up.sizes());
    inter = gate_up.size(1) / 2;
    gate_up_parts = {gate_up};
  }
  TORCH_CHECK(experts > 0 && inter > 0 && hidden > 0, "ktmoe::pack_experts: empty weights ",
              gate_up.sizes());
  TORCH_CHECK(down.size(0) == experts && down.size(1) == hidden && down.size(2) == inter,
              "ktmoe::pack_experts: down must be [E, H, I] = [", experts, ", ", hidden, ", ", inter,
              "], got ", down.sizes());
  const PackedMatrixHeader h13 =
      packed_matrix_header(format, MatrixRole::kGateUp, 2 * inter, hidden, group_size);
  const PackedMatrixHeader h2 = packed_matrix_header(format, MatrixRole::kDown, hidden, inter, group_size);
  for (const PackedMatrixHeader* h : {&h13, &h2})
    TORCH_CHECK(h->group == 0 || h->kp % h->group == 0, "ktmoe::pack_experts: group_size ",
                h->group, " does not divide the padded input size ", h->kp);
  // allocation + pack
  const std::string key(arena);
  at::Tensor w13 = pack_role(gate_up_parts, h13, key);
  at::Tensor w2 = pack_role({down}, h2, key);
  // Start writing the layer back so its pages turn clean (reclaimable) early:
  // packing more than RAM must not pile up dirty page cache.
  if (!key.empty()) find_arena(key)->writeback(/*wait=*/false, nullptr);
  return {w13, w2};
}

int64_t packed_matrix_bytes(c10::string_view weight_format, c10::string_view role, int64_t n,
                            int64_t k, int64_t group_size) {
  const WeightFormat format = parse_weight_format(std::string(weight_format));
  MatrixRole r = MatrixRole::kPlain;
  if (role == "gate_up") r = MatrixRole::kGateUp;
  else if (role == "down") r = MatrixRole::kDown;
  else TORCH_CHECK(role == "plain", "ktmoe: role must be gate_up, down or plain, got '", role, "'");
  return packed_matrix_header(format, r, n, k, group_size).total_bytes;
}

}  // namespace ktmoe
