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

}  // namespace ktmoe_test
