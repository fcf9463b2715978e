// kFP8 / kINT4A on AMX tiles (gemm_amx.h's gemm_scaled_tiles, amx/gemm_decoded_amx.cpp): each block
// decoded to kBF16 k-pair rows, scales applied per k-group. On every host the tile emulator runs it
// over blocks decoded by a portable decoder written here from the formats' layouts (fp8: e4m3 * 2^-8;
// int4_affine: the code q) with scales read here (fp8: s * 2^8; int4_affine: s and o = -(s * z), and
// the rows' group sums), held to an fp32 sum's bound of the dequantized weights; where the CPU runs
// avx512, its decoders (the ones amx uses) must write the same bytes and scales; where it has AMX, the
// amx table's gemm (m >= the format's tile threshold: 8 rows for fp8) must give the emulator's bits.
#include <cmath>
#include <string>

#include "check.h"
#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_emulated.h"
#include "kernels/avx512/amx_entry_points.h"
#include "kernels/fp8_format.h"
#include "kernels/int4_affine_format.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

void put_bf16(uint8_t* out, int64_t word, float v) {  // v exact in bf16
  const uint16_t b = uint16_t(f32_bits(v) >> 16);
  out[2 * word] = uint8_t(b), out[2 * word + 1] = uint8_t(b >> 8);
}

// kFP8: byte i of a block (k-pair i / 32, column (i % 32) / 2, input parity i % 2) is word i of the
// kBF16 k-pair rows; its value e4m3 * 2^-8 (exact in bf16, subnormals included).
bool fp8_portable(const PackedMatrixHeader* w, int64_t block, uint8_t* out) {
  const uint8_t* d = packed_data(w) + block * fp8_block_data_bytes(w->kp);
  for (int64_t i = 0; i < w->kp * kBlockN; ++i) put_bf16(out, i, e4m3_to_float(d[i]) * (1.f / kE4m3KernelScale));
  return true;
}
void fp8_portable_scales(const PackedMatrixHeader* w, int64_t block, int64_t g, float* s, float*) {
  const uint8_t* rec = packed_scales(w) + (block * (w->kp / w->group) + g) * kFp8ScaleBytes;
  for (int j = 0; j < 16; ++j) {
    std::memcpy(&s[j], rec + 4 * j, 4);
    s[j] *= kE4m3KernelScale;
  }
}

// kINT4A: the code of column j, input k (int4_affine_format.h's offsets) as word (k / 2) * 32 + 2j + k % 2.
bool int4a_portable(const PackedMatrixHeader* w, int64_t block, uint8_t* out) {
  const int64_t kp = w->kp;
  for (int64_t j = 0; j < kBlockN; ++j)
    for (int64_t k = 0; k < kp; ++k) {
      const uint8_t byte = packed_data(w)[int4a_data_offset(kp, block * kBlockN + j, k)];
      put_bf16(out, (k / 2) * 32 + 2 * j + k % 2, float((byte >> int4a_nibble_shift(k)) & 15));
    }
  return true;
}
void int4a_portable_scales(const PackedMatrixHeader* w, int64_t block, int64_t g, float* s, float* o) {
  const uint8_t* rec = packed_scales(w) + (block * (w->kp / w->group) + g) * kInt4AffineRecordBytes;
  for (int j = 0; j < 16; ++j) {
    std::memcpy(&s[j], rec + 4 * j, 4);
    o[j] = -(s[j] * float(rec[kInt4AffineZeroAt + j]));
  }
}

}  // namespace

void test_amx_scaled_tiles(const std::vector<Isa>& isas, const PackedMatrixHeader* hw, const std::vector<double>& wv,
                           const std::vector<double>& row_mag, Rng& rng) {
  const bool fp8 = hw->format == uint8_t(WeightFormat::kFP8);
  const int64_t kp = hw->kp, np = hw->np, nb = np / 16, ng = kp / hw->group;
  const IsaKernels *vec512 = nullptr, *tiles = nullptr;
  for (const Isa& isa : isas) {
    if (std::string(isa.k->name) == "avx512") vec512 = isa.k;
    if (std::string(isa.k->name) == "amx") tiles = isa.k;
  }
  const amx::BlockDecoder portable = fp8 ? fp8_portable : int4a_portable;
  const amx::GroupScales portable_scales = fp8 ? fp8_portable_scales : int4a_portable_scales;
  // avx512's decoders and scales: the same bytes
  bool same_decode = true;
  if (vec512) {
    AlignedBytes want(size_t(kp * 32), 0), got(size_t(kp * 32), 0);
    for (int64_t b = 0; b < nb; ++b) {
      portable(hw, b, want.get());
      (fp8 ? avx512::fp8_block_to_bf16 : avx512::int4a_block_to_bf16)(hw, b, got.get());
      same_decode = same_decode && std::memcmp(want.get(), got.get(), size_t(kp * 32)) == 0;
      for (int64_t g = 0; g < ng; ++g) {
        float s0[16], o0[16] = {}, s1[16], o1[16] = {};
        portable_scales(hw, b, g, s0, o0);
        (fp8 ? avx512::fp8_group_scales : avx512::int4a_group_scales)(hw, b, g, s1, o1);
        same_decode = same_decode && !std::memcmp(s0, s1, sizeof s0) && !std::memcmp(o0, o1, sizeof o0);
      }
    }
  }
  double worst = 0;
  bool real_same = true, specials = true;
  for (int64_t m : {4, 17, 33}) {
    const int64_t lda = kp + 16, ldc = 16 * nb + 3;
    std::vector<uint16_t> a(size_t(m * lda), 0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < hw->k; ++c) a[size_t(r * lda + c)] = ref_bf16(float(rng.gauss()));
    // the group sums of rows [m, lda]: avx512's where the real tiles use them, else summed here
    const auto group_sums = [&](const std::vector<uint16_t>& rows) {
      std::vector<float> xs(size_t(m * ng), 0.f);
      if (vec512 && !fp8) {
        avx512::int4a_row_group_sums(rows.data(), lda, m, hw->group, ng, xs.data());
      } else {
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < kp; ++c) xs[size_t(r * ng + c / hw->group)] += bf16_value(rows[size_t(r * lda + c)]);
      }
      return xs;
    };
    const std::vector<float> xs = group_sums(a);
    std::vector<float> emu(size_t(m * ldc), 0.f);
    amx::gemm_scaled_tiles<amx::EmulatedTileOps>(hw, a.data(), lda, m, 0, nb, emu.data(), ldc, portable,
                                                 portable_scales, fp8 ? nullptr : xs.data(), ng);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t pr = 0; pr < np; ++pr) {
        double sum = 0, sa = 0;
        for (int64_t c = 0; c < kp; ++c) {
          const double x = bf16_value(a[size_t(r * lda + c)]);
          sum += x * wv[size_t(pr * kp + c)], sa += std::fabs(x);
        }
        const double tol = (2.0 * kp + 8) * 0x1.0p-24 * row_mag[size_t(pr)] * sa + 1e-30;
        const double err = std::fabs(double(emu[size_t(r * ldc + pr)]) - sum);
        worst = std::max(worst, std::isfinite(err) ? err / tol : 1e30);
      }
    const bool on_tiles = tiles && m >= (fp8 ? amx::fp8_prefill_min_rows() : amx::prefill_min_rows());
    if (on_tiles) {
      std::vector<float> real(size_t(m * ldc), 0.f);
      (fp8 ? tiles->gemm_fp8 : tiles->gemm_int4_affine)(hw, a.data(), lda, m, 0, nb, real.data(), ldc);
      for (int64_t r = 0; r < m; ++r)
        real_same = real_same && !std::memcmp(&real[size_t(r * ldc)], &emu[size_t(r * ldc)], size_t(np) * 4);
    }
    if (m == 17) {  // a NaN in row 3 and an Inf in row 7: those rows' outputs not finite, every other row's bits kept
      std::vector<uint16_t> bad = a;
      bad[size_t(3 * lda + 5)] = 0x7FC1, bad[size_t(7 * lda + hw->k - 1)] = 0x7F80;
      auto rows_ok = [&](const std::vector<float>& got) {
        bool ok = true;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t pr = 0; pr < np; ++pr) {
            const float v = got[size_t(r * ldc + pr)];
            ok = ok && (r == 3 || r == 7 ? !std::isfinite(v) : f32_bits(v) == f32_bits(emu[size_t(r * ldc + pr)]));
          }
        return ok;
      };
      const std::vector<float> xs_bad = group_sums(bad);
      std::vector<float> c(size_t(m * ldc), 0.f);
      amx::gemm_scaled_tiles<amx::EmulatedTileOps>(hw, bad.data(), lda, m, 0, nb, c.data(), ldc, portable,
                                                   portable_scales, fp8 ? nullptr : xs_bad.data(), ng);
      specials = specials && rows_ok(c);
      if (on_tiles) {
        (fp8 ? tiles->gemm_fp8 : tiles->gemm_int4_affine)(hw, bad.data(), lda, m, 0, nb, c.data(), ldc);
        specials = specials && rows_ok(c);
      }
    }
  }
  CHECK(worst <= 1.0 && same_decode && real_same && specials,
        strf("amx %s tiles n=%d k=%d group=%d M={4,17,33}: emulated over the portable decode within bound of the "
             "dequantized weights (max err/tol %.3f); avx512's decoders and scales %s; real tiles %s; a NaN row and "
             "an Inf row not finite, the other rows' bits kept: %s",
             fp8 ? "gemm_fp8" : "gemm_int4_affine", hw->n, hw->k, hw->group, worst,
             vec512 ? (same_decode ? "= the portable ones" : "DIFFER") : "(no AVX-512 here)",
             tiles ? (real_same ? "= the emulator's bits" : "DIFFER from the emulator") : "(no AMX here)",
             specials ? "yes" : "NO"));
}

}  // namespace ktmoe_test
