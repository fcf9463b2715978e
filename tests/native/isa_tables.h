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

// generic, avx2, avx512 in that order; prints SKIP for a table the CPU lacks or with null entries.
std::vector<Isa> usable_isas();

}  // namespace ktmoe_test
