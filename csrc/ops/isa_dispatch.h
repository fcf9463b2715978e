// Chooses the micro-kernel table: the best the CPU runs, or the one KTMOE_ISA /
// set_isa() forces (an error if the CPU lacks it or it is not built).
#pragma once
#include <string>
#include <vector>

#include "kernels/isa_kernels.h"

namespace ktmoe {

const IsaKernels& active_isa();
// "generic" | "avx2" | "avx512" | "auto". Throws c10::Error naming what is available.
void set_isa(const std::string& name);
std::vector<std::string> available_isas();  // best last
std::string default_isa();                  // what "auto" picks on this CPU

}  // namespace ktmoe
