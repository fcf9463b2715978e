// [NOTE] The gated activations between an expert's gate/up and down projections, as rows of one table.
//
// h = act(gate, up) per column, fp32, for every ISA (IsaKernels::gated_act). A row is a name, the
// formula, and its parameters in order; the op (ops/moe_forward.cpp) looks the row up by name and
// fills an Activation, the driver passes it to the ISA's gated_act and never branches on names.
// Python reads the table through torch_ktmoe._C.gated_activations() (bind_formats.cpp).
//
//   row              h                                                          parameters (defaults)
//   silu             silu(g) · u                                                 —
//   silu_clamp       silu(min(g, L)) · clamp(u, ±L)                              limit L (7)
//   silu_clamp_after min(silu(g), L) · clamp(u, ±L)                              limit L (7)
//   swiglu_oai       g' · sigmoid(α g') · (clamp(u, ±L) + 1),  g' = min(g, L)    alpha α (1.702), limit L (7)
//   swiglu_softcap   cg·tanh(g/cg) · sigmoid(g) · cu·tanh(u/cu)                  gate_softcap cg (30), up_softcap cu (30)
//
// silu(x) = x / (1 + exp(-x)), sigmoid(x) = 1 / (1 + exp(-x)). Every parameter is finite, limits and
// softcaps > 0 (make_activation says which is not). The clamps are written so that NaN stays NaN
// (as torch.clamp).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace ktmoe {

enum class GateActivation : uint8_t {
  kSilu = 0,
  kSiluClamp = 1,
  kSiluClampAfter = 2,
  kSwigluOai = 3,
  kSwigluSoftcap = 4,
};

constexpr int kMaxActivationParams = 2;

// One activation with its parameters, in its row's order (p[0], p[1]).
struct Activation {
  GateActivation kind = GateActivation::kSilu;
  float p[kMaxActivationParams] = {0.f, 0.f};
};

struct GatedActivationRow {
  GateActivation kind;
  const char* name;
  const char* formula;
  int num_params;
  const char* param_names[kMaxActivationParams];
  float defaults[kMaxActivationParams];
  const char* models;  // whose experts gate this way
};

// The rows, in kind order.
const GatedActivationRow* gated_activation_rows(int* count);
// The row named `name`, or nullptr.
const GatedActivationRow* gated_activation_row(std::string_view name);
// "" if `params` (n of them; 0: the row's defaults) are valid for `row`, else a sentence saying why not.
// On success, *out holds the activation.
std::string make_activation(const GatedActivationRow& row, const double* params, int n, Activation* out);

}  // namespace ktmoe
