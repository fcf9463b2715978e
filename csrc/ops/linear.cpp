// [NOTE] ktmoe::pack_linear / ktmoe::linear: a dense nn.Linear through the experts' bf16 gemm.
//
// The non-expert weights of an MoE model (attention projections, shared experts, lm_head)
// are plain [N, K] matrices that torch multiplies with its own bf16 GEMV at a fraction of
// the read roof. pack_linear packs one into the kBF16 layout of kernels/packed_format.h in
// the kPlain role (block b = output rows 16b .. 16b+15, VNNI k-pairs), header first, as a
// 1-D uint8 tensor; linear multiplies by it with the active ISA's gemm_bf16:
//     out[..., n] = Σ_k bf16(x[..., k]) · bf16(W[n, k]) (+ bias[n]),   fp32 sums, x's dtype out.
//
// pack_linear: weight [N, K] fp32 | bf16 | fp16 -> uint8 [total_bytes]. Row chunks of
// kPackRows (a multiple of 16, so a chunk is whole blocks) are widened to fp32 and packed
// in parallel by pack_matrix, each straight after the header at its blocks' offset: no fp32
// copy of the whole weight (an lm_head is ~1 GiB as fp32). A NaN / Inf weight is an error
// naming its row and column.
//
// linear: x [..., K] bf16 | fp16 | fp32, w_packed from pack_linear, out_features N (the
// header's n: the op's fake kernel sizes its output from it, it cannot read the header),
// bias [N] (any float dtype) or None -> [..., N] in x's dtype. Order: checks -> shapes -> scratch -> dispatch.
//   scratch  a [M, kp + 32] bf16 rows, zero past K (x widened first when fp16); the stride is
//            kp + 32 so that rows are never a multiple of 4 KiB apart (L1 set aliasing), as in
//            the MoE driver.
//   items    (rows [r0, r1), blocks [b0, b1)), in whole register groups (4 blocks). Decode
//            (M <= kDecodeRows: one register tile, weight bound) cuts the blocks into items of
//            ~kDecodeItemBytes of weights (the MoE driver's decode item size); prefill into panels
//            of ~kPanelBytes (read from memory once and from L2 by every row tile of kTokenTile
//            rows), and the rows into chunks when there are fewer panels than threads. The
//            work pool's threads (ops/op_threads.h) take items from a shared counter: a thread
//            that starts late or is descheduled (a loaded host) takes fewer, instead of holding
//            up the call with a fixed share.
//   epilogue per gemm call (kCallBlocks blocks x up to kTokenTile rows, a 32 KiB fp32 stack
//            tile): + bias, then written to out in its dtype (bf16 / fp16 rounded to nearest).
// The gemm's bits depend neither on the block split nor on M (isa_kernels.h), so out is the
// same for any thread count.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/pack.h"
#include "kernels/packed_header_check.h"
#include "ops/isa_dispatch.h"
#include "ops/op_threads.h"
#include "ops/ops.h"
#include "ops/pack_each_expert.h"
#include "ops/weight_bytes.h"

namespace ktmoe {
namespace {

constexpr int64_t kPackRows = 256;          // weight rows per packing task
constexpr int64_t kDecodeRows = 12;         // up to this many rows: one gemm register tile, split by blocks
constexpr int64_t kTokenTile = 32;          // rows per gemm call
constexpr int64_t kGroupBlocks = 4;         // blocks of the gemm's widest register tile
constexpr int64_t kCallBlocks = 16;         // blocks per gemm call: stack tile kTokenTile x 256 fp32
constexpr int64_t kPanelBytes = 512 << 10;  // prefill: weight bytes per item
constexpr int64_t kDecodeItemBytes = 256 << 10;  // decode: weight bytes per item

bool is_float_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// The header of w_packed after every check that makes it safe for the gemm to read.
const PackedMatrixHeader& check_packed_linear(const at::Tensor& w) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 1 && w.is_contiguous(),
              "ktmoe::linear: w_packed must be a contiguous 1-D uint8 CPU tensor from ktmoe::pack_linear, got ",
              w.scalar_type(), " ", w.sizes(), " on ", w.device());
  TORCH_CHECK(w.numel() >= int64_t(sizeof(PackedMatrixHeader)),
              "ktmoe::linear: w_packed holds ", w.numel(), " bytes, less than a packed header: not a packed matrix");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(w.data_ptr()) % 64 == 0, "ktmoe::linear: w_packed must be 64-byte aligned");
  const auto* h = reinterpret_cast<const PackedMatrixHeader*>(w.data_ptr<uint8_t>());
  const std::string bad = check_packed_header(*h, MatrixRole::kPlain, w.numel());
  TORCH_CHECK(bad.empty(), "ktmoe::linear: w_packed is not a packed linear weight (ktmoe::pack_linear): ", bad);
  TORCH_CHECK(h->format == uint8_t(WeightFormat::kBF16), "ktmoe::linear: w_packed is packed as ",
              format_traits(WeightFormat(h->format)).name, "; ktmoe::linear reads bf16 (ktmoe::pack_linear)");
  return *h;
}

// "weight[r, c] is nan" for the first non-finite element of the row chunk dense [rows, K] from row n0.
std::string first_non_finite(const at::Tensor& dense, int64_t n0) {
  const at::Tensor where = at::isfinite(dense).logical_not().nonzero();
  if (where.size(0) == 0) return "a non-finite weight";
  const int64_t r = where[0][0].item<int64_t>(), c = where[0][1].item<int64_t>();
  return "weight[" + std::to_string(n0 + r) + ", " + std::to_string(c) + "] is " +
         std::to_string(dense[r][c].item<float>());
}

// x [M, K] contiguous -> bf16 rows a [M, ld], zero in [K, kp).
void to_bf16_rows(const IsaKernels& isa, const ParallelFor& parallel_for, const at::Tensor& x, int64_t kp,
                  int64_t ld, uint16_t* a) {
  const int64_t M = x.size(0), K = x.size(1);
  const at::ScalarType xt = x.scalar_type();
  parallel_for(M, 16, [&](int64_t m0, int64_t m1) {
    std::vector<float> widened(xt == at::kHalf ? size_t(K) : 0);
    for (int64_t m = m0; m < m1; ++m) {
      uint16_t* dst = a + m * ld;
      if (xt == at::kBFloat16) {
        std::memcpy(dst, static_cast<const uint16_t*>(x.const_data_ptr()) + m * K, size_t(K) * 2);
      } else if (xt == at::kHalf) {
        isa.f16_to_f32(static_cast<const uint16_t*>(x.const_data_ptr()) + m * K, widened.data(), K);
        isa.to_bf16(widened.data(), dst, K);
      } else {
        isa.to_bf16(x.const_data_ptr<float>() + m * K, dst, K);
      }
      std::fill(dst + K, dst + kp, uint16_t{0});
    }
  });
}

// One work item: rows [r0, r1) of x times blocks [b0, b1) of the weight.
struct Item {
  int64_t r0, r1, b0, b1;
};

// Items as in the [NOTE]: the decode split or prefill panels x row chunks.
std::vector<Item> make_items(int64_t M, int64_t blocks, int64_t block_bytes, int64_t threads) {
  const int64_t groups = (blocks + kGroupBlocks - 1) / kGroupBlocks;
  const int64_t item_bytes = M <= kDecodeRows ? kDecodeItemBytes : kPanelBytes;
  const int64_t per_item = std::max<int64_t>(1, item_bytes / (block_bytes * kGroupBlocks));  // groups per item
  const int64_t panels = (groups + per_item - 1) / per_item;
  const int64_t tiles = (M + kTokenTile - 1) / kTokenTile;
  const int64_t row_chunks = M <= kDecodeRows ? 1 : std::min(tiles, (threads + panels - 1) / panels);
  std::vector<Item> items;
  for (int64_t rc = 0; rc < row_chunks; ++rc) {
    const int64_t r0 = rc * tiles / row_chunks * kTokenTile;
    const int64_t r1 = std::min(M, (rc + 1) * tiles / row_chunks * kTokenTile);
    for (int64_t g = 0; g < groups; g += per_item)
      items.push_back({r0, r1, g * kGroupBlocks, std::min(blocks, (g + per_item) * kGroupBlocks)});
  }
  return items;
}

// out[r0 .. r0+m) x columns [c0, c0 + cols) = tile (+ bias), in out's dtype; tile is [m, ldc] fp32.
void write_out(const IsaKernels& isa, float* tile, int64_t ldc, int64_t m, int64_t cols, const float* bias,
               int64_t c0, const at::Tensor& out, int64_t r0) {
  const int64_t N = out.size(1);
  for (int64_t r = 0; r < m; ++r) {
    float* y = tile + r * ldc;
    if (bias)
      for (int64_t j = 0; j < cols; ++j) y[j] += bias[c0 + j];
    const int64_t pos = (r0 + r) * N + c0;
    switch (out.scalar_type()) {
      case at::kFloat: std::memcpy(out.data_ptr<float>() + pos, y, size_t(cols) * 4); break;
      case at::kBFloat16: isa.to_bf16(y, static_cast<uint16_t*>(out.data_ptr()) + pos, cols); break;
      default: isa.f32_to_f16(y, static_cast<uint16_t*>(out.data_ptr()) + pos, cols); break;
    }
  }
}

}  // namespace

at::Tensor pack_linear(const at::Tensor& weight) {
  // checks
  TORCH_CHECK(weight.device().is_cpu(), "ktmoe::pack_linear: weight must be a CPU tensor, got ", weight.device());
  TORCH_CHECK(is_float_dtype(weight.scalar_type()), "ktmoe::pack_linear: weight must be float32, bfloat16 or ",
              "float16, got ", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) > 0 && weight.size(1) > 0,
              "ktmoe::pack_linear: weight must be a non-empty 2-D [N, K] (nn.Linear.weight), got ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(N <= INT32_MAX - kBlockN && K <= INT32_MAX - kAlignK, "ktmoe::pack_linear: weight ", weight.sizes(),
              " is too large for a packed header");
  // shapes
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kBF16, MatrixRole::kPlain, N, K, 0);
  const int64_t block_bytes = block_data_bytes(WeightFormat::kBF16, h.kp);
  const int64_t data_end = h.data_offset + h.np / kBlockN * block_bytes;
  // allocation: header, then every block written by its chunk, zero after the data
  at::Tensor out = empty_weight_bytes({h.total_bytes});
  uint8_t* base = out.data_ptr<uint8_t>();
  std::memset(base, 0, size_t(h.data_offset));
  std::memcpy(base, &h, sizeof(h));
  std::memset(base + data_end, 0, size_t(h.total_bytes - data_end));
  // pack
  const int64_t chunks = (N + kPackRows - 1) / kPackRows;
  const PackFailure bad = pack_each_expert(chunks, [&](int64_t chunk) {
    const int64_t n0 = chunk * kPackRows, rows = std::min(kPackRows, N - n0);
    const PackedMatrixHeader part = packed_matrix_header(WeightFormat::kBF16, MatrixRole::kPlain, rows, K, 0);
    const at::Tensor dense = weight.narrow(0, n0, rows).to(at::kFloat).contiguous();
    std::vector<const float*> row_ptrs(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) row_ptrs[size_t(r)] = dense.const_data_ptr<float>() + r * K;
    at::Tensor blob = at::empty({part.total_bytes}, at::TensorOptions().dtype(at::kByte));
    pack_matrix(part, row_ptrs.data(), blob.data_ptr<uint8_t>());
    std::memcpy(base + h.data_offset + n0 / kBlockN * block_bytes, blob.data_ptr<uint8_t>() + part.data_offset,
                size_t(part.np / kBlockN * block_bytes));
  });
  if (bad.expert >= 0) {
    const int64_t n0 = bad.expert * kPackRows;
    const at::Tensor dense = weight.narrow(0, n0, std::min(kPackRows, N - n0)).to(at::kFloat);
    TORCH_CHECK(false, "ktmoe::pack_linear: ", first_non_finite(dense, n0),
                ": NaN/Inf weights are refused, they would silently poison every output");
  }
  return out;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w_packed, int64_t out_features,
                  const c10::optional<at::Tensor>& bias) {
  // checks
  TORCH_CHECK(x.device().is_cpu(), "ktmoe::linear: x must be a CPU tensor, got ", x.device());
  TORCH_CHECK(is_float_dtype(x.scalar_type()), "ktmoe::linear: x must be bfloat16, float16 or float32, got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, "ktmoe::linear: x must be [..., K], got a 0-d tensor");
  const PackedMatrixHeader& h = check_packed_linear(w_packed);
  const int64_t K = x.size(-1), N = h.n;
  TORCH_CHECK(out_features == N, "ktmoe::linear: out_features is ", out_features, " but w_packed was packed for N = ",
              N, " (weight [", h.n, ", ", h.k, "])");
  TORCH_CHECK(K == h.k, "ktmoe::linear: x has K = ", K, " input features but w_packed was packed for K = ", h.k,
              " (weight [", h.n, ", ", h.k, "])");
  at::Tensor b;
  if (bias.has_value()) {
    TORCH_CHECK(bias->device().is_cpu() && is_float_dtype(bias->scalar_type()),
                "ktmoe::linear: bias must be a float CPU tensor, got ", bias->scalar_type(), " on ", bias->device());
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "ktmoe::linear: bias must be [N] = [", N, "], got ",
                bias->sizes());
    b = bias->to(at::kFloat).contiguous();
  }
  // shapes
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = N;
  at::Tensor out = at::empty(out_sizes, x.options());
  const int64_t M = x.numel() / K;  // K = h.k > 0
  if (M == 0) return out;
  // scratch
  const IsaKernels& isa = active_isa();  // this thread's choice, before the pool's threads run
  const int64_t kp = h.kp, ld = kp + 32;
  const at::Tensor x2 = x.reshape({M, K}).contiguous();
  at::Tensor rows = at::empty({M, ld}, x.options().dtype(at::kBFloat16));
  uint16_t* a = static_cast<uint16_t*>(rows.data_ptr());
  const int threads = op_threads();
  const ParallelFor parallel_for = pool_loop(threads);
  to_bf16_rows(isa, parallel_for, x2, kp, ld, a);
  at::Tensor out2 = out.view({M, N});
  // dispatch
  const float* bias_f32 = b.defined() ? b.const_data_ptr<float>() : nullptr;
  const std::vector<Item> items =
      make_items(M, h.np / kBlockN, block_data_bytes(WeightFormat::kBF16, kp), threads);
  const int64_t n_items = int64_t(items.size());
  parallel_for(n_items, 1, [&](int64_t i0, int64_t i1) {  // items taken one at a time, dynamically
    alignas(64) float tile[kTokenTile * kCallBlocks * kBlockN];
    for (int64_t i = i0; i < i1; ++i) {
      const Item& it = items[size_t(i)];
      for (int64_t r0 = it.r0; r0 < it.r1; r0 += kTokenTile) {
        const int64_t m = std::min(kTokenTile, it.r1 - r0);
        for (int64_t b0 = it.b0; b0 < it.b1; b0 += kCallBlocks) {
          const int64_t b1 = std::min(it.b1, b0 + kCallBlocks), ldc = kBlockN * (b1 - b0);
          isa.gemm_bf16(&h, a + r0 * ld, ld, m, b0, b1, tile, ldc);
          const int64_t c0 = kBlockN * b0;
          write_out(isa, tile, ldc, m, std::min(N, kBlockN * b1) - c0, bias_f32, c0, out2, r0);
        }
      }
    }
  });
  return out;
}

}  // namespace ktmoe
