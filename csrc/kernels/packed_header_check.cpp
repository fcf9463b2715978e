// [NOTE] Packed header validation (see packed_header_check.h).
#include "kernels/packed_header_check.h"

#include <cstring>
#include <stdexcept>

#include "kernels/pack.h"

namespace ktmoe {
namespace {

std::string field(const char* name, int64_t have, int64_t want) {
  return std::string(name) + " is " + std::to_string(have) + ", expected " + std::to_string(want);
}

}  // namespace

std::string compare_packed_header(const PackedMatrixHeader& have, const PackedMatrixHeader& want) {
  if (std::memcmp(&have, &want, sizeof(have)) == 0) return "";
  if (have.magic != want.magic) return field("magic", have.magic, want.magic);
  if (have.version != want.version) return field("version", have.version, want.version);
  if (have.format != want.format) return field("format", have.format, want.format);
  if (have.role != want.role) return field("role", have.role, want.role);
  if (have.n != want.n) return field("n", have.n, want.n);
  if (have.k != want.k) return field("k", have.k, want.k);
  if (have.np != want.np) return field("np", have.np, want.np);
  if (have.kp != want.kp) return field("kp", have.kp, want.kp);
  if (have.group != want.group) return field("group", have.group, want.group);
  if (have.reserved != want.reserved) return field("reserved", have.reserved, want.reserved);
  if (have.data_offset != want.data_offset) return field("data_offset", have.data_offset, want.data_offset);
  if (have.scale_offset != want.scale_offset) return field("scale_offset", have.scale_offset, want.scale_offset);
  if (have.total_bytes != want.total_bytes) return field("total_bytes", have.total_bytes, want.total_bytes);
  return "pad bytes are not zero";
}

std::string check_packed_header(const PackedMatrixHeader& h, MatrixRole role, int64_t row_bytes) {
  if (h.magic != kPackedMagic || h.version != kPackedVersion)
    return "bad header magic/version (" + std::to_string(h.magic) + "/" + std::to_string(h.version) +
           "): not packed expert data";
  if (h.role != uint8_t(role))
    return field("role", h.role, uint8_t(role)) + ": packed " +
           (h.role == uint8_t(MatrixRole::kGateUp) ? "gate_up" : h.role == uint8_t(MatrixRole::kDown) ? "down" : "other") +
           " weights in the wrong argument position";
  const WeightFormatTraits* traits = find_format_traits(h.format);
  if (!traits) return "format is " + std::to_string(h.format) + ", expected " + weight_format_ids();
  const auto format = WeightFormat(h.format);
  const bool chosen_group = traits->group == GroupRule::kChosen;
  if (h.n <= 0 || (role == MatrixRole::kGateUp && h.n % 2 != 0)) return field("n", h.n, 2 * ((h.n + 1) / 2));
  if (h.k <= 0) return field("k", h.k, kAlignK);
  if (chosen_group && (h.group <= 0 || h.group % kAlignK != 0))
    return field("group", h.group, traits->default_group) + " (a positive multiple of 32)";
  PackedMatrixHeader want;
  try {
    want = packed_matrix_header(format, role, h.n, h.k, traits->group != GroupRule::kNone ? h.group : 0);
  } catch (const std::exception& e) {
    return std::string("n/k/group are inconsistent: ") + e.what();
  }
  // When format, n and k imply another blob size, they are the forged fields.
  if (want.total_bytes != row_bytes && h.total_bytes == row_bytes)
    return "format " + std::to_string(h.format) + " with n " + std::to_string(h.n) + ", k " + std::to_string(h.k) +
           " implies np " + std::to_string(want.np) + " and total_bytes " + std::to_string(want.total_bytes) +
           ", but np is " + std::to_string(h.np) + " and rows are " + std::to_string(row_bytes) + " bytes";
  if (std::string r = compare_packed_header(h, want); !r.empty()) return r;
  if (h.total_bytes != row_bytes) return field("total_bytes", h.total_bytes, row_bytes);
  return "";
}

}  // namespace ktmoe
