// Which ISA tables the native tests run (see isa_tables.h).
#include "isa_tables.h"

#include <cstdio>
#include <string>

#include "check.h"
#include "common/cpu_features.h"
#include "kernels/isa_select.h"

namespace ktmoe_test {

using namespace ktmoe;

std::vector<Isa> usable_isas() {  // the selection the extension uses (kernels/isa_select.h)
  std::vector<Isa> out;
  for (const char* name : {"generic", "avx2", "avx2_vnni", "avx512", "amx"}) {
    std::string why;
    if (const IsaKernels* k = find_isa(name, cpu_features(), &why)) {
      std::printf("INFO isa %s: complete, testing\n", name);
      out.push_back({k, true});
    } else {
      SKIP(strf("isa %s: skipped: %s", name, why.c_str()));
    }
  }
  return out;
}

}  // namespace ktmoe_test
