// [NOTE] amx gemm_fp8 / gemm_int4_affine: the exact checkpoint formats with a scale per k-group on
// tdpbf16ps tiles for prefill rows (m >= prefill_min_rows(); fp8: fp8_prefill_min_rows(), 8); below
// them avx512's fp8 kernel, and int4_affine's int16 one (gemm_nibble_int16_avx512.cpp: vpdpwssd).
//
// Each block of the call is decoded once, by avx512's own decoders, to kBF16's k-pair rows (an L2
// buffer of kp * 32 bytes): kFP8's e4m3 * 2^-8 and kINT4A's codes q are exact bf16 values (normal
// or zero, so AMX's denormal handling never touches them) and no block is refused. The tiles sum
// each k-group (w->group / 32 steps of 32 k) into C, and the group's epilogue applies the scales as
// avx512's group_end does: f = fma(s, C_G, f) (fp8: s * 2^8), then for int4_affine f = fma(o,
// xsum_G, f) with o = -(s * z) and xsum_G the row's Σ a over the group (row_group_sums, once per
// call); c = f after the last group (gemm_amx.h). The bits are tdpbf16ps's sums of the exact
// products, so they differ from avx512's vdpbf16ps chains within the fp32 sum's bound and depend
// neither on (b0, b1) nor on the block pairing.
//
// Why: vdpbf16ps costs these cores about 2 cycles (docs/isa.md), so avx512's prefill of these
// formats ran at a third of the bf16 tiles' speed: reference layer T=512 on 2 Xeon threads, fp8
// 257 ms and int4_affine 248 against bf16 tiles' 87 (bench_amx, 2026-12-06).
#include <algorithm>

#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_native.h"
#include "kernels/avx512/amx_entry_points.h"
#include "kernels/avx512/avx512_common.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();
}  // namespace avx512

namespace amx {

// w: kFP8 matrix [np, kp]; a: bf16 rows [m, lda] (kp used, zero padded); c: [m, ldc] fp32,
// columns 0 .. 16*(b1-b0) written.
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
              float* c, int64_t ldc) {
  if (m < fp8_prefill_min_rows()) return avx512::gemm_fp8(w, a, lda, m, b0, b1, c, ldc);
  gemm_scaled_tiles<NativeTileOps>(w, a, lda, m, b0, b1, c, ldc, avx512::fp8_block_to_bf16, avx512::fp8_group_scales);
}

// w: kINT4A matrix [np, kp]; a, c as gemm_fp8.
void gemm_int4_affine(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                      int64_t b1, float* c, int64_t ldc) {
  if (m < prefill_min_rows()) return avx512::gemm_int4_affine_int16(w, a, lda, m, b0, b1, c, ldc);
  if (b1 <= b0) return;
  const int64_t ngroups = w->kp / w->group;
  static thread_local avx512::Scratch buf;
  float* xs = reinterpret_cast<float*>(buf.at_least(size_t(m * ngroups) * sizeof(float)));
  avx512::int4a_row_group_sums(a, lda, m, w->group, ngroups, xs);
  gemm_scaled_tiles<NativeTileOps>(w, a, lda, m, b0, b1, c, ldc, avx512::int4a_block_to_bf16,
                                   avx512::int4a_group_scales, xs, ngroups);
}

}  // namespace amx
}  // namespace ktmoe
