// [NOTE] find_isa / best_isa: the ISA tables a CPU can run (see isa_select.h).
#include "kernels/isa_select.h"

namespace ktmoe {
namespace {

constexpr const char* kNames[] = {"generic", "avx2", "avx2_vnni", "avx512", "amx"};  // worst to best

// Why `cpu` cannot run the table `name` ("" if it can).
std::string lacking(const std::string& name, const CpuFeatures& cpu) {
  if (name == "avx2") return cpu.avx2 ? "" : "AVX2+FMA+F16C";
  if (name == "avx2_vnni") return !cpu.avx2 ? "AVX2+FMA+F16C" : cpu.avx2_vnni ? "" : "AVX-VNNI";
  if (!cpu.avx512) return "AVX-512 F/BW/VL/DQ+BF16+VNNI";
  if (name == "amx" && !cpu.amx) return cpu.amx_missing;
  return "";
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
  add(k.gated_act, "gated_act");
  add(k.quantize_rows, "quantize_rows");
  add(k.to_bf16, "to_bf16");
  add(k.f16_to_f32, "f16_to_f32");
  add(k.f32_to_f16, "f32_to_f16");
  return nulls;
}

const IsaKernels* find_isa(const std::string& name, const CpuFeatures& cpu, std::string* why) {
  if (name == "auto") return &best_isa(cpu);
  if (name == "generic") return &generic_kernels();
  if (name != "avx2" && name != "avx2_vnni" && name != "avx512" && name != "amx") {
    *why = "unknown ISA '" + name + "' (expected generic, avx2, avx2_vnni, avx512, amx or auto)";
    return nullptr;
  }
  if (const std::string missing = lacking(name, cpu); !missing.empty()) {
    *why = "this CPU lacks " + missing;
    return nullptr;
  }
  const IsaKernels& k = name == "avx2"        ? avx2_kernels()
                        : name == "avx2_vnni" ? avx2_vnni_kernels()
                        : name == "avx512"    ? avx512_kernels()
                                              : amx_kernels();
  if (const std::string nulls = missing_entries(k); !nulls.empty()) {
    *why = "the " + name + " kernels are not complete in this build (null: " + nulls + ")";
    return nullptr;
  }
  return &k;
}

const IsaKernels& best_isa(const CpuFeatures& cpu) {
  std::string why;
  // amx: avx512's table with bf16 prefill on tiles, 1.4-2.4x avx512 at T = 256-512 and level below
  // (benchmarks/measured/device_amx_2026-12-04.log)
  for (const char* name : {"amx", "avx512", "avx2_vnni", "avx2"})
    if (const IsaKernels* k = find_isa(name, cpu, &why)) return *k;
  return generic_kernels();
}

std::vector<std::string> usable_isa_names(const CpuFeatures& cpu) {
  std::vector<std::string> names;
  std::string why;
  for (const char* name : kNames)
    if (find_isa(name, cpu, &why)) names.push_back(name);
  return names;
}

}  // namespace ktmoe
