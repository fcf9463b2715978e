// The avx2_vnni gemms (vpdpbusd) against generic's, bit for bit, and the choice of the table.
//
// Two builds of csrc/kernels/avx2_vnni/ are in this binary (vnni_dot.h): the library's, with
// the VEX vpdpbusd of AVX-VNNI (run where the CPU has it, as the extension runs it), and the
// one tests/test_native_kernels.py compiles with the EVEX form (AVX-512 VNNI + VL), which runs
// on AVX-512 hosts without AVX-VNNI; everything but that instruction is the same code.
// Checked per build: gemm_int8 per channel and in groups of 32, 64, 128, gemm_int4 in groups of
// 32, 64, 128, random shapes, M = 1..13 rows (every tile size and tail), the blocks whole and
// split in two, on random values and on the extremes (activations ±127; int8 weight bytes 1 and
// 255, i.e. ∓127; int4 nibbles 0 and 15, u = 0 and 120): the same fp32 bits as generic's.
// The choice (find_isa / best_isa on made-up CPUs) runs everywhere: no kernel is called.
#include <cstring>
#include <string>

#include "check.h"
#include "common/cpu_features.h"
#include "kernels/isa_select.h"
#include "kernels/pack.h"
#include "packed_reference.h"
#include "tests.h"

namespace ktmoe {
// The EVEX build's table (csrc/kernels/avx2_vnni/ compiled as "avx2_vnni_evex", isa_flags.json).
const IsaKernels& avx2_vnni_evex_kernels();
}  // namespace ktmoe

namespace ktmoe_test {

using namespace ktmoe;

namespace {

// Int8 activation rows: q [m][ldq] (ldq > kp), scale [m][ns] (ns: 1 per row, or kp / group for int8's
// per-group activation scales), gsum [m][gld] over `group`.
struct Acts {
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<int32_t> gsum;
  int64_t ldq = 0, gld = 0;
  QuantizedRows view() const { return {q.data(), ldq, s.data(), gsum.data(), gld}; }
};

// extreme: row 0 all +127, row 1 all -127, the others random signs of 127; else uniform in [-127, 127].
Acts make_acts(int64_t m, int64_t kp, int64_t group, int64_t ns, bool extreme, Rng& rng) {
  Acts a;
  a.ldq = kp + 16;
  a.gld = kp / group + 1;
  a.q.assign(size_t(m * a.ldq), 0);
  a.s.resize(size_t(m * ns));
  a.gsum.assign(size_t(m * a.gld), 0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < ns; ++i) a.s[size_t(r * ns + i)] = float(0.003 * (1 + rng.below(100)));
    for (int64_t c = 0; c < kp; ++c) {
      const int v = !extreme ? int(rng.below(255)) - 127 : r == 0 ? 127 : r == 1 ? -127 : rng.next() & 1 ? 127 : -127;
      a.q[size_t(r * a.ldq + c)] = int8_t(v);
      a.gsum[size_t(r * a.gld + c / group)] += v;
    }
  }
  return a;
}

// Every weight byte at an end of its range: int8 u in {1, 255} (wq = -127, 127), int4 nibbles in {0, 15}.
void make_extreme(WeightFormat f, uint8_t* data, int64_t bytes, Rng& rng) {
  for (int64_t i = 0; i < bytes; ++i)
    data[i] = f == WeightFormat::kINT8 ? uint8_t(rng.next() & 1 ? 255 : 1)
                                       : uint8_t((rng.next() & 1 ? 0xF0 : 0x00) | (rng.next() & 1 ? 0x0F : 0x00));
}

// One format, shape and value kind: the table's gemm against generic's for M = 1..13, whole and split.
void check_bits(const IsaKernels& vnni, WeightFormat f, int64_t n, int64_t k, int64_t group, bool extreme, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(f, MatrixRole::kPlain, n, k, group);
  AlignedBytes blob = pack(h, random_matrix(n, k, rng, false));
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  const int64_t nb = hw->np / 16, cols = hw->np, split = nb / 2;
  if (extreme) make_extreme(f, blob.get() + hw->data_offset, nb * block_data_bytes(f, hw->kp), rng);
  const auto gemm = [f](const IsaKernels& isa) { return f == WeightFormat::kINT8 ? isa.gemm_int8 : isa.gemm_int4; };
  int64_t differ = 0;
  for (int64_t m = 1; m <= 13; ++m) {
    const int64_t ns = f == WeightFormat::kINT8 ? hw->kp / hw->group : 1;  // the format table's activation_scale
    const Acts a = make_acts(m, hw->kp, hw->group, ns, extreme, rng);
    std::vector<float> want(size_t(m * cols)), whole(size_t(m * cols), -1.f), halves(size_t(m * cols), -1.f);
    gemm(generic_kernels())(hw, a.view(), m, 0, nb, want.data(), cols);
    gemm(vnni)(hw, a.view(), m, 0, nb, whole.data(), cols);
    gemm(vnni)(hw, a.view(), m, 0, split, halves.data(), cols);
    gemm(vnni)(hw, a.view(), m, split, nb, halves.data() + split * 16, cols);
    differ += std::memcmp(whole.data(), want.data(), whole.size() * 4) != 0;
    differ += std::memcmp(halves.data(), want.data(), halves.size() * 4) != 0;
  }
  CHECK(differ == 0, strf("gemm_%s [%s] n=%lld k=%lld g=%d %s values, M=1..13, blocks whole and split: "
                          "%lld of 26 results differ from generic's bits",
                          fmt_name(f), vnni.name, (long long)n, (long long)k, hw->group,
                          extreme ? "extreme" : "random", (long long)differ));
}

void check_table(const IsaKernels& vnni, Rng& rng) {
  for (bool extreme : {false, true}) {
    for (int64_t group : {0, 32, 64, 128})
      check_bits(vnni, WeightFormat::kINT8, 1 + rng.below(100), 1 + rng.below(700), group, extreme, rng);
    for (int64_t group : {32, 64, 128})
      check_bits(vnni, WeightFormat::kINT4, 1 + rng.below(100), 1 + rng.below(700), group, extreme, rng);
  }
}

// The name find_isa / best_isa give on a made-up CPU ("" and why when refused).
std::string chosen(const char* name, const CpuFeatures& cpu, std::string* why) {
  const IsaKernels* k = find_isa(name, cpu, why);
  return k ? k->name : "";
}

void test_selection() {
  CpuFeatures none, avx2, vnni, both;
  avx2.avx2 = vnni.avx2 = both.avx2 = true;
  vnni.avx2_vnni = both.avx2_vnni = true;
  both.avx512 = true;
  std::string why_avx2, why_none;
  const bool refused = chosen("avx2_vnni", avx2, &why_avx2).empty() && chosen("avx2_vnni", none, &why_none).empty();
  CHECK(refused && why_avx2 == "this CPU lacks AVX-VNNI" && why_none == "this CPU lacks AVX2+FMA+F16C",
        strf("find_isa(avx2_vnni) refuses a CPU without AVX-VNNI ('%s') or AVX2 ('%s')", why_avx2.c_str(),
             why_none.c_str()));
  std::string why;
  CHECK(chosen("avx2_vnni", vnni, &why) == "avx2_vnni" && std::string(best_isa(vnni).name) == "avx2_vnni" &&
            std::string(best_isa(avx2).name) == "avx2" && std::string(best_isa(both).name) == "avx512",
        "best_isa: avx2_vnni with AVX-VNNI and no AVX-512, avx2 without AVX-VNNI, avx512 over both");
  CpuFeatures tiles = both;
  tiles.amx = true;
  CHECK(std::string(best_isa(tiles).name) == "amx" && chosen("amx", both, &why).empty() &&
            why == "this CPU lacks AMX-TILE/BF16/INT8",
        strf("best_isa: amx where the CPU has AMX; a CPU without it is refused by name ('%s')", why.c_str()));
  const std::vector<std::string> names = usable_isa_names(vnni);
  CHECK((names == std::vector<std::string>{"generic", "avx2", "avx2_vnni"}),
        "usable_isa_names with AVX-VNNI: generic, avx2, avx2_vnni");
}

}  // namespace

void test_avx2_vnni(Rng& rng) {
  test_selection();
  std::string why;
  if (const IsaKernels* vex = find_isa("avx2_vnni", cpu_features(), &why))
    check_table(*vex, rng);
  else
    SKIP(strf("gemm_int8 / gemm_int4 [avx2_vnni] (VEX vpdpbusd) against generic: %s", why.c_str()));
  if (cpu_features().avx512)  // the table's AVX-512 VNNI + VL, and the OS-saved state they need
    check_table(avx2_vnni_evex_kernels(), rng);
  else
    SKIP("gemm_int8 / gemm_int4 [avx2_vnni_evex] (EVEX vpdpbusd) against generic: this CPU lacks AVX-512 VNNI");
}

}  // namespace ktmoe_test
