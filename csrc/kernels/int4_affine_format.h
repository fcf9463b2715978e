// [NOTE] The kINT4A ("int4_affine") packed format: linear 4-bit codes with an fp32
// scale and an integer zero point per (output row, k-group), W4A16.
//
// What it stores. w[n][k] = s[n,G] * (q[n][k] - z[n,G]), q in [0, 15], z in [0, 16],
// G = k / group. That is every common int4 checkpoint, bit-exactly after dequantization:
//   compressed-tensors pack-quantized, symmetric: bf16 s, z = 8 (w = s * (q - 8));
//   GPTQ / AWQ, asymmetric: fp16 s, integer z (GPTQ v1 stores z - 1; the reader adds 1).
// s is stored as fp32 (bf16 / fp16 widen exactly) and z as one byte. Activations are
// bf16 rows (as kBF16 / kFP8): int8 activations would not meet the bf16 bound.
//
// Layout (packed_format.h's conventions: blocks of 16 output columns, kGateUp blocks
// interleaved gate / up; kp = round_up(k, group), group a multiple of 32):
//   data: per block, kp/4 "k-quads" of 32 bytes (16 columns x 4 inputs x 4 bits). Byte
//         (n%16)*2 + (k%2) of quad j holds input 4j + k%2 in its low nibble and input
//         4j + 2 + k%2 in its high nibble, so the low nibbles of the 32 bytes are k-pair
//         2j and the high nibbles k-pair 2j+1, each in the VNNI pair layout vdpbf16ps
//         reads (word (n%16)*2 + k%2). The code of w[n][k] is at byte
//           block*(kp*8) + (k/4)*32 + (n%16)*2 + (k%2),  nibble (k/2)%2.
//         Padded inputs and rows hold q = 0.
//   scales: per block, per k-group, one 80-byte record: 16 fp32 s (one per column) then
//         16 u8 z; record (block*(kp/group) + G) at scale byte offset record*80, s of
//         column j at +4j, z at +64+j. Padded rows: s = 0, z = 0.
//   value: w = s*q + o with o = -s*z (fp32; exact for a bf16 / fp16 s, whose <= 11
//         significant bits times z <= 16 fit fp32's 24), and, per output column,
//           y[m][n] = Σ_G ( s[n,G] · Σ_{k∈G} a[m][k]·q[n][k]  +  o[n,G] · Σ_{k∈G} a[m][k] )
//         each group's two sums in fp32 (a bf16 times a code <= 15 is exact in fp32),
//         xsum_G = Σ_{k∈G} a[m][k] computed once per row and group, then two multiply-adds.
//   4 + 40/group bits per weight: 4.3125 at group 128, 5.25 at group 32.
//
// Kernels decode a nibble to the bf16 of q (a 32-entry word table, bf16(i % 16)), exact.
// From dense weights (pack.cpp), per (row, group) of valid values v, GPTQ's min/max:
//   lo = min(v, 0), hi = max(v, 0), s = bf16((hi - lo) / 15), z = clamp(round(-lo / s), 0, 15),
//   q = clamp(round(v / s) + z, 0, 15) (rounding half to even); s = 0: q = z = 0. The bf16 s
//   (compressed-tensors' own) keeps s * (q - z) exact, so repacking unpacked weights is the identity.
#pragma once
#include <cstdint>

#include "kernels/packed_format.h"

namespace ktmoe {

// The default group: GPTQ / AWQ's 128.
constexpr int64_t kInt4AffineDefaultGroup = 128;
// One (block, group) record: 16 fp32 s + 16 u8 z.
constexpr int64_t kInt4AffineRecordBytes = 80;
constexpr int64_t kInt4AffineZeroAt = 64;  // z's offset inside a record
constexpr int kInt4AffineMaxZero = 16;
constexpr int kInt4AffineSymmetricZero = 8;  // a checkpoint without zero points: w = s * (q - 8)

// Bytes of one block's data: kp inputs x 16 columns x 4 bits.
inline int64_t int4a_block_data_bytes(int64_t kp) { return kp * kBlockN / 2; }
// Byte of the code of packed row pr (= 16*block + column), input k, from the start of the data;
// the code is its low nibble for (k/2) % 2 == 0, else its high nibble.
inline int64_t int4a_data_offset(int64_t kp, int64_t pr, int64_t k) {
  return (pr / kBlockN) * int4a_block_data_bytes(kp) + (k / 4) * 32 + (pr % kBlockN) * 2 + (k % 2);
}
inline int int4a_nibble_shift(int64_t k) { return (k / 2) % 2 ? 4 : 0; }
// Byte of the (block, group) record of packed row pr's block, from the start of the scales.
inline int64_t int4a_record_offset(int64_t kp, int64_t group, int64_t pr, int64_t g) {
  return ((pr / kBlockN) * (kp / group) + g) * kInt4AffineRecordBytes;
}
// Bytes of all scales of a matrix with np packed rows.
inline int64_t int4a_scale_bytes(int64_t np, int64_t kp, int64_t group) {
  return (np / kBlockN) * (kp / group) * kInt4AffineRecordBytes;
}

// The packed row of dense row r (kGateUp: gate rows 0..I-1, up rows I..2I-1 interleaved by block).
inline int64_t int4a_packed_row(const PackedMatrixHeader& h, int64_t r) {
  if (h.role != static_cast<uint8_t>(MatrixRole::kGateUp)) return r;
  const int64_t inter = h.n / 2, up = r >= inter, i = up ? r - inter : r;
  return 2 * kBlockN * (i / kBlockN) + up * kBlockN + i % kBlockN;
}

// avx512's int16 decode (gemm_nibble_int16_avx512.cpp): entry i is 2·(i % 16), the code doubled (the
// kernel shares mxfp4's activation scale 2^-(s + 1)).
struct Int4AffineI16Table {
  alignas(64) int16_t v[32] = {};
  constexpr Int4AffineI16Table() {
    for (int i = 0; i < 32; ++i) v[i] = int16_t(2 * (i % 16));
  }
};
constexpr Int4AffineI16Table kInt4AffineI16;

// Kernels' nibble decode: entry i is the bf16 of i % 16 (a word index's low 5 bits).
struct Int4AffineBf16Table {
  alignas(64) uint16_t v[32] = {};
  constexpr Int4AffineBf16Table() {
    for (int i = 0; i < 32; ++i) {
      const int q = i % 16;
      if (q == 0) continue;
      int e = 0;
      while ((q >> (e + 1)) != 0) ++e;  // q = 1.f * 2^e
      v[i] = uint16_t(((127 + e) << 7) | ((q << (7 - e)) & 0x7F));
    }
  }
};
constexpr Int4AffineBf16Table kInt4AffineBf16;

}  // namespace ktmoe
