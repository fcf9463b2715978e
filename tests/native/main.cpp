// [NOTE] Torch-free tests of the packed format, of every ISA micro-kernel table
// the CPU can run, and of the MoE driver. Built and run by
// tests/test_native_kernels.py; prints one line per check and a final
// "N passed, M failed" line; exit status 1 if anything failed (check.h).
//
// The references here are independent of the code under test:
//   * bf16 rounding: chooses the nearer of the two neighbouring bf16 values in
//     double arithmetic (ties to even), not the bit trick of bf16_scalar.h;
//   * packed weights are decoded by the byte-offset formulas of packed_format.h
//     (never by the packer's or kernels' code), which also checks every byte that
//     no formula covers is zero;
//   * gemm results are recomputed in double from the decoded weights and the
//     exact int8 activations (tight tolerances: integer parts must match) and from
//     the dense fp32 weights (accuracy metric of each format);
//   * the driver is compared with a double-precision emulation of the same
//     pipeline (tight) and with the dense fp32 MoE (accuracy metric), and its
//     bits must not depend on the ParallelFor partition.
// ISAs come from kernels/isa_select.h, as in the extension: one the CPU lacks, or
// whose table has null entries (being written), is reported "skipped: <why>".
// `test_kernels --accuracy E H I K T` runs only the accuracy metric at that shape;
// KTMOE_TEST_SEED=n runs the same checks on other random data.
//
// One file per kernel family (test_pack, test_gemm, test_activations, test_conversions,
// test_driver, test_fp8, test_amx, test_int4_avx2, test_avx2_vnni, test_mxfp4, test_ggml), the references they share
// (reference.h, packed_reference, moe_reference),
// the ISA tables run (isa_tables) and the check macros (check.h).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check.h"
#include "tests.h"

using namespace ktmoe;
using namespace ktmoe_test;

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  const char* seed = std::getenv("KTMOE_TEST_SEED");  // other random data, same checks
  Rng rng(seed ? std::strtoull(seed, nullptr, 10) : 20240607ull);
  if (argc == 7 && std::string(argv[1]) == "--accuracy") {  // --accuracy E H I K T: the metric only
    const int64_t E = std::atoll(argv[2]), H = std::atoll(argv[3]), I = std::atoll(argv[4]);
    test_accuracy(usable_isas(), rng, E, H, I, std::atoll(argv[5]), std::atoll(argv[6]));
    return finish();
  }
  struct Shape {
    MatrixRole role;
    int64_t n, k;
  };
  const Shape shapes[] = {{MatrixRole::kPlain, 40, 72},
                          {MatrixRole::kGateUp, 2 * 37, 96},
                          {MatrixRole::kDown, 33, 200},
                          {MatrixRole::kGateUp, 2 * 16, 32},
                          {MatrixRole::kPlain, 130, 130}};
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4})
    for (const Shape& s : shapes) test_pack(f, s.role, s.n, s.k, 0, rng);
  test_pack(WeightFormat::kINT4, MatrixRole::kDown, 33, 200, 64, rng);
  test_pack(WeightFormat::kINT4, MatrixRole::kGateUp, 2 * 20, 40, 128, rng);
  for (int64_t g : {32, 64}) {  // int8 per group (0 above: per channel)
    test_pack(WeightFormat::kINT8, MatrixRole::kDown, 33, 200, g, rng);
    test_pack(WeightFormat::kINT8, MatrixRole::kGateUp, 2 * 20, 40, g, rng);
    test_pack(WeightFormat::kINT8, MatrixRole::kPlain, 130, 130, g, rng);
  }
  test_pack_errors();
  test_int4_codebook();

  const std::vector<Isa> isas = usable_isas();
  for (const Isa& isa : isas) {
    for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4})
      for (const Shape& s : shapes) test_gemm(*isa.k, f, s.role, s.n, s.k, 0, rng);
    test_gemm(*isa.k, WeightFormat::kINT4, MatrixRole::kDown, 33, 200, 64, rng);
    test_gemm(*isa.k, WeightFormat::kINT4, MatrixRole::kGateUp, 2 * 20, 300, 128, rng);
    for (int64_t g : {32, 64}) {
      test_gemm(*isa.k, WeightFormat::kINT8, MatrixRole::kDown, 33, 200, g, rng);
      test_gemm(*isa.k, WeightFormat::kINT8, MatrixRole::kGateUp, 2 * 20, 300, g, rng);
    }
    test_gated_activations(*isa.k, rng);
    test_quantize(*isa.k, rng);
    test_to_bf16(*isa.k, rng);
    test_f16(*isa.k, rng);
  }
  for (int64_t g : {0, 32, 64}) {
    test_int8_isas_agree(isas, MatrixRole::kDown, 33, 200, g, rng);
    test_int8_isas_agree(isas, MatrixRole::kGateUp, 2 * 37, 1100, g, rng);  // k past one 1 KiB chunk
  }
  test_driver(isas, rng);
  test_driver_f16(isas, rng);
  test_accuracy(isas, rng);
  test_fp8(isas, rng);
  test_amx_emulator(rng);
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4})
    for (const Shape& s : shapes) test_amx_gemm(isas, f, s.role, s.n, s.k, 0, rng);
  test_amx_gemm(isas, WeightFormat::kINT4, MatrixRole::kDown, 33, 200, 64, rng);
  test_amx_gemm(isas, WeightFormat::kINT4, MatrixRole::kGateUp, 2 * 20, 300, 128, rng);
  test_amx_gemm(isas, WeightFormat::kINT8, MatrixRole::kPlain, 48, 256, 0, rng);
  test_int4_affine(isas, rng);
  test_int4_avx2(isas, rng);
  test_avx2_vnni(rng);
  test_mxfp4(isas, rng);
  test_ggml(isas, rng);
  test_ggml_tiles(isas, rng);

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("INFO %d skipped, %.1f s\n", g_skipped, secs);
  return finish();
}
