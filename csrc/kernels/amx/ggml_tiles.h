// [NOTE] GGML rows on AMX tiles: amx gemm_ggml's prefill (gemm_ggml_amx.cpp), a template over the TileOps
// policy (the real instructions, or the emulator in tests/native). Plain C++ besides the tile calls.
//
// The weights are the A operand and the activations the B operand, the transpose of the packed formats'
// tiles (gemm_amx.h): a GGUF row keeps its k inputs contiguous, so a type's decoder (GgmlTileRows) writes
// each weight row straight into an A tile row, and only the call's few activation rows are re-laid as
// k-pairs (ActivationTiles, once per call). Per 16 weight rows (a block) and 16 tokens (a token group):
//   C_G[i][t] = Σ_{k in G} codes[i][k] · a[t][k]           one tdpbf16ps per k-group G: 32 inputs (A tiles of
//                                                         64 bytes, B of 16 k-pair rows) or 16 (q6_K: 32, 8)
//   f[i][t]   = fma(s[G][i], C_G[i][t], f)                f from +0, G ascending
//             = fma(o[G][i], xsum[G][t], f)               types with mins (q4_K, q5_K): o = -(dmin · m_G)
//   c[t][i]   = f[i][t]                                   after the last group
// codes are each type's exact small integers as bf16 (q4_K 0..15, q5_K 0..31, q6_K -32..31, q8_0 -128..127,
// iq4_xs / mxfp4 their levels, q4_0 q - 8), s and o the fp32 values gguf's formula rounds once: the avx512
// code kernels' arithmetic (ggml_codes_avx512.h's [NOTE]) on tdpbf16ps's exact products. So a unit
// activation row reads gguf's weight back exactly (one nonzero product: f = round(round(s·q) - m)); random
// rows give fp32 sums within summation's bound (their bits differ from avx512's FMA chains). Each output
// depends only on its weight row and its token row: the same bits for any split of n or m.
// Loop nest: per pair of blocks (the last alone), decode both (L2: 2 x 16 x k bf16, in tile order), then per group
// G the 2 x 2 (or fewer) C tiles, stored and folded into f by the epilogue; a 16 x 16 transpose writes c.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/tile_config.h"
#include "kernels/ggml/ggml_types.h"

namespace ktmoe {
namespace amx {

// How one GGML type's rows become A tiles. decode(w, row_bytes, rows, k, codes, s, o): rows (<= 16) rows of
// w, row_bytes apart, k inputs each -> codes in tile order, [k / group][16][group] bf16 (group G of row i at
// codes + (G · 16 + i) · group: each step's A tile is one contiguous 16 x group block; rows >= `rows` zero), and
// per k-group G s[i · (k / group) + G] (and, with mins, o[i · (k / group) + G]; both 0 for rows >= `rows`).
struct GgmlTileRows {
  int group;  // inputs per scale: 32, or 16
  bool mins;  // the value is s·q + o per group
  void (*decode)(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, uint16_t* codes, float* s,
                 float* o);
};
// The AVX-512 decoder of a type that runs on tiles (ggml_tile_rows.cpp), else nullptr. Call only where the
// CPU runs avx512.
const GgmlTileRows* ggml_tile_rows(GgmlType id);

// The call's m activation rows as B tiles: ntg groups of 16 tokens (tokens past m zero), each k/2 k-pair rows
// of 64 bytes (16 tokens x 2 bf16, token t's pair at bytes 4t); for types with mins, xsum[(tg · ngroups + G) · 16
// + t] = Σ over group G of token 16 tg + t's activations (activation_group_sums; 0 for tokens past m).
struct ActivationTiles {
  const uint8_t* pairs;
  int64_t tg_bytes;  // bytes per token group: k / 2 * 64
  const float* xsum;
  int64_t ntg;       // 1 or 2
};

// xsum of ActivationTiles from its pairs (ntg groups of tg_bytes): per (token group, k-group, token) the fp32 sum
// of the group's activations in input order (each k-pair: the even input, then the odd one). Plain loops over 16
// tokens: vectorized in the amx object, the same order (and bits) everywhere.
inline void activation_group_sums(const uint8_t* pairs, int64_t tg_bytes, int64_t ntg, int64_t k, int group,
                                  float* xsum) {
  const int64_t ngroups = k / group;
  for (int64_t tg = 0; tg < ntg; ++tg)
    for (int64_t g = 0; g < ngroups; ++g) {
      float acc[16] = {};
      for (int64_t j = g * group / 2; j < (g + 1) * group / 2; ++j) {
        uint32_t w[16];
        std::memcpy(w, pairs + tg * tg_bytes + j * 64, 64);
        for (int t = 0; t < 16; ++t) {
          const uint32_t even = w[t] << 16, odd = w[t] & 0xFFFF0000u;
          float fe, fo;
          std::memcpy(&fe, &even, 4);
          std::memcpy(&fo, &odd, 4);
          acc[t] = (acc[t] + fe) + fo;
        }
      }
      std::memcpy(xsum + (tg * ngroups + g) * 16, acc, sizeof acc);
    }
}

template <class T>
struct GgmlTileGemm {
  struct Call {
    const GgmlTileRows& type;
    const ActivationTiles& x;
    int64_t k, ngroups, m, n;
    const uint16_t* codes;  // per block [ngroups][16][group]
    const float* scales;    // per block: s [16][ngroups], then o [16][ngroups]
    float* c;
    int64_t ldc;
  };

  // w: n rows of row_bytes (k inputs), x: the m (<= 32) rows' tiles, c[t * ldc + i] for t < m, i < n.
  static void run(const GgmlTileRows& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                  const ActivationTiles& x, int64_t m, float* c, int64_t ldc) {
    static thread_local std::vector<uint16_t> codes;
    static thread_local std::vector<float> scales;
    const int64_t ngroups = k / type.group;
    codes.resize(size_t(2 * 16 * k));
    scales.resize(size_t(2 * 2 * ngroups * 16));
    Call call{type, x, k, ngroups, m, n, codes.data(), scales.data(), c, ldc};
    T::configure(gemm_tile_config(2 * type.group, type.group / 2));
    const int64_t blocks = (n + 15) / 16;
    for (int64_t b = 0; b < blocks; b += 2) {
      const int nb = b + 1 < blocks ? 2 : 1;
      for (int j = 0; j < nb; ++j) {
        float* s = scales.data() + j * 2 * ngroups * 16;
        type.decode(w + 16 * (b + j) * row_bytes, row_bytes, std::min<int64_t>(16, n - 16 * (b + j)), k,
                    codes.data() + j * 16 * k, s, s + ngroups * 16);
      }
      if (nb == 2) x.ntg == 2 ? block_pair<2, 2>(call, b) : block_pair<2, 1>(call, b);
      else x.ntg == 2 ? block_pair<1, 2>(call, b) : block_pair<1, 1>(call, b);
    }
    T::release();
  }

  // Blocks [b, b + NB) x token groups [0, NT): every group's tiles and epilogue, then c.
  template <int NB, int NT>
  static void block_pair(const Call& k, int64_t b) {
    // C as stored: [16 NB weight rows][32] (token t of group j at 16 j + t), two buffers: group g's tiles are
    // stored to one while the epilogue of group g - 1 reads the other, so the vector epilogue overlaps the tiles'
    // work instead of waiting for the store it has just issued.
    alignas(64) float cbuf[2][32 * 32];
    alignas(64) float f[32 * 32];  // the sum over groups, same layout
    const int group = k.type.group;
    const int64_t a_bytes = 2 * group, a_step = 16 * group, b_step = (group / 2) * 64;
    for (int64_t g = 0; g < k.ngroups; ++g) {
      // gemm_amx.h's 2 x 2 accumulator helpers, its row groups our weight blocks, its blocks our token groups
      using Tiles = TileGemm<T>;
      Tiles::template zero_c<NB, NT>();
      T::template load<tile_a(0)>(k.codes + g * a_step, a_bytes);
      if constexpr (NB == 2) T::template load<tile_a(1)>(k.codes + 16 * k.k + g * a_step, a_bytes);
      T::template load<tile_b(0)>(k.x.pairs + g * b_step, 64);
      if constexpr (NT == 2) T::template load<tile_b(1)>(k.x.pairs + k.x.tg_bytes + g * b_step, 64);
      Tiles::template dots<NB, NT, true>();
      Tiles::template store_c<NB, NT>(reinterpret_cast<int32_t*>(cbuf[g & 1]));
      if (g > 0) epilogue<NB, NT>(k, cbuf[(g - 1) & 1], f, g - 1);
    }
    epilogue<NB, NT>(k, cbuf[(k.ngroups - 1) & 1], f, k.ngroups - 1);
    for (int64_t t = 0; t < k.m; ++t)  // c[t][16 b + i] = f[i][t]
      for (int j = 0; j < NB; ++j) {
        const int rows = int(std::min<int64_t>(16, k.n - 16 * (b + j)));
        float* out = k.c + t * k.ldc + 16 * (b + j);
        for (int i = 0; i < rows; ++i) out[i] = f[(16 * j + i) * 32 + t];
      }
  }

  // f[i][·] = fma(s[g][i], C[i][·], f[i][·]) (f from +0), then + o[g][i] · xsum[g][·] with mins. Loops over whole
  // token columns with one scalar per weight row (vectorized in the amx object).
  template <int NB, int NT>
  static void epilogue(const Call& k, const float* cbuf, float* f, int64_t g) {
    constexpr int kCols = 16 * NT;
    for (int j = 0; j < NB; ++j) {
      const float* s = k.scales + j * 2 * k.ngroups * 16 + g;
      const float* o = s + k.ngroups * 16;
      for (int i = 0; i < 16; ++i) {
        float* __restrict fr = f + (16 * j + i) * 32;
        const float* __restrict cr = cbuf + (16 * j + i) * 32;
        const float si = s[i * k.ngroups];
        if (g == 0)
          for (int col = 0; col < kCols; ++col) fr[col] = std::fma(si, cr[col], 0.f);
        else
          for (int col = 0; col < kCols; ++col) fr[col] = std::fma(si, cr[col], fr[col]);
        if (k.type.mins) {
          const float oi = o[i * k.ngroups];
          for (int tg = 0; tg < NT; ++tg) {
            const float* __restrict xs = k.x.xsum + (tg * k.ngroups + g) * 16;
            for (int t = 0; t < 16; ++t) fr[16 * tg + t] = std::fma(oi, xs[t], fr[16 * tg + t]);
          }
        }
      }
    }
  }
};

// Shape comments: w [n, row_bytes] GGML rows of k inputs; x the tiles of m <= 32 activation rows; c [m, ldc]
// fp32, columns 0 .. n written.
template <class T>
void gemm_ggml_tiles(const GgmlTileRows& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                     const ActivationTiles& x, int64_t m, float* c, int64_t ldc) {
  GgmlTileGemm<T>::run(type, w, row_bytes, n, k, x, m, c, ldc);
}

}  // namespace amx
}  // namespace ktmoe
