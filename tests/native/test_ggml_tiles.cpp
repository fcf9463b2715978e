// GGML rows on AMX tiles (kernels/amx/ggml_tiles.h, amx/gemm_ggml_amx.cpp). On every host the tile emulator runs
// the loop nest over codes and scales decoded by a portable decoder written here from ggml's block layouts (byte
// offsets spelled out, not taken from ggml_blocks.h) and activation tiles laid out here; the result is held to
// the type's exact decoder (ggml_decode.cpp) as test_ggml.cpp holds every ISA: unit rows read the weights
// back exactly, random rows within fp32 summation's bound. Where the CPU runs avx512, the library's decoders
// (ggml_tile_rows.cpp, the ones the real tiles use) must write the portable codes and scales byte for byte;
// where it has AMX, the amx table's gemm_ggml must give the emulator's bits.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/amx/ggml_tiles.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_emulated.h"
#include "kernels/generic/f16_scalar.h"
#include "tests.h"

namespace ktmoe_test {
namespace {

const int8_t kIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t kMX2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
int nibble32(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }
uint16_t bf16_of_int(int v) { return uint16_t(f32_bits(float(v)) >> 16); }

// One row: code of input e, and s / o of its group (group = 32, or 16 for q6_K).
struct Portable {
  int group;
  bool mins;
  int (*code)(const uint8_t* row, int64_t e);
  void (*scales)(const uint8_t* row, int64_t g, float* s, float* o);
};

void q4k_sm(const uint8_t* sc, int j, int* s, int* m) {  // ggml's get_scale_min_k4
  if (j < 4) *s = sc[j] & 63, *m = sc[j + 4] & 63;
  else *s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4), *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
}

const Portable* portable(GgmlType t) {
  static const Portable q8_0{32, false, [](const uint8_t* r, int64_t e) { return int(int8_t(r[34 * (e / 32) + 2 + e % 32])); },
                             [](const uint8_t* r, int64_t g, float* s, float*) { *s = f16_at(r + 34 * g); }};
  static const Portable q4_0{32, false, [](const uint8_t* r, int64_t e) { return nibble32(r + 18 * (e / 32) + 2, int(e % 32)) - 8; },
                             [](const uint8_t* r, int64_t g, float* s, float*) { *s = f16_at(r + 18 * g); }};
  static const Portable iq4_nl{32, false, [](const uint8_t* r, int64_t e) { return int(kIQ4[nibble32(r + 18 * (e / 32) + 2, int(e % 32))]); },
                               [](const uint8_t* r, int64_t g, float* s, float*) { *s = f16_at(r + 18 * g); }};
  static const Portable mxfp4{32, false, [](const uint8_t* r, int64_t e) { return int(kMX2[nibble32(r + 17 * (e / 32) + 1, int(e % 32))]); },
                              [](const uint8_t* r, int64_t g, float* s, float*) { *s = std::ldexp(1.f, int(r[17 * g]) - 128); }};
  static const Portable q4_K{
      32, true,
      [](const uint8_t* r, int64_t e) {
        const uint8_t* b = r + 144 * (e / 256);
        const int j = int(e % 256) / 32, l = int(e % 32);
        return (b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
      },
      [](const uint8_t* r, int64_t g, float* s, float* o) {
        const uint8_t* b = r + 144 * (g / 8);
        int sc, m;
        q4k_sm(b + 4, int(g % 8), &sc, &m);
        *s = f16_at(b) * float(sc), *o = -(f16_at(b + 2) * float(m));
      }};
  static const Portable q5_K{
      32, true,
      [](const uint8_t* r, int64_t e) {
        const uint8_t* b = r + 176 * (e / 256);
        const int j = int(e % 256) / 32, l = int(e % 32);
        return ((b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15) | ((b[16 + l] >> j) & 1) << 4;
      },
      [](const uint8_t* r, int64_t g, float* s, float* o) {
        const uint8_t* b = r + 176 * (g / 8);
        int sc, m;
        q4k_sm(b + 4, int(g % 8), &sc, &m);
        *s = f16_at(b) * float(sc), *o = -(f16_at(b + 2) * float(m));
      }};
  static const Portable q6_K{
      16, false,
      [](const uint8_t* r, int64_t e) {
        const uint8_t* b = r + 210 * (e / 256);
        const int i = int(e % 256), h = i / 128, s = (i / 64) % 2, l = i % 64, t = 2 * s + l / 32;
        return (((b[64 * h + l] >> (4 * s)) & 15) | ((b[128 + 32 * h + l % 32] >> (2 * t)) & 3) << 4) - 32;
      },
      [](const uint8_t* r, int64_t g, float* s, float*) {
        const uint8_t* b = r + 210 * (g / 16);
        *s = f16_at(b + 208) * float(int8_t(b[192 + g % 16]));
      }};
  static const Portable iq4_xs{
      32, false,
      [](const uint8_t* r, int64_t e) {
        const uint8_t* b = r + 136 * (e / 256);
        const int j = int(e % 256) / 32;
        return int(kIQ4[nibble32(b + 8 + 16 * j, int(e % 32))]);
      },
      [](const uint8_t* r, int64_t g, float* s, float*) {
        const uint8_t* b = r + 136 * (g / 8);
        const int j = int(g % 8);
        uint16_t sh;
        std::memcpy(&sh, b + 2, 2);
        *s = f16_at(b) * float((((b[4 + j / 2] >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4) - 32);
      }};
  static const Portable q2_K{
      16, true,
      [](const uint8_t* r, int64_t e) {
        const uint8_t* b = r + 84 * (e / 256);
        const int i = int(e % 256);
        return (b[16 + 32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
      },
      [](const uint8_t* r, int64_t g, float* s, float* o) {
        const uint8_t* b = r + 84 * (g / 16);
        const int sc = b[g % 16];
        *s = f16_at(b + 80) * float(sc & 15), *o = -(f16_at(b + 82) * float(sc >> 4));
      }};
  static const Portable q3_K{
      16, false,
      [](const uint8_t* r, int64_t e) {
        const uint8_t* b = r + 110 * (e / 256);
        const int i = int(e % 256), l = i % 32;
        return ((b[32 + 32 * (i / 128) + l] >> (2 * ((i / 32) % 4))) & 3) - ((b[l] >> (i / 32)) & 1 ? 0 : 4);
      },
      [](const uint8_t* r, int64_t g, float* s, float*) {
        const uint8_t* b = r + 110 * (g / 16);
        const int j = int(g % 16);
        const int lo = (b[96 + j % 8] >> (4 * (j / 8))) & 15, hi = (b[104 + j % 4] >> (2 * (j / 4))) & 3;
        *s = f16_at(b + 108) * float((lo | hi << 4) - 32);
      }};
  switch (t) {
    case GgmlType::kQ2_K: return &q2_K;
    case GgmlType::kQ3_K: return &q3_K;
    case GgmlType::kQ8_0: return &q8_0;
    case GgmlType::kQ4_0: return &q4_0;
    case GgmlType::kIQ4_NL: return &iq4_nl;
    case GgmlType::kMXFP4: return &mxfp4;
    case GgmlType::kQ4_K: return &q4_K;
    case GgmlType::kQ5_K: return &q5_K;
    case GgmlType::kQ6_K: return &q6_K;
    case GgmlType::kIQ4_XS: return &iq4_xs;
    default: return nullptr;
  }
}

// The emulated loop nest reads the decoder through a plain function pointer: the type under test.
const Portable* g_portable = nullptr;
void portable_decode(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, uint16_t* codes, float* s,
                     float* o) {
  const Portable& p = *g_portable;
  for (int64_t i = 0; i < 16; ++i)  // tile order: group G of row i at (G * 16 + i) * group
    for (int64_t e = 0; e < k; ++e)
      codes[((e / p.group) * 16 + i) * p.group + e % p.group] = i < rows ? bf16_of_int(p.code(w + i * row_bytes, e)) : 0;
  for (int64_t g = 0; g < k / p.group; ++g)
    for (int64_t i = 0; i < 16; ++i) {
      float sv = 0.f, ov = 0.f;
      if (i < rows) p.scales(w + i * row_bytes, g, &sv, &ov);
      s[i * (k / p.group) + g] = sv;
      if (p.mins) o[i * (k / p.group) + g] = ov;
    }
}

// a [m <= 32, lda] -> k-pair tiles (token t's pair j at pairs[tg][j][t]) and, with mins, the header's group sums.
struct Tiles {
  std::vector<uint8_t> pairs;
  std::vector<float> xsum;
  amx::ActivationTiles x;
};
Tiles portable_tiles(const std::vector<uint16_t>& a, int64_t lda, int64_t m, int64_t k, int group, bool mins) {
  Tiles t;
  const int64_t ntg = (m + 15) / 16, tg_bytes = k / 2 * 64;
  t.pairs.assign(size_t(ntg * tg_bytes), 0);
  for (int64_t tok = 0; tok < m; ++tok)
    for (int64_t j = 0; j < k / 2; ++j)
      std::memcpy(&t.pairs[size_t((tok / 16) * tg_bytes + j * 64 + 4 * (tok % 16))], &a[size_t(tok * lda + 2 * j)], 4);
  if (mins) {
    t.xsum.assign(size_t(ntg * (k / group) * 16), 0.f);
    amx::activation_group_sums(t.pairs.data(), tg_bytes, ntg, k, group, t.xsum.data());
  }
  t.x = {t.pairs.data(), tg_bytes, mins ? t.xsum.data() : nullptr, ntg};
  return t;
}

// c [m, n] through the emulated tiles over the portable decode, in passes of 32 rows as the amx entry runs.
std::vector<float> emulated(const GgmlTypeTraits& t, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                            const std::vector<uint16_t>& a, int64_t lda, int64_t m) {
  const Portable& p = *portable(t.id);
  g_portable = &p;
  const amx::GgmlTileRows rows{p.group, p.mins, portable_decode};
  std::vector<float> c(size_t(m * n), -1.f);
  for (int64_t r0 = 0; r0 < m; r0 += 32) {
    const int64_t mt = std::min<int64_t>(32, m - r0);
    const std::vector<uint16_t> part(a.begin() + r0 * lda, a.begin() + (r0 + mt) * lda);
    const Tiles x = portable_tiles(part, lda, mt, k, p.group, p.mins);
    amx::gemm_ggml_tiles<amx::EmulatedTileOps>(rows, w, row_bytes, n, k, x.x, mt, c.data() + r0 * n, n);
  }
  return c;
}

void test_type(const IsaKernels* vec512, const IsaKernels* tiles, GgmlType type, Rng& rng) {
  const GgmlTypeTraits& t = *find_ggml_type(uint32_t(type));
  const Portable& p = *portable(type);
  const int64_t k = t.block_elems == 256 ? 512 : 96, n = 37, row_bytes = k / t.block_elems * t.block_bytes;
  const std::string what = strf("amx ggml tiles %s n=%lld k=%lld", t.name, (long long)n, (long long)k);
  const std::vector<uint8_t> buf = random_ggml_rows(type, n, k, 0, rng);
  const uint8_t* w = buf.data();
  std::vector<float> wv(size_t(n * k));
  for (int64_t i = 0; i < n; ++i) t.decode(w + i * row_bytes, k / t.block_elems, wv.data() + i * k);
  // the library's decoders: the portable codes and scales, byte for byte (rows past n zero)
  if (vec512) {
    const amx::GgmlTileRows* lib = amx::ggml_tile_rows(type);
    g_portable = &p;
    const int64_t ng = k / p.group;
    bool same = lib && lib->group == p.group && lib->mins == p.mins;
    for (int64_t b = 0; same && b < (n + 15) / 16; ++b) {
      const int64_t rows = std::min<int64_t>(16, n - 16 * b);
      std::vector<uint16_t> c0(size_t(16 * k), 7), c1(size_t(16 * k), 7);
      std::vector<float> s0(size_t(2 * ng * 16), 9.f), s1(size_t(2 * ng * 16), 9.f);
      portable_decode(w + 16 * b * row_bytes, row_bytes, rows, k, c0.data(), s0.data(), s0.data() + ng * 16);
      lib->decode(w + 16 * b * row_bytes, row_bytes, rows, k, c1.data(), s1.data(), s1.data() + ng * 16);
      same = same && c0 == c1;
      same = same && !std::memcmp(s0.data(), s1.data(), size_t(ng * 16 * (p.mins ? 2 : 1)) * 4);
    }
    CHECK(same, what + ": the avx512 decoders write the portable codes and scales");
  }
  const int64_t lda = k + 8;
  // unit rows read the decoder's weights exactly
  bool exact = true;
  for (int64_t j0 = 0; j0 < k && exact; j0 += 5) {
    const int64_t m = std::min<int64_t>(5, k - j0);
    std::vector<uint16_t> a(size_t(m * lda), 0);
    for (int64_t r = 0; r < m; ++r) a[size_t(r * lda + j0 + r)] = 0x3F80;
    const std::vector<float> c = emulated(t, w, row_bytes, n, k, a, lda, m);
    for (int64_t r = 0; r < m && exact; ++r)
      for (int64_t i = 0; i < n && exact; ++i) exact = c[size_t(r * n + i)] == wv[size_t(i * k + j0 + r)];
  }
  CHECK(exact, what + ": unit rows through the emulated tiles read the decoder's weights exactly");
  for (int64_t m : {4, 10, 17, 45}) {
    std::vector<uint16_t> a(size_t(m * lda));
    for (auto& v : a) v = uint16_t(f32_bits(float(rng.gauss())) >> 16);
    const std::vector<float> c = emulated(t, w, row_bytes, n, k, a, lda, m);
    const double worst = ggml_sum_error(a, lda, m, wv, n, k, c);
    CHECK(worst <= 1.0, what + strf(" M=%lld: emulated sums within k*2^-23*sum|a*w| (worst %.3f of it)", (long long)m,
                                    worst));
    if (tiles && m >= amx::ggml_prefill_min_rows()) {
      std::vector<float> real(size_t(m * n), -2.f);
      tiles->gemm_ggml(t, w, row_bytes, n, k, a.data(), lda, m, real.data(), n);
      CHECK(!std::memcmp(real.data(), c.data(), c.size() * 4), what + strf(" M=%lld: the real tiles give the "
                                                                        "emulator's bits", (long long)m));
    }
  }
}

}  // namespace

void test_ggml_tiles(const std::vector<Isa>& isas, Rng& rng) {
  const IsaKernels *vec512 = nullptr, *tiles = nullptr;
  for (const Isa& isa : isas) {
    if (std::string(isa.k->name) == "avx512") vec512 = isa.k;
    if (std::string(isa.k->name) == "amx") tiles = isa.k;
  }
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4, GgmlType::kQ4_K,
                        GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS, GgmlType::kQ2_K, GgmlType::kQ3_K})
    test_type(vec512, tiles, type, rng);
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kIQ2_XXS, GgmlType::kIQ1_M, GgmlType::kF16})
    CHECK(!vec512 || amx::ggml_tile_rows(type) == nullptr,
          strf("amx ggml tiles: %s has no tile decoder (avx512's gemm_ggml runs it)", find_ggml_type(uint32_t(type))->name));
}

}  // namespace ktmoe_test
