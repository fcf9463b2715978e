// The conversions: fp32 -> bf16 (RNE, NaN, overflow, denormals) and fp32 <-> fp16 (every fp16
// pattern), exact, unaligned, nothing written past the end.
#include <vector>

#include "check.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

void test_to_bf16(const IsaKernels& isa, Rng& rng) {
  std::vector<uint32_t> u = {
      0x00000000u, 0x80000000u, 0x3F800000u, 0x3F808000u /*tie, even down*/, 0x3F818000u /*tie, up*/,
      0x3F808001u, 0x3F807FFFu, 0xBF808000u, 0xBF818000u, 0x7F7FFFFFu /*-> inf*/, 0x7F7F7FFFu,
      0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u /*sNaN*/, 0xFF800001u,
      0x7FFFFFFFu, 0x00000001u, 0x00008000u, 0x00018000u, 0x007FFFFFu, 0x80008001u};
  while (u.size() < 4099) u.push_back(uint32_t(rng.next()));
  std::vector<float> x(u.size());
  for (size_t i = 0; i < u.size(); ++i) x[i] = f32_from_bits(u[i]);
  int64_t bad = 0;
  for (int64_t off : {0, 1}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(33), int64_t(x.size()) - off}) {
      std::vector<uint16_t> y(static_cast<size_t>(n) + 2, 0xABCD);
      isa.to_bf16(x.data() + off, y.data() + off, n);
      for (int64_t i = 0; i < n; ++i) {
        const float xi = x[size_t(off + i)];
        const uint16_t got = y[size_t(off + i)];
        if (std::isnan(xi))
          bad += !std::isnan(bf16_value(got)) || (got >> 15) != (f32_bits(xi) >> 31);
        else
          bad += got != ref_bf16(xi);
      }
      bad += y[size_t(off + n)] != 0xABCD || (off && y[0] != 0xABCD);
    }
  }
  CHECK(bad == 0, strf("to_bf16 [%s] ties, NaN (quiet/signalling), inf, overflow, denormals, 4099 random bit "
                       "patterns, unaligned: RNE exact (mismatches %lld)",
                       isa.name, (long long)bad));
}

void test_f16(const IsaKernels& isa, Rng& rng) {
  // fp32 -> fp16: ties, overflow edge (65504 / 65520), denormals, NaN, inf, random bits
  std::vector<uint32_t> u = {0x00000000u, 0x80000000u, 0x3F800000u, 0x3F801000u /*tie, even down*/,
                             0x3F803000u /*tie, up*/, 0x3F801001u, 0x477FE000u /*65504*/, 0x477FEFFFu,
                             0x477FF000u /*65520 -> inf*/, 0xC77FF000u, 0x7F800000u, 0xFF800000u,
                             0x7FC00000u, 0xFFC12345u, 0x7F800001u /*sNaN*/, 0x33800000u /*2^-24*/,
                             0x33000000u /*2^-25: tie to 0*/, 0x33400000u, 0x387FC000u, 0x387FF000u, 0x38800000u,
                             0x00000001u, 0x1F000000u};
  while (u.size() < 4099) {
    const uint32_t r = uint32_t(rng.next());
    u.push_back(u.size() % 2 ? r : (r & 0x8FFFFFFFu) | 0x30000000u);  // half of them in fp16 range
  }
  int64_t bad = 0;
  for (int64_t off : {0, 1}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(33), int64_t(u.size()) - off}) {
      std::vector<float> x(u.size());
      for (size_t i = 0; i < u.size(); ++i) x[i] = f32_from_bits(u[i]);
      std::vector<uint16_t> y(static_cast<size_t>(n) + 2, 0xABCD);
      isa.f32_to_f16(x.data() + off, y.data() + off, n);
      for (int64_t i = 0; i < n; ++i) {
        const float xi = x[size_t(off + i)];
        const uint16_t got = y[size_t(off + i)];
        if (std::isnan(xi))
          bad += (got & 0x7E00) != 0x7E00 || (got >> 15) != (f32_bits(xi) >> 31) || (got & 0x1FF) != ((f32_bits(xi) >> 13) & 0x1FF);
        else
          bad += got != ref_f16(xi);
      }
      bad += y[size_t(off + n)] != 0xABCD || (off && y[0] != 0xABCD);
    }
  }
  // fp16 -> fp32: every one of the 65536 patterns, unaligned
  std::vector<uint16_t> h(65537);
  for (uint32_t i = 0; i < 65536; ++i) h[i + 1] = uint16_t(i);
  std::vector<float> f(65538, 7.f);
  isa.f16_to_f32(h.data() + 1, f.data() + 1, 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const double ref = ref_f16_value(uint16_t(i));
    const float got = f[i + 1];
    if (std::isnan(ref))
      bad += !std::isnan(got) || (f32_bits(got) >> 31) != (i >> 15);
    else
      bad += double(got) != ref || std::signbit(got) != bool(i & 0x8000);
  }
  bad += f[0] != 7.f || f[65537] != 7.f;
  CHECK(bad == 0, strf("f32_to_f16 / f16_to_f32 [%s] ties, 65504/65520, denormals, NaN, inf, 4099 random, all 65536 "
                       "fp16 patterns, unaligned: exact (mismatches %lld)", isa.name, (long long)bad));
}

}  // namespace ktmoe_test
