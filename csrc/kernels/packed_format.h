// [NOTE] Packed expert weights: the one layout every ISA path reads.
//
// One packed *matrix* is one expert's dense weight W [n, k] (n outputs, k inputs,
// row-major, the nn.Linear layout). It is stored as a self-describing blob:
//
//   [PackedMatrixHeader: 64 bytes][data ... aligned 64][scales ... aligned 64]
//
// The blob of every expert of a layer has the same size (header.total_bytes), so a
// layer's matrix is a uint8 tensor [E, total_bytes]: row e is expert e. The layout
// is described by the header (format, role, sizes), never by flags passed around.
//
// Padding. np = round_up(n, 16), kp = round_up(k, 32) (kINT4: round_up(k, group),
// so groups tile kp). Padded weights are 0 where the format can say so (kINT8:
// u = 128; padded rows: s = 0 / d = 0); a padded kINT4 column holds q = 0 (L = -64,
// the codebook has no 0), so kernels zero-fill padded activation columns, which
// makes every padded term vanish.
//
// Column blocks. Outputs are grouped in blocks of 16 consecutive columns
// (block b = outputs 16b .. 16b+15). Block b's data is contiguous and blocks are
// stored in order; inside a block the K dimension is the outer loop.
//
// Role kGateUp (the fused gate/up matrix of an expert, HF gate_up_proj [2I, H]):
//   n = 2*I, ip = round_up(I, 16), np = 2*ip. Blocks are interleaved
//   gate-block 0, up-block 0, gate-block 1, up-block 1, ...: packed block 2j holds
//   gate rows 16j..16j+15 and packed block 2j+1 holds up rows 16j..16j+15
//   (HF rows I+16j .. I+16j+15). So one pair of adjacent blocks gives everything
//   needed for 16 columns of silu(gate) * up.
// Role kDown / kPlain: block b holds rows 16b .. 16b+15 of W.
//
// Formats (value of a weight w[n][k]):
//
//  kBF16  data: per block, kp/2 "k-pairs", each 16 columns x 2 bf16 (64 bytes):
//         bf16 at byte offset  block*(kp*32) + (k/2)*64 + (n%16)*4 + (k%2)*2
//         (the VNNI pair layout vdpbf16ps reads). No scales. Activations: bf16.
//
//  kINT8  per-output-channel symmetric: s[n] = max_k |w[n][k]| / 127,
//         wq = round(w / s) in [-127, 127], stored *unsigned* as u = wq + 128 (u8).
//         data: per block, kp/4 "k-quads", each 16 columns x 4 u8 (64 bytes):
//         u8 at byte offset  block*(kp*16) + (k/4)*64 + (n%16)*4 + (k%4)
//         (the layout vpdpbusd reads). scales: float s[np] (0 for padded rows).
//         w = s[n] * (u - 128).
//
//  kINT4  group-wise, a 16-level codebook with one scale per group, 4.5 bits per
//         weight at the default group g = header.group = 32 (a multiple of 32).
//         w = d[n,G] * L[q], q a 4-bit index, L = kInt4Levels:
//           L = {-64,-46,-35,-27,-20,-14,-8,-3, 2,8,14,20,27,35,45,56},
//         a 16-level quantizer fitted (Lloyd iterations) to groups of 32 drawn from
//         Gaussian and Student-t(3, 6) weights, each group scaled so that its largest
//         magnitude lands on -64, then rounded to integers. It is asymmetric on
//         purpose: d is signed (bf16), so a group puts its largest-magnitude weight,
//         of either sign, on the long -64 side (d > 0 for a negative one, d < 0 for a
//         positive one) and the other side has 8 levels up to 56·|d|. pack.cpp
//         chooses d by a small search (smallest squared error, both signs).
//         Measured against the symmetric Gaussian Lloyd-Max codebook (±63, one sign):
//         relative weight error 0.0735 vs 0.0766 on N(0,1), 0.0971 vs 0.1096 on
//         Student-t(3) weights (groups of 32).
//         Kernels feed u = L[q] + 64 in [0, 120] as the unsigned operand of
//         vpdpbusd / vpmaddubsw (u <= 127 keeps vpmaddubsw's int16 pair sums,
//         2·127·127, below 2^15); the decode of a nibble is one 16-byte table
//         lookup (vpshufb) of kInt4U8.
//         data: per block, kp/8 "k-octets" of 64 bytes. Byte (n%16)*4 + (k%4) of
//         octet j holds quad 2j (k = 8j + k%4) in its low nibble and quad 2j+1
//         (k = 8j + 4 + k%4) in its high nibble. Block stride kp*8 bytes.
//         scales: per block, per group: 16 bf16 d (32 bytes), at scale byte
//         offset  (block*(kp/g) + k/g)*32 + (n%16)*2.
//
//  kFP8   e4m3 bytes x fp32 scales per (column, k-group), bf16 activations: fp8_format.h.
//
//  kINT4A ("int4_affine") linear 4-bit codes q in [0, 15] x an fp32 scale s and a u8 zero
//         point z per (column, k-group), w = s * (q - z), bf16 activations (W4A16), exact for
//         int4 checkpoints (compressed-tensors, GPTQ, AWQ): int4_affine_format.h. Data: per
//         block, kp/4 "k-quads" of 32 bytes, byte (n%16)*2 + (k%2) of quad j holding input
//         4j + k%2 (low nibble) and 4j + 2 + k%2 (high nibble): the low nibbles are a k-pair in
//         the VNNI pair layout, the high nibbles the next one. Scales: per (block, group) an
//         80-byte record, 16 fp32 s then 16 u8 z. kp = round_up(k, group), group % 32 == 0.
//
// Activations for kINT8 / kINT4 are int8 per row (token): sx = max|x| / 127,
// xq = round(x / sx) (signed), plus per-group sums of xq (group = header.group;
// for kINT8 group = kp, one sum). Then
//   kINT8:  y[n] = sx * s[n] * (Σ_k u·xq − 128·Σ_k xq)
//   kINT4:  y[n] = sx * Σ_G d[n,G]·( Σ_{k∈G} u·xq − 64·Σ_{k∈G} xq )   (= Σ L[q]·xq)
// Integer dot products are exact (int32), so every ISA path gives the same
// integers; only the float epilogue may differ in rounding.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/weight_formats.h"

namespace ktmoe {

// WeightFormat and each format's traits (sizes, scales, kernels): weight_formats.h.
enum class MatrixRole : uint8_t { kPlain = 0, kGateUp = 1, kDown = 2 };

constexpr uint32_t kPackedMagic = 0x574D544Bu;  // "KTMW" little-endian
constexpr uint16_t kPackedVersion = 3;  // kINT4 is: 3 the signed codebook, 2 a symmetric one, 1 min/max
constexpr int64_t kBlockN = 16;  // output columns per block
constexpr int64_t kAlignK = 32;  // kp is a multiple of this
constexpr int64_t kDefaultInt4Group = 32;
constexpr int kInt4Levels[16] = {-64, -46, -35, -27, -20, -14, -8, -3, 2, 8, 14, 20, 27, 35, 45, 56};
constexpr int kInt4Offset = 64;  // u = L[q] + 64
constexpr uint8_t kInt4U8[16] = {0, 18, 29, 37, 44, 50, 56, 61, 66, 72, 78, 84, 91, 99, 109, 120};
constexpr int64_t kInt4ScaleBytes = 32;  // one (block, group) scale record: 16 bf16 d

struct PackedMatrixHeader {
  uint32_t magic;        // kPackedMagic
  uint16_t version;      // kPackedVersion
  uint8_t format;        // WeightFormat
  uint8_t role;          // MatrixRole
  int32_t n, k;          // logical rows (outputs) and columns (inputs)
  int32_t np, kp;        // padded: np multiple of 16 (2*round_up(I,16) for kGateUp), kp of 32 and group
  int32_t group;         // kINT4: group size; kINT8: kp; kBF16: 0
  int32_t reserved;      // 0
  int64_t data_offset;   // bytes from the header start to the data (64)
  int64_t scale_offset;  // bytes from the header start to the scales (0: none)
  int64_t total_bytes;   // whole blob, a multiple of 64: the row stride of [E, total_bytes]
  uint8_t pad[8];
};
static_assert(sizeof(PackedMatrixHeader) == 64, "packed header must be 64 bytes");

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Bytes of one block's data for a format (kp = padded k).
inline int64_t block_data_bytes(WeightFormat f, int64_t kp) {
  return kp * kBlockN * format_traits(f).code_bits / 8;
}

inline const uint8_t* packed_data(const PackedMatrixHeader* h) {
  return reinterpret_cast<const uint8_t*>(h) + h->data_offset;
}
inline const uint8_t* packed_scales(const PackedMatrixHeader* h) {
  return h->scale_offset ? reinterpret_cast<const uint8_t*>(h) + h->scale_offset : nullptr;
}

}  // namespace ktmoe
