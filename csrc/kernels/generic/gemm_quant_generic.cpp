// [NOTE] Generic int8 / int4 gemms over packed kINT8 / kINT4 weights and int8
// activation rows (portable C++17, the oracle).
//
// For rows m < M and the output columns j of blocks [b0, b1) (n = 16*b0 + j):
//   kINT8, one group (g = kp):  c[m][j] = (sx[m] * s[n]) * I,   I = Σ_k (u[n][k] - 128) · xq[m][k]
//   kINT8, groups:  acc = fma(s[n,G] * sx[m,G], I_G, acc) over G in order, c[m][j] = acc,
//           I_G = Σ_{k in G} (u[n][k] - 128) · xq[m][k]   (std::fma: the bits of every ISA's fma;
//           the activations have a scale per (row, group) too: kPerWeightGroup)
//   kINT4:  c[m][j] = sx[m] * Σ_G d[n,G] · I_G,
//           I_G = Σ_{k in G} L[q[n][k]] · xq[m][k],  groups G in increasing order
//           (L = kInt4Levels; I_G equals the format's Σ u·xq − 64·gsum exactly).
// (Σ (u-128)·xq equals the format's Σ u·xq − 128·Σ xq exactly; the int8 gsum is
// not needed here.)
//
// How: like the bf16 gemm, each block is walked in panels of kPanelK k values
// decoded once to fp32 [kPanelK][16] (int8: u - 128; int4: the level L[q]) and
// multiplied into every row of a row tile. The dot products are integers: each
// product and every partial sum of one panel is an integer of magnitude below
// kPanelK·127·127 < 2^24 (|L| <= 64), so the fp32 panel sums are *exact*; each is converted to
// int32 and added to the row's integer accumulator. The integer results are thus
// exactly those of the format (int32), as on every other ISA; only the fp32
// epilogue (written above, left to right) rounds. Any (b0, b1) split or thread
// gives the same bits. One tile loop (gemm_grouped) serves both formats; Int8Groups
// and Int4Groups supply the panel decoder and the group epilogue.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/generic/bf16_scalar.h"
#include "kernels/generic/generic_kernels.h"

namespace ktmoe {
namespace generic {
namespace {

// panel[c][j] = u[j][k0 + c] - 128 for c < kc; `quads` points at k-quad k0/4 of a block.
void decode_int8_panel(const uint8_t* quads, int64_t kc, float* panel) {
  uint32_t v[kBlockN];  // column j's 4 bytes: k = 4p + t in byte t
  for (int64_t p = 0; p < kc / 4; ++p) {
    std::memcpy(v, quads + p * 64, sizeof(v));
    for (int64_t t = 0; t < 4; ++t) {
      float* dst = panel + (4 * p + t) * kBlockN;
      for (int64_t j = 0; j < kBlockN; ++j)
        dst[j] = static_cast<float>(static_cast<int32_t>((v[j] >> (8 * t)) & 0xFFu) - 128);
    }
  }
}

// panel[c][j] = L[q[j][k0 + c]] for c < kc (k0 and kc multiples of 8); `octets`
// points at k-octet k0/8: byte 4j+t holds k = 8o+t (low nibble), 8o+4+t (high).
void decode_int4_panel(const uint8_t* octets, int64_t kc, float* panel) {
  uint32_t v[kBlockN];
  for (int64_t o = 0; o < kc / 8; ++o) {
    std::memcpy(v, octets + o * 64, sizeof(v));
    for (int64_t t = 0; t < 8; ++t) {  // t < 4: low nibbles of byte t; t >= 4: high nibbles of byte t-4
      const int shift = 8 * (t % 4) + 4 * (t / 4);
      float* dst = panel + (8 * o + t) * kBlockN;
      for (int64_t j = 0; j < kBlockN; ++j)
        dst[j] = static_cast<float>(kInt4Levels[(v[j] >> shift) & 0xFu]);
    }
  }
}

// xf[c] = xq[c] for c < kc.
void widen_row(const int8_t* xq, int64_t kc, float* xf) {
  for (int64_t c = 0; c < kc; ++c) xf[c] = static_cast<float>(xq[c]);
}

// iacc[j] += Σ_c xf[c] * panel[c][j], exactly (see [NOTE]).
void panel_idot(const float* panel, const float* xf, int64_t kc, int32_t* iacc) {
  alignas(64) float part[kBlockN] = {};
  panel_madd(panel, xf, kc, part);
  for (int64_t j = 0; j < kBlockN; ++j) iacc[j] += static_cast<int32_t>(part[j]);
}

// The format-specific parts of the one tile loop below (gemm_grouped).
struct Int8Groups {
  const uint8_t* data;
  const float* s;  // per (block, group) 16 fp32; one group: s[n]
  int64_t kp, ngroups;
  const float* sx;  // activation scales [m, ngroups]: one per (row, group)
  bool one_group() const { return ngroups == 1; }
  const uint8_t* block(int64_t b) const { return data + b * block_data_bytes(WeightFormat::kINT8, kp); }
  void panel(const uint8_t* block, int64_t k0, int64_t kc, float* out) const {
    decode_int8_panel(block + (k0 / 4) * 64, kc, out);
  }
  // acc[r] = fma(s[n,G] * sx[r0 + r, G], I_G, acc[r]) for each row r < mt.
  void add_group(int64_t b, int64_t G, const int32_t (*iacc)[kBlockN], float (*acc)[kBlockN], int64_t r0,
                 int64_t mt) const {
    const float* sg = s + (b * ngroups + G) * kBlockN;
    for (int64_t r = 0; r < mt; ++r) {
      const float sxg = sx[(r0 + r) * ngroups + G];
      for (int64_t j = 0; j < kBlockN; ++j)
        acc[r][j] = std::fma(sg[j] * sxg, static_cast<float>(iacc[r][j]), acc[r][j]);
    }
  }
  float row_result(int64_t, float acc) const { return acc; }  // the activation scales are in acc
  // One group: c = (sx * s[n]) * I.
  float whole_row(int64_t b, int64_t j, int64_t row, int32_t i) const {
    return (sx[row] * s[b * kBlockN + j]) * static_cast<float>(i);
  }
};

struct Int4Groups {
  const uint8_t* data;
  const uint8_t* scales;  // per (block, group) 16 bf16 d
  int64_t kp, ngroups;
  const float* sx;  // activation scales [m]: one per row
  bool one_group() const { return false; }
  const uint8_t* block(int64_t b) const { return data + b * block_data_bytes(WeightFormat::kINT4, kp); }
  void panel(const uint8_t* block, int64_t k0, int64_t kc, float* out) const {
    decode_int4_panel(block + (k0 / 8) * 64, kc, out);
  }
  // acc[r] += d[n,G] * I_G for each row r < mt.
  void add_group(int64_t b, int64_t G, const int32_t (*iacc)[kBlockN], float (*acc)[kBlockN], int64_t,
                 int64_t mt) const {
    const uint8_t* sc = scales + (b * ngroups + G) * kInt4ScaleBytes;
    alignas(64) float d[kBlockN];
    for (int64_t j = 0; j < kBlockN; ++j) d[j] = bf16_to_f32(static_cast<uint16_t>(sc[2 * j] | (sc[2 * j + 1] << 8)));
    for (int64_t r = 0; r < mt; ++r)
      for (int64_t j = 0; j < kBlockN; ++j) acc[r][j] += d[j] * static_cast<float>(iacc[r][j]);
  }
  float row_result(int64_t row, float acc) const { return sx[row] * acc; }
  float whole_row(int64_t, int64_t, int64_t, int32_t) const { return 0.f; }  // never: int4 always has groups
};

// The tile loop of both formats: per block, row tile and group, exact integer panel dots into iacc,
// then the format's group epilogue into acc (or, with one group, the whole-row one); c = the format's
// row result of acc (int4: sx * acc; int8: acc, its activation scales applied per group).
template <class Fmt>
void gemm_grouped(const Fmt& fmt, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1, float* c,
                  int64_t ldc) {
  const int64_t g = fmt.kp / fmt.ngroups;
  alignas(64) float panel[kPanelK * kBlockN];
  alignas(64) float xf[kPanelK];
  alignas(64) int32_t iacc[kRowTile][kBlockN];
  alignas(64) float acc[kRowTile][kBlockN];
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* block = fmt.block(b);
    for (int64_t r0 = 0; r0 < m; r0 += kRowTile) {
      const int64_t mt = std::min(kRowTile, m - r0);
      for (int64_t r = 0; r < mt; ++r) std::fill(acc[r], acc[r] + kBlockN, 0.f);
      for (int64_t G = 0; G < fmt.ngroups; ++G) {
        for (int64_t r = 0; r < mt; ++r) std::fill(iacc[r], iacc[r] + kBlockN, 0);
        for (int64_t k0 = G * g; k0 < (G + 1) * g; k0 += kPanelK) {
          const int64_t kc = std::min(kPanelK, (G + 1) * g - k0);
          fmt.panel(block, k0, kc, panel);
          for (int64_t r = 0; r < mt; ++r) {
            widen_row(a.q + (r0 + r) * a.ldq + k0, kc, xf);
            panel_idot(panel, xf, kc, iacc[r]);
          }
        }
        if (fmt.one_group()) break;  // iacc is the whole row: the whole-row epilogue below
        fmt.add_group(b, G, iacc, acc, r0, mt);
      }
      for (int64_t r = 0; r < mt; ++r) {
        float* cr = c + (r0 + r) * ldc + (b - b0) * kBlockN;
        for (int64_t j = 0; j < kBlockN; ++j)
          cr[j] = fmt.one_group() ? fmt.whole_row(b, j, r0 + r, iacc[r][j]) : fmt.row_result(r0 + r, acc[r][j]);
      }
    }
  }
}

}  // namespace

// w: kINT8 [np/16][kp/4][16][4] u8 + per (block, group) 16 fp32 s; a: int8 rows [m, ldq] +
// scale [m, kp / group]; c: fp32 [m, ldc], columns [0, 16*(b1-b0)) written.
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  const Int8Groups fmt{packed_data(w), reinterpret_cast<const float*>(packed_scales(w)), w->kp, w->kp / w->group,
                       a.scale};
  gemm_grouped(fmt, a, m, b0, b1, c, ldc);
}

// w: kINT4 [np/16][kp/8][16][4] nibbles + per (block, group) 16 bf16 d;
// a: int8 rows [m, ldq] + scale[m] (the group sums are not needed here);
// c: fp32 [m, ldc], columns [0, 16*(b1-b0)) written.
void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  const Int4Groups fmt{packed_data(w), packed_scales(w), w->kp, w->kp / w->group, a.scale};
  gemm_grouped(fmt, a, m, b0, b1, c, ldc);
}

}  // namespace generic
}  // namespace ktmoe
