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
  for (const std::string& name : isa_names()) {
    std::string why;
    if (const IsaKernels* k = find_isa(name, cpu_features(), &why)) {
      CHECK(name == k->name, strf("the table of isa %s names itself %s", name.c_str(), k->name));
      std::printf("INFO isa %s: complete, testing\n", name.c_str());
      out.push_back({k, true});
    } else {
      SKIP(strf("isa %s: skipped: %s", name.c_str(), why.c_str()));
    }
  }
  return out;
}

std::vector<const IsaKernels*> tables_and_avx512_variant(const std::vector<Isa>& isas, IsaKernels* variant,
                                                         const char* name, void (*patch)(IsaKernels&)) {
  std::vector<const IsaKernels*> out;
  for (const Isa& isa : isas) out.push_back(isa.k);
  for (const Isa& isa : isas)
    if (std::string(isa.k->name) == "avx512") {
      *variant = *isa.k;
      variant->name = name;
      patch(*variant);
      out.push_back(variant);
    }
  return out;
}

}  // namespace ktmoe_test
