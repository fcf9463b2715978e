// The ISA micro-kernel tables these tests run: those the CPU supports and that are complete.
#pragma once

#include <vector>

#include "kernels/isa_kernels.h"

namespace ktmoe_test {

using namespace ktmoe;

struct Isa {
  const IsaKernels* k;
  bool usable;
};

// Every ISA of isa_select.cpp's rows, worst to best, chosen as the extension does (find_isa); prints SKIP, with
// find_isa's reason, for one the CPU lacks or whose table has null entries.
std::vector<Isa> usable_isas();

// isas' tables, then, where the CPU runs avx512, *variant: a copy of avx512's table named `name` with patch
// applied (a kernel no table lists but another calls: amx's int16 decode rows), to test it for every M.
std::vector<const IsaKernels*> tables_and_avx512_variant(const std::vector<Isa>& isas, IsaKernels* variant,
                                                         const char* name, void (*patch)(IsaKernels&));

}  // namespace ktmoe_test
