// [NOTE] find_isa / best_isa: the ISA tables a CPU can run (see isa_select.h).
//
// Every ISA is one row of kIsas: its name (written here only; each table's own IsaKernels::name
// repeats it and tests/native checks they agree), what a CPU must have, its table, and whether
// "auto" may choose it. A new ISA is a new row.
#include "kernels/isa_select.h"

#include <iterator>

namespace ktmoe {
namespace {

constexpr const char* kAvx2 = "AVX2+FMA+F16C";
constexpr const char* kAvx512 = "AVX-512 F/BW/VL/DQ+BF16+VNNI";

struct IsaRow {
  const char* name;
  std::string (*lacks)(const CpuFeatures& cpu);  // the first feature `cpu` lacks, "" when none
  const IsaKernels& (*table)();                  // call only when lacks(cpu) is ""
  bool automatic;                                // "auto" may choose it
};

// Worst to best: "auto" takes the last automatic row the CPU runs. amx is avx512's table with bf16
// prefill on tiles, 1.4-2.4x avx512 at T = 256-512 and level below (benchmarks/measured/device_amx_2026-12-04.log).
const IsaRow kIsas[] = {
    {"generic", [](const CpuFeatures&) -> std::string { return ""; }, generic_kernels, true},
    {"avx2", [](const CpuFeatures& c) -> std::string { return c.avx2 ? "" : kAvx2; }, avx2_kernels, true},
    {"avx2_vnni",
     [](const CpuFeatures& c) -> std::string { return !c.avx2 ? kAvx2 : c.avx2_vnni ? "" : "AVX-VNNI"; },
     avx2_vnni_kernels, true},
    {"avx512", [](const CpuFeatures& c) -> std::string { return c.avx512 ? "" : kAvx512; }, avx512_kernels, true},
    {"amx",
     [](const CpuFeatures& c) -> std::string {
       return !c.avx512 ? kAvx512 : c.amx ? "" : c.amx_missing.empty() ? "AMX-TILE/BF16/INT8" : c.amx_missing;
     },
     amx_kernels, true},
};

const IsaRow* row_named(const std::string& name) {
  for (const IsaRow& row : kIsas)
    if (name == row.name) return &row;
  return nullptr;
}

// The row's table if `cpu` runs it and it is complete in this build; else nullptr and *why.
const IsaKernels* usable_table(const IsaRow& row, const CpuFeatures& cpu, std::string* why) {
  if (const std::string missing = row.lacks(cpu); !missing.empty()) {
    *why = "this CPU lacks " + missing;
    return nullptr;
  }
  const IsaKernels& k = row.table();
  if (const std::string nulls = missing_entries(k); !nulls.empty()) {
    *why = std::string("the ") + row.name + " kernels are not complete in this build (null: " + nulls + ")";
    return nullptr;
  }
  return &k;
}

}  // namespace

std::string missing_entries(const IsaKernels& k) {
  std::string nulls;
  const auto add = [&nulls](bool present, const char* entry) {
    if (present) return;
    if (!nulls.empty()) nulls += ' ';
    nulls += entry;
  };
  add(k.gemm_bf16, "gemm_bf16");
  add(k.gemm_int8, "gemm_int8");
  add(k.gemm_int4, "gemm_int4");
  add(k.gemm_fp8, "gemm_fp8");
  add(k.gemm_int4_affine, "gemm_int4_affine");
  add(k.gemm_mxfp4, "gemm_mxfp4");
  add(k.gemm_ggml, "gemm_ggml");
  add(k.gated_act, "gated_act");
  add(k.quantize_rows, "quantize_rows");
  add(k.to_bf16, "to_bf16");
  add(k.f16_to_f32, "f16_to_f32");
  add(k.f32_to_f16, "f32_to_f16");
  return nulls;
}

const IsaKernels* find_isa(const std::string& name, const CpuFeatures& cpu, std::string* why) {
  if (name == "auto") return &best_isa(cpu);
  if (const IsaRow* row = row_named(name)) return usable_table(*row, cpu, why);
  std::string expected;
  for (const IsaRow& row : kIsas) expected += std::string(row.name) + ", ";
  *why = "unknown ISA '" + name + "' (expected " + expected + "or auto)";
  return nullptr;
}

const IsaKernels& best_isa(const CpuFeatures& cpu) {
  std::string why;
  for (auto row = std::rbegin(kIsas); row != std::rend(kIsas); ++row)
    if (const IsaKernels* k = row->automatic ? usable_table(*row, cpu, &why) : nullptr) return *k;
  return generic_kernels();
}

std::vector<std::string> isa_names() {
  std::vector<std::string> names;
  for (const IsaRow& row : kIsas) names.push_back(row.name);
  return names;
}

std::vector<std::string> usable_isa_names(const CpuFeatures& cpu) {
  std::vector<std::string> names;
  std::string why;
  for (const IsaRow& row : kIsas)
    if (usable_table(row, cpu, &why)) names.push_back(row.name);
  return names;
}

}  // namespace ktmoe
