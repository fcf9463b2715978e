// Packing: header fields computed independently, deterministic output that writes every byte,
// values and scales decoded by the format's formulas, zero padding, the int4 group search,
// and the arguments and weights the packer refuses.
#include <stdexcept>
#include <string>

#include "check.h"
#include "kernels/pack.h"
#include "packed_reference.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

void test_pack(WeightFormat f, MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng) {
  const std::string name = strf("pack %s %s n=%lld k=%lld g=%lld", fmt_name(f), role_name(role),
                                (long long)n, (long long)k, (long long)group);
  const PackedMatrixHeader h = packed_matrix_header(f, role, n, k, group);
  // header fields, computed independently
  const int64_t g = f == WeightFormat::kINT4 ? (group ? group : 32)
                  : f == WeightFormat::kINT8 ? (group ? group : round_up(k, 32)) : 0;  // int8 0: per row
  const int64_t kp = g ? round_up(k, std::max<int64_t>(g, 32)) : round_up(k, 32);
  const int64_t np = role == MatrixRole::kGateUp ? 2 * round_up(n / 2, 16) : round_up(n, 16);
  const int64_t per_k = f == WeightFormat::kBF16 ? 32 : f == WeightFormat::kINT8 ? 16 : 8;
  const int64_t data_end = 64 + (np / 16) * kp * per_k;
  const int64_t scale_bytes = f == WeightFormat::kINT8 ? np * (kp / g) * 4 : f == WeightFormat::kINT4 ? (np / 16) * (kp / g) * 32 : 0;
  bool pad_zero = h.reserved == 0;
  for (uint8_t b : h.pad) pad_zero = pad_zero && b == 0;
  CHECK(h.magic == kPackedMagic && h.version == kPackedVersion && h.format == uint8_t(f) &&
            h.role == uint8_t(role) && h.n == n && h.k == k && h.np == np && h.kp == kp &&
            h.kp % 32 == 0 && h.group == g &&
            h.data_offset == 64 && h.scale_offset == (scale_bytes ? round_up(data_end, 64) : 0) &&
            h.total_bytes == round_up(data_end, 64) + round_up(scale_bytes, 64) &&
            h.total_bytes % 64 == 0 && pad_zero,
        name + strf(": header (np=%d kp=%d total=%lld)", h.np, h.kp, (long long)h.total_bytes));

  const std::vector<float> w = random_matrix(n, k, rng, true);
  const AlignedBytes a = pack(h, w, 0xAA), b = pack(h, w, 0x55);
  CHECK(std::memcmp(a.get(), b.get(), a.n) == 0, name + ": deterministic, every byte written");

  const Decoded D = decode(a.get());
  int64_t bad_pad = 0, bad_val = 0, bad_bytes = 0;
  double worst_int4 = 0;  // actual / best squared error - 1
  for (size_t i = 64; i < D.touched.size(); ++i) bad_bytes += !D.touched[i] && a.get()[i] != 0;
  for (int64_t pr = 0; pr < D.np; ++pr) {
    const int64_t r = D.logical_of[pr];
    for (int64_t c = 0; c < D.kp; ++c) {
      const size_t e = size_t(pr * D.kp + c);
      const bool pad = r < 0 || c >= k;
      if (f == WeightFormat::kBF16) {
        if (pad) bad_pad += D.wb[e] != 0;
        else bad_val += D.wb[e] != ref_bf16(w[size_t(r * k + c)]);
      } else if (f == WeightFormat::kINT8) {
        if (pad) bad_pad += D.wi[e] != 0;  // padded weight 0 <=> u = 128
        else {
          const float sc = D.d[size_t(pr * D.ng + c / D.g)];
          const double t = sc > 0 ? w[size_t(r * k + c)] / sc : 0.0;
          bad_val += D.wi[e] < -127 || std::fabs(D.wi[e] - t) > 0.5 + 1e-4;
        }
      } else {
        if (pad) bad_pad += D.wi[e] != 0;
      }
    }
    if (f == WeightFormat::kINT8)
      for (int64_t G = 0; G < D.ng; ++G) {  // s = max|w| / 127 over the group's valid columns (0: padding)
        float amax = 0;
        if (r >= 0)
          for (int64_t c = G * D.g; c < std::min(k, (G + 1) * D.g); ++c)
            amax = std::max(amax, std::fabs(w[size_t(r * k + c)]));
        bad_val += f32_bits(D.d[size_t(pr * D.ng + G)]) != f32_bits(amax / 127.f);
      }
    if (f == WeightFormat::kINT4)
      for (int64_t G = 0; G < D.ng; ++G) {
        const int64_t c0 = G * D.g, len = std::min(k, c0 + D.g) - c0;
        const float dd = D.d[pr * D.ng + G];
        if (r < 0 || len <= 0) {
          bad_pad += dd != 0.f;
          continue;
        }
        const float* v = w.data() + r * k + c0;
        bool zero = true;
        for (int64_t i = 0; i < len; ++i) zero = zero && v[i] == 0.f;
        if (zero) {  // d = 0, q = 0
          bad_val += dd != 0.f;
          for (int64_t i = 0; i < len; ++i) bad_val += D.wi[size_t(pr * D.kp + c0 + i)] != 0;
        }
        double err = 0;
        for (int64_t i = 0; i < len; ++i) {
          const double e = v[i] - D.w[size_t(pr * D.kp + c0 + i)];
          err += e * e;
        }
        const double best = ref_int4_best_err(v, len);
        const double rel = best > 0 ? std::fabs(err / best - 1.0) : (err > 0 ? 1.0 : 0.0);
        worst_int4 = std::max(worst_int4, rel);
      }
  }
  CHECK(bad_pad == 0 && bad_bytes == 0,
        name + strf(": padding is zero (bad padded elements %lld, bad gap bytes %lld)",
                    (long long)bad_pad, (long long)bad_bytes));
  if (f == WeightFormat::kINT4)
    CHECK(bad_val == 0 && worst_int4 < 1e-9,
          name + strf(": int4 groups = best of the MSE search (|err/best-1| max %.2g), zero groups d = 0 (bad %lld)",
                      worst_int4, (long long)bad_val));
  else
    CHECK(bad_val == 0, name + strf(": values and scales match the spec (bad %lld)", (long long)bad_val));
}

void test_int4_codebook() {
  bool ok = kInt4Offset == 64 && kInt4Levels[0] == -64;
  int positive = 0;
  for (int q = 0; q < 16; ++q) {
    ok = ok && kInt4Levels[q] >= -64 && kInt4Levels[q] <= 63 && kInt4Levels[q] != 0;
    ok = ok && (q == 0 || kInt4Levels[q] > kInt4Levels[q - 1]);
    ok = ok && int(kInt4U8[q]) == kInt4Levels[q] + kInt4Offset && kInt4U8[q] <= 127;  // vpmaddubsw's bound
    positive += kInt4Levels[q] > 0;
  }
  CHECK(ok && positive == 8,
        "int4 codebook: 16 ascending nonzero levels in [-64, 63] (8 of each sign, -64 the first), u table = L + 64 <= 127");
}

void test_pack_errors() {
  bool threw = false;
  try {
    packed_matrix_header(WeightFormat::kINT4, MatrixRole::kPlain, 16, 64, 48);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  bool threw2 = false;
  try {
    packed_matrix_header(WeightFormat::kBF16, MatrixRole::kGateUp, 15, 64, 0);
  } catch (const std::invalid_argument&) {
    threw2 = true;
  }
  CHECK(threw && threw2, "pack: bad arguments rejected (int4 group 48, odd kGateUp n)");
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4}) {
    const PackedMatrixHeader h = packed_matrix_header(f, MatrixRole::kPlain, 16, 64, 0);
    std::vector<float> w(16 * 64, 0.25f);
    w[5 * 64 + 7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<const float*> rows;
    for (int r = 0; r < 16; ++r) rows.push_back(w.data() + r * 64);
    AlignedBytes out(size_t(h.total_bytes), 0xAB);
    std::string what;
    try {
      pack_matrix(h, rows.data(), out.get());
    } catch (const std::domain_error& e) {
      what = e.what();
    }
    CHECK(what == "nan at row 5, column 7" && out.get()[0] == 0xAB,
          strf("pack [%d]: a NaN weight is refused before anything is written ('%s')", int(f), what.c_str()));
  }
}

}  // namespace ktmoe_test
