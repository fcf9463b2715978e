// The ISA the ops run on: the process default (KTMOE_ISA at first use, then
// set_isa()), unless the calling thread chose one for its own calls
// (set_thread_isa(), what torch_ktmoe.isa_scope() uses). Which tables a CPU can
// run is kernels/isa_select.h; this file adds the defaults and the error text.
#pragma once
#include <string>
#include <vector>

#include "kernels/isa_kernels.h"

namespace ktmoe {

// The table the next op call on this thread uses.
const IsaKernels& active_isa();
// "generic" | "avx2" | "avx2_vnni" | "avx512" | "amx" | "auto": the process default. Throws c10::Error
// naming what is available.
void set_isa(const std::string& name);
// The same for op calls made on this thread only, over the process default
// ("" removes the thread's choice). Returns the thread's previous choice ("" if
// none), so a caller can restore it.
std::string set_thread_isa(const std::string& name);
std::vector<std::string> available_isas();  // best last
std::string default_isa();                  // what "auto" picks on this CPU

}  // namespace ktmoe
