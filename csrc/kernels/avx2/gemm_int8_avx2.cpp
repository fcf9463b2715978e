// [NOTE] int8 GEMM over packed kINT8 blocks, AVX2 (exact int32 dot products).
//
// Computes, for rows m < M and packed blocks b in [b0, b1), n = 16b + j (packed_format.h,
// kINT8: per block, kp/4 k-quads of 16 columns x 4 u8 = 64 bytes, u = wq + 128):
//   one group (per channel): c[m][16*(b-b0) + j] = (sx[m]·s[n]) · I,
//   groups: acc = fma(s[n,G]·sx[m,G], I_G, acc) over G in order, c = acc (activation scales per
//   (row, group)),
//   I_G = Σ_{k∈G} (u[n][k] − 128)·xq[m][k]  (I: the one group).
//
// The dot (llama.cpp's q8_0 trick): u xor 0x80 is the signed weight wq in [-127, 127];
// vpsignb moves the sign of xq onto it, so vpmaddubsw multiplies |xq| (u8 <= 127) by
// sign(xq)·wq (s8): each int16 pair sum is at most 2·127·127 = 32258, no saturation;
// vpmaddwd with ones widens the pairs to one int32 per column and k-quad.
//   weights  one 256-bit load = 8 columns x 4 u8 (k0 k1 k2 k3 per column);
//   activations xq (the caller's rows) and |xq| (one row of scratch per row, made once
//            per call): one 32-bit broadcast of each per row and k-quad.
// Per 64 weight bytes and row: 2 loads (folded into the xors), 2 xor, 2 vpsignb,
// 2 vpmaddubsw, 2 vpmaddwd, 2 vpaddd, 2 broadcasts: 18 instructions per k-quad of
// the M = 1 loop (objdump; 19 with the prefetch below) against 23 for widening u8 and xq
// to int16 (and, shift, 4 vpmaddwd, 4 vpaddd); with groups it also drops the 128·Σxq
// correction of every group. Measured (int8 layer, H 2048, I 768, 32 experts, T = 1,
// KTMOE_ISA=avx2, a loaded 2-core Zen 5; min of 140 calls, 1 / 2 threads): per channel
// 2.12 -> 1.97 / 1.29 -> 1.17 ms, groups of 32 3.19 -> 2.36 / 1.87 -> 1.40 ms. Tried and
// dropped: two blocks per decode tile sharing the broadcasts (15 % slower).
// Prefetch: each k-quad prefetches the line kInt8Ahead = 8 KiB ahead on the block stream with
// prefetcht2 (blocks are contiguous, so near a block's end that is the next one).
// Measured (benchmarks/micro/avx2_decode_micro.cpp, cold, M = 1, 1 thread, p10 / median of 3840
// samples, loaded 2-core Zen 5, 4 KiB pages): 2.11 / 2.58 ms a forward of 8 experts with
// prefetcht1 against 2.39 / 3.19 with none, 2.27 / 2.71 with 4 KiB; 1 KiB into L1 no better
// than none; prefetching the group scales 8 to 64 groups ahead as well no better. On huge pages
// (common/huge_pages.h; 576-960 samples, quiet) prefetcht2 was 2-5 % faster than prefetcht1 in
// three runs (1.787 / 1.906 against 1.852 / 1.951 ms) and 1 % in a fourth; level on 2 threads;
// 16 KiB as 8 KiB.
// One thread reads at 68-80 % of the roof, and not for want of instructions: hot in L2 the
// loop runs 47-55 GB/s, and the same weight stream with the same count of vector operations and
// broadcasts per line, none of them fed by the loaded bytes, reads at 106-109 % (the
// microbenchmark's "READ + 12 ALU" row). Dropping the xor and vpsignb (wrong values, 15 instead
// of 19 per k-quad), a dot independent of the loads inside this tile structure, or an extra
// prefetcht0 256 B-2 KiB ahead gain 0-5 % cold. Not found yet.
// Tiles: MR = 4 rows x 1 block (8 int32 accumulators), blocks outer. The int32 sums
// are exact, so the integers are identical to every other ISA; the epilogue
// (gemm_int8_tile.h, shared with avx2_vnni) is the generic one (the same multiplies and
// fmas in the same order), so even the fp32 bits agree.
#include "kernels/avx2/avx2_util.h"
#include "kernels/avx2/gemm_int8_tile.h"

namespace ktmoe {
namespace avx2 {
namespace {

// |xq| of `rows` rows (s8 [rows, ldq], kp used): dst [rows, kp] u8.
void abs_int8_rows(const int8_t* q, int64_t ldq, int64_t rows, int64_t kp, int8_t* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kp; k += 32) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * ldq + k));
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + r * kp + k), _mm256_abs_epi8(x));
    }
}

// acc[r][h] += Σ (u − 128)·xq over k-quads [kq0, kq1) of one block (wb), columns
// 8h .. 8h+7; rows r < MR of xq (stride ldq) and |xq| (stride lda).
// kAhead / kHint: a prefetch of the line kAhead bytes ahead per k-quad (0: none).
template <int MR, int64_t kAhead, int kHint>
inline void int8_quads(__m256i (&acc)[MR][2], const uint8_t* wb, int64_t kq0, int64_t kq1, const int8_t* xq,
                       int64_t ldq, const int8_t* xa, int64_t lda) {
  const __m256i flip = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t kq = kq0; kq < kq1; ++kq) {
    const uint8_t* p = wb + kq * 64;
    if constexpr (kAhead > 0) _mm_prefetch(reinterpret_cast<const char*>(p + kAhead), _mm_hint(kHint));
    const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), flip);
    const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)), flip);
    for (int r = 0; r < MR; ++r) {
      const __m256i bx = broadcast32(xq + r * ldq + kq * 4), ax = broadcast32(xa + r * lda + kq * 4);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, bx)), ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, bx)), ones));
    }
  }
}

constexpr int64_t kInt8Ahead = 8192;  // weight prefetch distance (bytes; prefetcht2)

// w: packed kINT8; a: int8 rows (kp used) and scales [M, kp / group] (a.gsum is not read: the dot is
// Σ (u − 128)·xq directly); c: fp32 [M, ldc], 16*(b1-b0) columns.
// kAhead / kHint: the weight prefetch (int8_quads).
template <int64_t kAhead, int kHint>
void gemm_int8_ahead(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1,
                     float* c, int64_t ldc) {
  const int64_t kp = w->kp, g = w->group, nblk = b1 - b0;
  const int64_t blk_bytes = block_data_bytes(WeightFormat::kINT8, kp);
  const uint8_t* wblk = packed_data(w) + b0 * blk_bytes;
  const int64_t blk_scales = 16 * (kp / g);  // fp32 scales per block
  const float* scales = reinterpret_cast<const float*>(packed_scales(w)) + b0 * blk_scales;
  if (m <= 0 || nblk <= 0) return;
  const int64_t chunk = std::min(m, kRowChunk);
  int8_t* xa = static_cast<int8_t*>(thread_scratch(size_t(chunk * kp)));
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    const int8_t* xq = a.q + r0 * a.ldq;
    abs_int8_rows(xq, a.ldq, rows, kp, xa);
    const float* sx = a.scale + r0 * (kp / g);
    float* cr = c + r0 * ldc;
    // block-outer: a block (kp*16 bytes) stays in cache while every row tile reads it
    for (int64_t b = 0; b < nblk; ++b) {
      for_row_tiles(rows, [&](auto mr, int64_t r) {
        constexpr int MR = decltype(mr)::value;
        const uint8_t* wb = wblk + b * blk_bytes;
        const int8_t *xr = xq + r * a.ldq, *xar = xa + r * kp;
        const auto group_dot = [&](__m256i(&acc)[MR][2], int64_t G) {
          for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
          int8_quads<MR, kAhead, kHint>(acc, wb, G * g / 4, (G + 1) * g / 4, xr, a.ldq, xar, kp);
        };
        int8_tile<MR>(kp / g, group_dot, sx + r * (kp / g), scales + b * blk_scales, cr + r * ldc + b * 16, ldc);
      });
    }
  }
}

}  // namespace

void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1, float* c,
               int64_t ldc) {
  gemm_int8_ahead<kInt8Ahead, _MM_HINT_T2>(w, a, m, b0, b1, c, ldc);
}

}  // namespace avx2
}  // namespace ktmoe
