// Which ISA tables the native tests run (see isa_tables.h).
#include "isa_tables.h"

#include <cstdio>
#include <string>

#include "check.h"
#include "common/cpu_features.h"

namespace ktmoe_test {

using namespace ktmoe;

std::vector<Isa> usable_isas() {
  std::vector<Isa> out;
  const CpuFeatures& cpu = cpu_features();
  const IsaKernels* tables[] = {&generic_kernels(), &avx2_kernels(), &avx512_kernels()};
  const bool cpu_ok[] = {true, cpu.avx2, cpu.avx512};
  for (int i = 0; i < 3; ++i) {
    const IsaKernels& t = *tables[i];
    std::string nulls;
    if (!t.gemm_bf16) nulls += " gemm_bf16";
    if (!t.gemm_int8) nulls += " gemm_int8";
    if (!t.gemm_int4) nulls += " gemm_int4";
    if (!t.silu_mul) nulls += " silu_mul";
    if (!t.quantize_rows) nulls += " quantize_rows";
    if (!t.to_bf16) nulls += " to_bf16";
    if (!t.f16_to_f32) nulls += " f16_to_f32";
    if (!t.f32_to_f16) nulls += " f32_to_f16";
    const char* name = t.name ? t.name : "?";
    if (!cpu_ok[i]) {
      SKIP(strf("isa %s: skipped: cpu lacks it", name));
    } else if (!nulls.empty()) {
      SKIP(strf("isa %s: skipped: incomplete (null:%s)", name, nulls.c_str()));
    } else {
      std::printf("INFO isa %s: complete, testing\n", name);
      out.push_back({&t, true});
    }
  }
  return out;
}

}  // namespace ktmoe_test
