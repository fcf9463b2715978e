// The AMX path on every host: the tile emulator (kernels/amx/tile_ops_emulated.h) against an
// independent scalar reading of the SDM pseudo-code, and the amx gemm templates
// (kernels/amx/gemm_amx.h) run on the emulator, bit for bit against scalar sums over the
// weights decoded by packed_reference (never by the kernels' code), within the format's bound
// against the dense fp32 weights, with untouched guard columns. kINT8 / kINT4 must also give
// the avx512 table's bits (same exact integers, same epilogue) where the CPU runs it; where it
// has AMX, the amx table (real tiles) must give the emulator's bits.
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "check.h"
#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_emulated.h"
#include "kernels/pack.h"
#include "packed_reference.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;
using Emu = amx::EmulatedTileOps;

namespace {

uint16_t bits_of_bf16(float f) { return uint16_t(f32_bits(f) >> 16); }  // exact for bf16 values
float bf16_from_rng(Rng& rng, double scale) { return ref_bf16_value(float(rng.gauss() * scale)); }

void put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v), p[1] = uint8_t(v >> 8); }
void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint32_t get32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

amx::TileConfig shape_config(int c_rows, int c_colsb, int a_colsb) {  // tmm0 = C, tmm1 = A, tmm2 = B
  amx::TileConfig cfg;
  cfg.rows[0] = uint8_t(c_rows), cfg.colsb[0] = uint16_t(c_colsb);
  cfg.rows[1] = uint8_t(c_rows), cfg.colsb[1] = uint16_t(a_colsb);
  cfg.rows[2] = uint8_t(a_colsb / 4), cfg.colsb[2] = uint16_t(c_colsb);
  return cfg;
}

// tdpbf16ps and tdpbsud on one shape, against the pseudo-code read independently: per C
// element, float even / odd sums over the k-pairs (a bf16 product is exact in fp32, then one
// rounded add), then C + (even + odd); ints in int64, wrapped to 32 bits at the end.
bool check_dots(int rows, int colsb, int a_colsb, Rng& rng) {
  alignas(64) uint8_t A[16 * 64] = {}, B[16 * 64] = {}, C[16 * 64] = {}, out[16 * 64];
  const int K = a_colsb / 4, N = colsb / 4;
  bool ok = true;
  for (int bf = 0; bf < 2; ++bf) {
    for (int i = 0; i < 16 * 64; i += 2) {
      put16(A + i, bits_of_bf16(bf16_from_rng(rng, 1.0)));
      put16(B + i, bits_of_bf16(bf16_from_rng(rng, 1.0)));
    }
    if (!bf)
      for (int i = 0; i < 16 * 64; i += 4) put32(C + i, f32_bits(float(rng.gauss() * 4)));
    else
      for (int i = 0; i < 16 * 64; ++i) A[i] = uint8_t(rng.next()), B[i] = uint8_t(rng.next()), C[i] = uint8_t(rng.next());
    Emu::configure(shape_config(rows, colsb, a_colsb));
    Emu::load<0>(C, 64), Emu::load<1>(A, 64), Emu::load<2>(B, 64);
    if (!bf) Emu::dpbf16ps<0, 1, 2>(); else Emu::dpbsud<0, 1, 2>();
    std::memset(out, 0xEE, sizeof(out));
    Emu::store<0>(out, 64);
    const uint8_t* reg = Emu::st().t[0];  // the register file: rows / bytes past the shape are zero
    for (int i = 0; i < 16 * 64; ++i) ok = ok && (i / 64 < rows && i % 64 < colsb ? true : reg[i] == 0);
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        const uint8_t* o = out + m * 64 + 4 * n;
        if (m >= rows || n >= N) {  // not stored
          ok = ok && get32(o) == 0xEEEEEEEEu;
          continue;
        }
        uint32_t want;
        if (!bf) {
          float even = 0.f, odd = 0.f;
          for (int k = 0; k < K; ++k) {
            const uint8_t *a = A + m * 64 + 4 * k, *b = B + k * 64 + 4 * n;
            const float pe = bf16_value(uint16_t(a[0] | a[1] << 8)) * bf16_value(uint16_t(b[0] | b[1] << 8));
            const float po = bf16_value(uint16_t(a[2] | a[3] << 8)) * bf16_value(uint16_t(b[2] | b[3] << 8));
            even = even + pe, odd = odd + po;
          }
          const float sum = even + odd;
          want = f32_bits(f32_from_bits(get32(C + m * 64 + 4 * n)) + sum);
        } else {
          int64_t s = int32_t(get32(C + m * 64 + 4 * n));
          for (int k = 0; k < K; ++k)
            for (int i = 0; i < 4; ++i) s += int64_t(int8_t(A[m * 64 + 4 * k + i])) * B[k * 64 + 4 * n + i];
          want = uint32_t(uint64_t(s));
        }
        ok = ok && get32(o) == want;
      }
  }
  Emu::release();
  return ok;
}

// One tdpbf16ps on 1 x 1 x (2 pairs) tiles from given bf16 bits; returns C's fp32 bits.
uint32_t dot_bf16_pairs(uint16_t c0, const uint16_t (&a)[4], const uint16_t (&b)[4]) {
  alignas(64) uint8_t A[64] = {}, B[2 * 64] = {}, C[64] = {};
  put32(C, uint32_t(c0) << 16);
  for (int i = 0; i < 4; ++i) put16(A + 2 * i, a[i]);
  put16(B, b[0]), put16(B + 2, b[1]), put16(B + 64, b[2]), put16(B + 66, b[3]);
  Emu::configure(shape_config(1, 4, 8));
  Emu::load<0>(C, 64), Emu::load<1>(A, 64), Emu::load<2>(B, 64);
  Emu::dpbf16ps<0, 1, 2>();
  Emu::store<0>(C, 64);
  Emu::release();
  return get32(C);
}

bool throws_logic_error(void (*f)()) {
  try {
    f();
  } catch (const std::logic_error&) {
    Emu::release();
    return true;
  }
  Emu::release();
  return false;
}

}  // namespace

void test_amx_emulator(Rng& rng) {
  {  // tileloadd / tilestored: rows x colsb with a stride, the rest of the tile zero
    alignas(64) uint8_t src[7 * 100], dst[7 * 100];
    for (auto& v : src) v = uint8_t(rng.next() | 1);
    amx::TileConfig cfg;
    cfg.rows[5] = 7, cfg.colsb[5] = 24;
    Emu::configure(cfg);
    Emu::load<5>(src, 100);
    std::memset(dst, 0xAB, sizeof(dst));
    Emu::store<5>(dst, 100);
    bool ok = true;
    for (int i = 0; i < 7 * 100; ++i) ok = ok && dst[i] == (i % 100 < 24 ? src[i] : 0xAB);
    for (int i = 0; i < 16 * 64; ++i)
      ok = ok && (Emu::st().t[5][i] == (i / 64 < 7 && i % 64 < 24 ? src[(i / 64) * 100 + i % 64] : 0));
    Emu::zero<5>();
    for (int i = 0; i < 16 * 64; ++i) ok = ok && Emu::st().t[5][i] == 0;
    Emu::release();
    CHECK(ok, "amx emulator: tileloadd / tilestored move rows x colsb with the stride, zero the rest");
  }
  bool ok = true;
  for (auto [rows, colsb, a_colsb] : {std::tuple{16, 64, 64}, std::tuple{5, 40, 12}, std::tuple{16, 64, 32}, std::tuple{1, 4, 4}, std::tuple{9, 24, 60}})
    ok = ok && check_dots(rows, colsb, a_colsb, rng);
  CHECK(ok, "amx emulator: tdpbf16ps (even / odd fp32 sums, then C + sum) and tdpbsud (s8 x u8, int32 wrap) "
            "match the scalar pseudo-code on 5 shapes incl. partial rows, columns and k");

  // The SDM's order: pair sums kept apart over k. Even products 2^24, -2^24 and odd 1, 1 give
  // 0 + 2 = 2 (one fp32 chain over k in pair order would give 2^24 + 1 -> 2^24, then 0, then 1).
  const uint16_t two24 = 0x4B80, neg24 = 0xCB80, one = 0x3F80;
  const uint32_t order = dot_bf16_pairs(0, {one, one, one, one}, {two24, one, neg24, one});
  // DAZ: the denormal bf16 0x0001 times 2^100 counts as 0; FTZ: 2^-70 * 2^-70 = 2^-140 flushes to 0.
  const uint32_t daz = dot_bf16_pairs(0, {0x0001, 0, 0, 0}, {0x7180, 0, 0, 0});
  const uint32_t ftz = dot_bf16_pairs(0, {0x1C80, 0, 0, 0}, {0x1C80, 0, 0, 0});
  // int32 wrap-around: INT32_MAX + 1 * 1 -> INT32_MIN.
  alignas(64) uint8_t A[64] = {1}, B[64] = {1}, C[64] = {};
  put32(C, 0x7FFFFFFFu);
  Emu::configure(shape_config(1, 4, 4));
  Emu::load<0>(C, 64), Emu::load<1>(A, 64), Emu::load<2>(B, 64);
  Emu::dpbsud<0, 1, 2>();
  Emu::store<0>(C, 64);
  Emu::release();
  CHECK(order == f32_bits(2.f) && daz == 0 && ftz == 0 && get32(C) == 0x80000000u,
        strf("amx emulator: tdpbf16ps keeps even / odd sums apart (%g, want 2), DAZ (0x%08x) and FTZ "
             "(0x%08x) give +0; tdpbsud wraps (0x%08x, want 0x80000000)",
             double(f32_from_bits(order)), daz, ftz, get32(C)));

  const bool shape_err = throws_logic_error([] {  // A colsb / 4 != B rows
    amx::TileConfig cfg = shape_config(16, 64, 64);
    cfg.rows[2] = 8;
    Emu::configure(cfg);
    Emu::dpbsud<0, 1, 2>();
  });
  const bool unconfigured = throws_logic_error([] { Emu::zero<3>(); });
  const bool bad_shape = throws_logic_error([] {
    amx::TileConfig cfg;
    cfg.rows[0] = 17, cfg.colsb[0] = 64;
    Emu::configure(cfg);
  });
  CHECK(shape_err && unconfigured && bad_shape,
        "amx emulator: shapes that do not chain, a tile without configuration and a 17-row tile throw");

  bool parse = amx::parse_prefill_min_rows(nullptr) == amx::kDefaultPrefillMinRows && amx::parse_prefill_min_rows("40") == 40;
  for (const char* bad : {"0", "-3", "16x", "x"}) {
    try {
      amx::parse_prefill_min_rows(bad);
      parse = false;
    } catch (const std::invalid_argument& e) {
      parse = parse && std::string(e.what()).find("KTMOE_AMX_MIN_ROWS") != std::string::npos;
    }
  }
  CHECK(parse, "amx: KTMOE_AMX_MIN_ROWS defaults to kDefaultPrefillMinRows, reads an integer >= 1, names itself on bad input");
}

void test_amx_gemm(const std::vector<Isa>& isas, WeightFormat f, MatrixRole role, int64_t n, int64_t k,
                   int64_t group, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(f, role, n, k, group);
  const std::vector<float> w = random_matrix(n, k, rng, false);
  const AlignedBytes blob = pack(h, w);
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  const Decoded D = decode(blob.get());
  const int64_t kp = D.kp, nb = D.np / 16;
  const IsaKernels* same_bits = nullptr;  // avx512 (int formats) or the real amx tiles
  for (const Isa& isa : isas)
    if (std::string(isa.k->name) == "amx" || (f != WeightFormat::kBF16 && std::string(isa.k->name) == "avx512"))
      same_bits = isa.k;  // amx comes last: preferred
  const float sentinel = f32_from_bits(0x7FC12345u);
  bool bits = true, guards = true, other = true;
  double dense_num = 0, dense_den = 0;
  for (int64_t m : {1, 15, 16, 17, 33, 48}) {
    std::vector<float> a(size_t(m * k));
    for (auto& v : a) v = float(rng.gauss());
    // an odd m: a row stride that makes kINT8 with kp % 64 = 32 stage every row; even: in place
    const int64_t lda = kp + (m % 2 ? 16 : 48), gld = kp / (f == WeightFormat::kINT4 ? D.g : kp) + 1;
    std::vector<uint16_t> abf(size_t(m * lda), 0);
    std::vector<int8_t> q(static_cast<size_t>(m * lda));
    std::vector<float> sx(static_cast<size_t>(m));
    std::vector<int32_t> gsum(static_cast<size_t>(m * gld));
    if (f == WeightFormat::kBF16) {
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) abf[size_t(r * lda + c)] = ref_bf16(a[size_t(r * k + c)]);
    } else {  // the generic quantizer (tested against its spec in test_activations)
      generic_kernels().quantize_rows(a.data(), k, m, k, kp, f == WeightFormat::kINT4 ? D.g : kp, kp, q.data(), lda,
                                      sx.data(), gsum.data(), gld);  // one scale per row: int4, int8 per channel
    }
    const QuantizedRows aq{q.data(), lda, sx.data(), gsum.data(), gld};
    // The scalar expectation of every (row, packed column), bit for bit.
    std::vector<float> want(size_t(m * D.np));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t pr = 0; pr < D.np; ++pr) {
        const int64_t base = pr * kp;
        float y = 0.f;
        if (f == WeightFormat::kBF16) {
          for (int64_t s = 0; s < kp / 32; ++s) {
            float even = 0.f, odd = 0.f;
            for (int64_t c = 32 * s; c < 32 * s + 32; c += 2) {
              even = even + bf16_value(abf[size_t(r * lda + c)]) * bf16_value(D.wb[size_t(base + c)]);
              odd = odd + bf16_value(abf[size_t(r * lda + c + 1)]) * bf16_value(D.wb[size_t(base + c + 1)]);
            }
            y = y + (even + odd);
          }
        } else if (f == WeightFormat::kINT8) {
          int64_t I = 0;
          for (int64_t c = 0; c < kp; ++c) I += int64_t(D.wi[size_t(base + c)]) * q[size_t(r * lda + c)];
          y = (sx[r] * D.s[pr]) * float(I);
        } else {
          for (int64_t G = 0; G < D.ng; ++G) {
            int64_t I = 0;
            for (int64_t c = G * D.g; c < (G + 1) * D.g; ++c)
              I += int64_t(kInt4Levels[D.wi[size_t(base + c)]]) * q[size_t(r * lda + c)];
            y = std::fma(D.d[size_t(pr * D.ng + G)], float(I), y);
          }
          y = sx[r] * y;
        }
        want[size_t(r * D.np + pr)] = y;
      }
    auto run = [&](bool emulated, const IsaKernels* isa, int64_t b0, int64_t b1, float* c, int64_t ldc) {
      if (emulated && f == WeightFormat::kBF16) amx::gemm_bf16_tiles<Emu>(hw, abf.data(), lda, m, b0, b1, c, ldc);
      else if (emulated) amx::gemm_int_tiles<Emu>(f == WeightFormat::kINT8 ? amx::TileFormat::kINT8 : amx::TileFormat::kINT4,
                                                  hw, aq, m, b0, b1, c, ldc);
      else if (f == WeightFormat::kBF16) isa->gemm_bf16(hw, abf.data(), lda, m, b0, b1, c, ldc);
      else if (f == WeightFormat::kINT8) isa->gemm_int8(hw, aq, m, b0, b1, c, ldc);
      else isa->gemm_int4(hw, aq, m, b0, b1, c, ldc);
    };
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, nb}, {nb - 1, nb}};
    if (nb > 2) ranges.push_back({1, nb - 1});
    for (auto [b0, b1] : ranges) {
      const int64_t cols = 16 * (b1 - b0), ldc = cols + 5;
      std::vector<float> c(size_t(m * ldc), sentinel), o(size_t(m * ldc), sentinel);
      run(true, nullptr, b0, b1, c.data(), ldc);
      const bool real_tiles = same_bits && std::string(same_bits->name) == "amx";
      if (same_bits && (!real_tiles || m >= amx::prefill_min_rows())) {
        run(false, same_bits, b0, b1, o.data(), ldc);
        other = other && std::memcmp(c.data(), o.data(), c.size() * 4) == 0;
      }
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < cols; ++j)
          bits = bits && f32_bits(c[size_t(r * ldc + j)]) == f32_bits(want[size_t(r * D.np + 16 * b0 + j)]);
        for (int64_t j = cols; j < ldc; ++j) guards = guards && f32_bits(c[size_t(r * ldc + j)]) == f32_bits(sentinel);
      }
      if (m == 48 && b0 == 0 && b1 == nb)  // accuracy vs the dense fp32 weights and fp32 activations
        for (int64_t r = 0; r < m; ++r)
          for (int64_t lr = 0; lr < n; ++lr) {
            double s = 0;
            for (int64_t t = 0; t < k; ++t) s += double(a[size_t(r * k + t)]) * w[size_t(lr * k + t)];
            dense_num += std::fabs(c[size_t(r * ldc + D.packed_of[lr])] - s);
            dense_den += std::fabs(s);
          }
    }
  }
  const double rel = dense_num / dense_den, bound = format_bound(f);
  if (f == WeightFormat::kINT8 && k > 32) {  // grouped int8 (activation scales per group): avx512's, not the tiles'
    const PackedMatrixHeader hg = packed_matrix_header(f, role, n, k, 32);
    const AlignedBytes grouped = pack(hg, w);
    std::vector<int8_t> q(size_t(16 * hg.kp), 0);
    std::vector<float> sx(size_t(16 * hg.kp / 32), 1.f), c(size_t(16 * hg.np));
    std::vector<int32_t> gsum(size_t(16 * hg.kp / 32), 0);
    bool refused = false;
    try {
      amx::gemm_int_tiles<Emu>(amx::TileFormat::kINT8, reinterpret_cast<const PackedMatrixHeader*>(grouped.get()),
                               QuantizedRows{q.data(), hg.kp, sx.data(), gsum.data(), hg.kp / 32}, 16, 0, 1,
                               c.data(), hg.np);
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("grouped int8") != std::string::npos;
    }
    CHECK(refused, "amx int8 tiles refuse grouped int8 by name (gemm_int8 routes it to avx512)");
  }
  CHECK(bits && guards && other && rel <= bound,
        strf("amx gemm_%s on the emulator %s n=%lld k=%lld (kp %lld) g=%lld M={1,15,16,17,33,48}: bits vs "
             "scalar %s, guards %s, %s %s, rel err vs dense %.4f (<= %.2f)",
             fmt_name(f), role_name(role), (long long)n, (long long)k, (long long)kp, (long long)D.g,
             bits ? "equal" : "DIFFER", guards ? "intact" : "OVERWRITTEN",
             same_bits ? same_bits->name : "no table with these bits on this CPU:", same_bits ? (other ? "bits equal" : "bits DIFFER") : "none compared",
             rel, bound));
}

}  // namespace ktmoe_test
