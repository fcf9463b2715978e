#include "ops/isa_dispatch.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>

#include "common/cpu_features.h"

namespace ktmoe {
namespace {

bool complete(const IsaKernels& k) {
  return k.gemm_bf16 && k.gemm_int8 && k.gemm_int4 && k.silu_mul && k.swiglu_oai && k.quantize_rows && k.to_bf16 && k.f16_to_f32 &&
         k.f32_to_f16;
}

// nullptr when the CPU lacks the ISA or its table is not complete in this build.
const IsaKernels* lookup(const std::string& name, std::string* why) {
  const CpuFeatures& cpu = cpu_features();
  if (name == "generic") return &generic_kernels();
  if (name == "avx2" || name == "avx512") {
    const bool has = name == "avx2" ? cpu.avx2 : cpu.avx512;
    if (!has) {
      *why = "this CPU lacks " + std::string(name == "avx2" ? "AVX2+FMA+F16C"
                                                            : "AVX-512 F/BW/VL/DQ+BF16+VNNI");
      return nullptr;
    }
    const IsaKernels& k = name == "avx2" ? avx2_kernels() : avx512_kernels();
    if (!complete(k)) {
      *why = "the " + name + " kernels are not complete in this build";
      return nullptr;
    }
    return &k;
  }
  *why = "unknown ISA '" + name + "' (expected generic, avx2, avx512 or auto)";
  return nullptr;
}

const IsaKernels* best() {
  std::string why;
  for (const char* name : {"avx512", "avx2"})
    if (const IsaKernels* k = lookup(name, &why)) return k;
  return &generic_kernels();
}

const IsaKernels* resolve(const std::string& name) {
  if (name.empty() || name == "auto") return best();
  std::string why;
  const IsaKernels* k = lookup(name, &why);
  TORCH_CHECK(k, "ktmoe: cannot use ISA '", name, "': ", why, ". Available: ",
              c10::Join(", ", available_isas()));
  return k;
}

std::atomic<const IsaKernels*>& current() {
  static std::atomic<const IsaKernels*> isa{[] {
    const char* env = std::getenv("KTMOE_ISA");
    return resolve(env ? env : "");
  }()};
  return isa;
}

}  // namespace

const IsaKernels& active_isa() { return *current().load(); }

void set_isa(const std::string& name) { current().store(resolve(name)); }

std::vector<std::string> available_isas() {
  std::vector<std::string> names;
  std::string why;
  for (const char* name : {"generic", "avx2", "avx512"})
    if (lookup(name, &why)) names.push_back(name);
  return names;
}

std::string default_isa() { return best()->name; }

}  // namespace ktmoe
