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
// u = 128; padded rows: s = 0 / d = 0); a padded kINT4 column holds q = 0 (L = -63,
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
//         w = d[n,G] * L[q], q a 4-bit index, L = kInt4Levels: the 16-level
//         Lloyd-Max quantizer of a unit Gaussian (±0.128 .. ±2.733) scaled so that
//         the outer level is 63 and rounded to integers:
//           L = {-63,-48,-37,-29,-22,-15,-9,-3, 3,9,15,22,29,37,48,63}.
//         d is bf16 (pack.cpp chooses it: a small search, smallest squared error).
//         Non-uniform levels put more of them where Gaussian-like weights are dense;
//         on N(0,1) groups of 32 the error equals the former asymmetric format's
//         (min/max + bf16 offset, 5 bits per weight) with 10 % fewer bytes.
//         Kernels feed u = L[q] + 64 in [1, 127] as the unsigned operand of
//         vpdpbusd / vpmaddubsw (u <= 127 keeps vpmaddubsw's int16 pair sums,
//         2·127·127, below 2^15); the decode of a nibble is one 16-byte table
//         lookup (vpshufb) of kInt4U8.
//         data: per block, kp/8 "k-octets" of 64 bytes. Byte (n%16)*4 + (k%4) of
//         octet j holds quad 2j (k = 8j + k%4) in its low nibble and quad 2j+1
//         (k = 8j + 4 + k%4) in its high nibble. Block stride kp*8 bytes.
//         scales: per block, per group: 16 bf16 d (32 bytes), at scale byte
//         offset  (block*(kp/g) + k/g)*32 + (n%16)*2.
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

namespace ktmoe {

enum class WeightFormat : uint8_t { kBF16 = 0, kINT8 = 1, kINT4 = 2 };
enum class MatrixRole : uint8_t { kPlain = 0, kGateUp = 1, kDown = 2 };

constexpr uint32_t kPackedMagic = 0x574D544Bu;  // "KTMW" little-endian
constexpr uint16_t kPackedVersion = 2;  // 2: kINT4 is the codebook format (1: asymmetric)
constexpr int64_t kBlockN = 16;  // output columns per block
constexpr int64_t kAlignK = 32;  // kp is a multiple of this
constexpr int64_t kDefaultInt4Group = 32;
constexpr int kInt4Levels[16] = {-63, -48, -37, -29, -22, -15, -9, -3, 3, 9, 15, 22, 29, 37, 48, 63};
constexpr int kInt4Offset = 64;  // u = L[q] + 64
constexpr uint8_t kInt4U8[16] = {1, 16, 27, 35, 42, 49, 55, 61, 67, 73, 79, 86, 93, 101, 112, 127};
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
  switch (f) {
    case WeightFormat::kBF16: return kp * kBlockN * 2;
    case WeightFormat::kINT8: return kp * kBlockN;
    case WeightFormat::kINT4: return kp * kBlockN / 2;
  }
  return 0;
}

inline const uint8_t* packed_data(const PackedMatrixHeader* h) {
  return reinterpret_cast<const uint8_t*>(h) + h->data_offset;
}
inline const uint8_t* packed_scales(const PackedMatrixHeader* h) {
  return h->scale_offset ? reinterpret_cast<const uint8_t*>(h) + h->scale_offset : nullptr;
}

}  // namespace ktmoe
