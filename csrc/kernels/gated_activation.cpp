// The gated activation table (gated_activation.h): rows, lookup by name, parameter checks.
#include "kernels/gated_activation.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace ktmoe {
namespace {

constexpr GatedActivationRow kRows[] = {
    {GateActivation::kSilu, "silu", "silu(g) * u", 0, {}, {}, "most MoE families"},
    {GateActivation::kSiluClamp, "silu_clamp", "silu(min(g, limit)) * clamp(u, -limit, limit)", 1, {"limit"}, {7.f},
     "DeepSeek-V4, GLM-5-Next, HY-V4"},
    {GateActivation::kSiluClampAfter, "silu_clamp_after", "min(silu(g), limit) * clamp(u, -limit, limit)", 1,
     {"limit"}, {7.f}, "Step-3.7, Bailing-Hybrid"},
    {GateActivation::kSwigluOai, "swiglu_oai",
     "g' * sigmoid(alpha * g') * (clamp(u, -limit, limit) + 1), g' = min(g, limit)", 2, {"alpha", "limit"},
     {1.702f, 7.f}, "gpt-oss, MiniMax-M3"},
    {GateActivation::kSwigluSoftcap, "swiglu_softcap",
     "gate_softcap * tanh(g / gate_softcap) * sigmoid(g) * up_softcap * tanh(u / up_softcap)", 2,
     {"gate_softcap", "up_softcap"}, {30.f, 30.f}, "Inkling 2"},
};
static_assert(std::size(kRows) == size_t(GateActivation::kSwigluSoftcap) + 1, "a row for every GateActivation");

// alpha may be any finite number; limits and softcaps bound a magnitude, so they must be > 0.
bool must_be_positive(std::string_view param) { return param != "alpha"; }

// A parameter as a user wrote it: the shortest form that reads back the same double (1e-50, not 0.000000).
std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  for (int digits = 1; digits < 17; ++digits) {  // fewer digits while they still read back v
    char shorter[40];
    std::snprintf(shorter, sizeof shorter, "%.*g", digits, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

}  // namespace

const GatedActivationRow* gated_activation_rows(int* count) {
  *count = int(std::size(kRows));
  return kRows;
}

const GatedActivationRow* gated_activation_row(std::string_view name) {
  for (const auto& row : kRows)
    if (name == row.name) return &row;
  return nullptr;
}

std::string make_activation(const GatedActivationRow& row, const double* params, int n, Activation* out) {
  if (n != 0 && n != row.num_params)
    return std::string(row.name) + " takes " + std::to_string(row.num_params) + " parameter(s), got " +
           std::to_string(n);
  Activation act;
  act.kind = row.kind;
  for (int i = 0; i < row.num_params; ++i) {
    const double v = n ? params[i] : double(row.defaults[i]);
    const float f = float(v);
    if (!std::isfinite(f) || (must_be_positive(row.param_names[i]) && !(f > 0.f)))
      return std::string(row.name) + ": " + row.param_names[i] + " must be a finite number" +
             (must_be_positive(row.param_names[i]) ? " > 0" : "") + " in fp32, got " + number(v) +
             (std::isfinite(v) && double(f) != v ? " (" + number(double(f)) + " in fp32)" : "");
    act.p[i] = f;
  }
  *out = act;
  return "";
}

}  // namespace ktmoe
