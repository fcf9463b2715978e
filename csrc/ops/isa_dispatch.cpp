#include "ops/isa_dispatch.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>

#include "common/cpu_features.h"
#include "kernels/isa_select.h"

namespace ktmoe {
namespace {

// "" and "auto": the best this CPU runs.
const IsaKernels* resolve(const std::string& name) {
  std::string why;
  const IsaKernels* k = find_isa(name.empty() ? "auto" : name, cpu_features(), &why);
  TORCH_CHECK(k, "ktmoe: cannot use ISA '", name, "': ", why, ". Available: ", c10::Join(", ", available_isas()));
  return k;
}

std::atomic<const IsaKernels*>& process_isa() {
  static std::atomic<const IsaKernels*> isa{[] {
    const char* env = std::getenv("KTMOE_ISA");
    return resolve(env ? env : "");
  }()};
  return isa;
}

// This thread's choice (set_thread_isa) and its name as given; null: the process default.
thread_local const IsaKernels* thread_isa = nullptr;
thread_local std::string thread_isa_name;

}  // namespace

const IsaKernels& active_isa() { return thread_isa ? *thread_isa : *process_isa().load(); }

void set_isa(const std::string& name) { process_isa().store(resolve(name)); }

std::string set_thread_isa(const std::string& name) {
  const IsaKernels* k = name.empty() ? nullptr : resolve(name);
  std::string previous = std::move(thread_isa_name);
  thread_isa = k;
  thread_isa_name = name;
  return previous;
}

std::vector<std::string> available_isas() { return usable_isa_names(cpu_features()); }

std::string default_isa() { return best_isa(cpu_features()).name; }

}  // namespace ktmoe
