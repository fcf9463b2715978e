// [NOTE] Which micro-kernel table (isa_kernels.h) runs on a CPU, torch-free.
//
// An ISA is usable when the CPU has its features (common/cpu_features.h: cpuid +
// xgetbv, never the compiler's flags) and its table has every entry filled in
// this build (a table being written has null entries). The ISAs are the rows of
// isa_select.cpp, worst to best: generic (always usable: the oracle), avx2, avx2_vnni (avx2
// with AVX-VNNI's vpdpbusd), avx512, amx (avx512's table with AMX tile gemms for prefill rows).
// "auto" is the best usable one.
// The ops layer (ops/isa_dispatch.h) adds the KTMOE_ISA default, the per-call
// choice and the error a user sees; tests/native uses the same functions.
#pragma once
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {

// The names of k's null entries, space separated ("" for a complete table).
std::string missing_entries(const IsaKernels& k);

// The table of `name` ("generic" | "avx2" | "avx2_vnni" | "avx512" | "amx" | "auto") if `cpu`
// runs it and it is complete in this build; else nullptr and *why ("this CPU lacks AVX2+FMA+F16C",
// "this CPU lacks AVX-VNNI", "this CPU lacks AMX-TILE",
// "the avx2 kernels are not complete in this build (null: ...)", "unknown ISA ...").
const IsaKernels* find_isa(const std::string& name, const CpuFeatures& cpu, std::string* why);

// What "auto" picks on `cpu`: amx, else avx512, else avx2_vnni, else avx2, else generic.
const IsaKernels& best_isa(const CpuFeatures& cpu);

// The name of every ISA, worst to best, whatever the CPU.
std::vector<std::string> isa_names();

// The names of every usable ISA on `cpu`, worst to best.
std::vector<std::string> usable_isa_names(const CpuFeatures& cpu);

}  // namespace ktmoe
