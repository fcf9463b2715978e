// [NOTE] Packing one dense expert matrix into the layout of packed_format.h.
//
// pack_matrix() writes a whole blob: it first zeroes all header.total_bytes
// bytes (so every alignment gap, the header's pad/reserved and every padded
// element start at 0), then writes the header and, for each packed row
// (output column) that maps to a dense row, its data and scales:
//
//   kBF16  bf16(w) with round-to-nearest-even at the VNNI pair offset.
//   kINT8  per (row, group G of header.group inputs; one group = kp by default):
//          s = max|w| / 127 (fp32) over the group's valid columns, u = clamp(round(w / s),
//          -127, 127) + 128 (round half away from zero). A padded *element* (k <= c < kp,
//          or a padded row) holds u = 128, the encoding of weight 0 ("padded weights are
//          0"); padded rows and groups entirely in padding have s = 0.
//   kINT4  per (row, group) of valid values v (codebook L = kInt4Levels, from -64 to 56;
//          vmin / vmax = min / max of v): two bases, d+ = max(-vmin / 64, vmax / 56)
//          (d > 0: the range fits [-64d, 56d]) and d- = -max(vmax / 64, -vmin / 56)
//          (d < 0, the range mirrored). For each base, then each factor f in
//          kInt4ScaleFactors: d = bf16(base * f), q = the nearest level of
//          v * (1/d) (ties to the lower level), then the refit
//          d' = bf16(Σ v·L[q] / Σ L[q]²) (double) with q re-chosen for d'.
//          Of these candidates (d+'s, then d-'s; each f's d, then its d') the one
//          with the smallest squared error Σ (v - d·L[q])² (double) is kept; ties
//          keep the first; a candidate that is 0 in bf16 is skipped.
//          All-zero v (or a range below bf16's) gives d = 0, q = 0. Padded columns
//          hold q = 0; groups or rows entirely in padding hold q = 0, d = 0.
//   kFP8   per (row, group) of valid values v: s = max|v| / 448 (fp32), the byte
//          e4m3_from_float(v / s) (round to nearest even; s = 0: byte 0), at the pair
//          offset of fp8_format.h, and s in the row's (block, group) scale record.
//          Padded columns, groups and rows hold byte 0 and s = 0. (FP8 checkpoints keep
//          their own bytes and scales: pack_fp8.h.)
//   kINT4A per (row, group) of valid values v, GPTQ's min/max: lo = min(v, 0), hi = max(v, 0),
//          s = bf16((hi - lo) / 15) (as compressed-tensors stores it: then s * (q - z) is exact, and
//          packing the unpacked weights again gives the same bytes), z = clamp(round(-lo / s), 0, 15),
//          q = clamp(round(v / s) + z, 0, 15), rounding half to even; s = 0: q = z = 0. Written by int4a_store_row
//          (pack_int4_affine.h; int4 checkpoints keep their own codes, scales and zeros there).
//   kMXFP4 per (row, group) of valid values v, OCP MX: e = e8m0_for_amax(max|v|) (127 + floor(log2
//          max|v|) - 2, at least 0), codes e2m1_from_float(v * 2^(127 - e)) (nearest with v's sign, ties to the even
//          code), written by mxfp4_store_row (pack_mxfp4.h; MXFP4 checkpoints keep their own codes and
//          scales there).
//
// Row mapping: packed row pr = 16*b + i. kGateUp: block 2j holds gate rows
// 16j + i, block 2j + 1 up rows I + 16j + i (rows >= I inside a block are
// padding). kPlain / kDown: dense row pr (pr >= n is padding).
//
// Group vs kp (int4, fp8, int8 given a group_size): scales are indexed by k / g with kp / g groups, so kp
// must be a multiple of g. For g = 32 that is kp = round_up(k, 32); for a larger
// g (64, 128, ...) packed_matrix_header() uses kp = round_up(k, g), still a
// multiple of 32 as the format requires.
//
// Non-finite weights are refused (std::domain_error naming row and column): int8's
// max|w| and int4's min / max would drop a NaN and turn it into finite values.
//
// Deterministic: plain scalar arithmetic in a fixed order, no threads.
#include "kernels/pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/fp8_format.h"
#include "kernels/generic/bf16_scalar.h"
#include "kernels/pack_int4_affine.h"
#include "kernels/pack_mxfp4.h"

namespace ktmoe {
namespace {

// Scale factors tried by the int4 search, per sign: on N(0,1) and Student-t(3) groups of
// 32, six (0.85 .. 1.1) lower the weight error by < 0.1 %, three (1, 0.95, 0.9) raise it
// by 0.3 % on N(0,1).
constexpr float kInt4ScaleFactors[] = {1.05f, 1.0f, 0.95f, 0.9f};
constexpr float kInt4Lo = -float(kInt4Levels[0]), kInt4Hi = float(kInt4Levels[15]);  // 64, 56

// Index of the level of kInt4Levels nearest to x (ties to the lower one) = the number of
// midpoints (L[i] + L[i+1]) / 2 below x. The levels are integers, so the doubled midpoints
// m_i = L[i] + L[i+1] are too, and m_i < 2x  <=>  m_i <= (the largest integer below 2x):
// one lookup in below_or_at (entry j: the number of m_i <= j) instead of 15 compares.
// 2x is exact in fp32.
struct Int4NearestTable {
  static constexpr int kFirst = kInt4Levels[0] + kInt4Levels[1], kLast = kInt4Levels[14] + kInt4Levels[15];
  uint8_t below_or_at[kLast - kFirst + 1] = {};
  constexpr Int4NearestTable() {
    for (int j = kFirst; j <= kLast; ++j)
      for (int i = 0; i < 15; ++i) below_or_at[j - kFirst] += kInt4Levels[i] + kInt4Levels[i + 1] <= j;
  }
};
constexpr Int4NearestTable kInt4Nearest;

inline uint8_t nearest_int4_level(float x) {
  const float y = 2.f * x;
  if (!(y > float(Int4NearestTable::kFirst))) return 0;  // also NaN: no midpoint is below
  if (y > float(Int4NearestTable::kLast)) return 15;
  const int t = static_cast<int>(y);  // toward zero; the largest integer below y is t - (t >= y)
  return kInt4Nearest.below_or_at[t - (float(t) >= y) - Int4NearestTable::kFirst];
}

// Dense row of packed row pr, or -1 for a padded row.
int64_t dense_row(const PackedMatrixHeader& h, int64_t pr) {
  const int64_t block = pr / kBlockN, i = pr % kBlockN;
  if (h.role == static_cast<uint8_t>(MatrixRole::kGateUp)) {
    const int64_t inter = h.n / 2;
    const int64_t r = (block / 2) * kBlockN + i;
    if (r >= inter) return -1;
    return (block % 2 == 0) ? r : inter + r;
  }
  return pr < h.n ? pr : -1;
}

void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

void pack_row_bf16(const PackedMatrixHeader& h, int64_t pr, const float* w, uint8_t* data) {
  uint8_t* base = data + (pr / kBlockN) * (int64_t(h.kp) * 32) + (pr % kBlockN) * 4;
  for (int64_t c = 0; c < h.k; ++c)
    store_u16(base + (c / 2) * 64 + (c % 2) * 2, f32_to_bf16_rne(w[c]));
  // padded columns stay 0 (bf16 +0.0)
}

// w == nullptr: a padded row (all weights 0). Scale of (pr, G): the fp32 at
// ((block * (kp / g) + G) * 16 + pr % 16) * 4, which is pr * 4 for one group (per row).
void pack_row_int8(const PackedMatrixHeader& h, int64_t pr, const float* w, uint8_t* data,
                   uint8_t* scales) {
  const int64_t g = h.group, ngroups = h.kp / g, block = pr / kBlockN, i = pr % kBlockN;
  uint8_t* base = data + block * (int64_t(h.kp) * 16) + i * 4;
  for (int64_t G = 0; G < ngroups; ++G) {
    const int64_t c0 = G * g, c1 = w ? std::min<int64_t>(h.k, c0 + g) : c0;
    float amax = 0.f;
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[c]));
    const float s = amax / 127.f;
    for (int64_t c = c0; c < c0 + g; ++c) {
      int wq = 0;
      if (c < c1 && s > 0.f) wq = static_cast<int>(std::min(127.f, std::max(-127.f, std::round(w[c] / s))));
      base[(c / 4) * 64 + (c % 4)] = static_cast<uint8_t>(wq + 128);
    }
    store_f32(scales + ((block * ngroups + G) * kBlockN + i) * 4, s);
  }
}

// q_out[i] = the nearest level index of v[i] / d for the bf16 scale db. Returns the squared
// error Σ (v - d·L[q])² and the refit's sums Σ v·L[q] and Σ L[q]², in double, each summed
// in 4 interleaved partial sums (the sums are latency-bound otherwise; the choice between
// candidates is insensitive to the order, the native test checks it to 1e-9).
struct Int4Fit {
  double err = 0, vl = 0, ll = 0;
};
Int4Fit assign_int4(const float* v, int64_t len, uint16_t db, uint8_t* q_out) {
  const float d = bf16_to_f32(db), inv = 1.f / d;
  auto step = [&](int64_t i, Int4Fit& acc) {
    q_out[i] = nearest_int4_level(v[i] * inv);
    const double l = kInt4Levels[q_out[i]], e = double(v[i]) - double(d) * l;
    acc.err += e * e, acc.vl += double(v[i]) * l, acc.ll += l * l;
  };
  Int4Fit a, b, c, e;
  int64_t i = 0;
  for (; i + 4 <= len; i += 4) step(i, a), step(i + 1, b), step(i + 2, c), step(i + 3, e);
  for (; i < len; ++i) step(i, a);
  return {(a.err + b.err) + (c.err + e.err), (a.vl + b.vl) + (c.vl + e.vl), (a.ll + b.ll) + (c.ll + e.ll)};
}

// Chooses the bf16 scale of one group of values v[0..len) and writes q[0..len) ([NOTE]).
uint16_t quantize_group_int4(const float* v, int64_t len, uint8_t* q_out, uint8_t* q_tmp) {
  float vmin = 0.f, vmax = 0.f;
  for (int64_t i = 0; i < len; ++i) vmin = std::min(vmin, v[i]), vmax = std::max(vmax, v[i]);
  std::memset(q_out, 0, static_cast<size_t>(len));
  uint16_t best_d = 0;
  double best_err = std::numeric_limits<double>::infinity();
  auto consider = [&](uint16_t db) {  // assigns q_tmp for db, keeps it if it is the best so far
    const Int4Fit fit = assign_int4(v, len, db, q_tmp);
    if (fit.err < best_err) {  // strict: the first candidate wins ties
      best_err = fit.err, best_d = db;
      std::memcpy(q_out, q_tmp, static_cast<size_t>(len));
    }
    return fit;
  };
  const float bases[2] = {std::max(-vmin / kInt4Lo, vmax / kInt4Hi), -std::max(vmax / kInt4Lo, -vmin / kInt4Hi)};
  for (float base : bases)
    for (float f : kInt4ScaleFactors) {
      const uint16_t db = f32_to_bf16_rne(base * f);
      if (bf16_to_f32(db) == 0.f) continue;  // all zero, or below bf16's range
      const Int4Fit fit = consider(db);
      const uint16_t refit = f32_to_bf16_rne(static_cast<float>(fit.vl / fit.ll));  // least squares on db's levels
      if (bf16_to_f32(refit) != 0.f) consider(refit);
    }
  return best_d;
}

void pack_row_int4(const PackedMatrixHeader& h, int64_t pr, const float* w, uint8_t* data,
                   uint8_t* scales, uint8_t* q_buf, uint8_t* q_tmp) {
  const int64_t g = h.group, ngroups = h.kp / g, block = pr / kBlockN, i = pr % kBlockN;
  uint8_t* base = data + block * (int64_t(h.kp) * 8) + i * 4;
  for (int64_t G = 0; G < ngroups; ++G) {
    const int64_t c0 = G * g, len = std::min<int64_t>(h.k, c0 + g) - c0;
    if (len <= 0) break;  // the rest is padding: q = d = 0 already
    const uint16_t d = quantize_group_int4(w + c0, len, q_buf, q_tmp);
    store_u16(scales + (block * ngroups + G) * kInt4ScaleBytes + i * 2, d);
    for (int64_t t = 0; t < len; ++t) {
      const int64_t c = c0 + t;
      uint8_t& byte = base[(c / 8) * 64 + (c % 4)];
      byte = static_cast<uint8_t>(byte | (q_buf[t] << ((c % 8) < 4 ? 0 : 4)));
    }
  }
}

void pack_row_fp8(const PackedMatrixHeader& h, int64_t pr, const float* w, uint8_t* data, uint8_t* scales) {
  for (int64_t g = 0; g < h.kp / h.group; ++g) {
    const int64_t c0 = g * h.group, c1 = std::min<int64_t>(h.k, c0 + h.group);
    float amax = 0.f;
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[c]));
    const float s = amax / 448.f;
    if (s > 0.f)
      for (int64_t c = c0; c < c1; ++c) data[fp8_data_offset(h.kp, pr, c)] = e4m3_from_float(w[c] / s);
    store_f32(scales + fp8_scale_offset(h.kp, h.group, pr, g), s);
  }
}

// int4_affine from dense weights ([NOTE]); q: k codes, s / z: kp / group scales and zero points (scratch).
void pack_row_int4_affine(const PackedMatrixHeader& h, int64_t pr, const float* w, uint8_t* q, float* s, uint8_t* z,
                          uint8_t* data, uint8_t* scales) {
  for (int64_t g = 0; g < h.kp / h.group; ++g) {
    const int64_t c0 = g * h.group, c1 = std::min<int64_t>(h.k, c0 + h.group);
    float lo = 0.f, hi = 0.f;
    for (int64_t c = c0; c < c1; ++c) lo = std::min(lo, w[c]), hi = std::max(hi, w[c]);
    s[g] = round_to_bf16((hi - lo) / 15.f);  // a bf16 s: s * (q - z) is exact in fp32, so repacking is the identity
    z[g] = 0;
    if (!(s[g] > 0.f)) {
      s[g] = 0.f;
      for (int64_t c = c0; c < c1; ++c) q[c] = 0;
      continue;
    }
    const float zf = std::nearbyint(-lo / s[g]);
    z[g] = static_cast<uint8_t>(std::min(15.f, std::max(0.f, zf)));
    for (int64_t c = c0; c < c1; ++c)
      q[c] = static_cast<uint8_t>(std::min(15.f, std::max(0.f, std::nearbyint(w[c] / s[g]) + float(z[g]))));
  }
  int4a_store_row(h, pr, q, s, z, data, scales);
}

// mxfp4 from dense weights ([NOTE]); q: k codes, e: kp / group E8M0 bytes (scratch).
void pack_row_mxfp4(const PackedMatrixHeader& h, int64_t pr, const float* w, uint8_t* q, uint8_t* e, uint8_t* data,
                    uint8_t* scales) {
  for (int64_t g = 0; g < h.kp / h.group; ++g) {
    const int64_t c0 = g * h.group, c1 = std::min<int64_t>(h.k, c0 + h.group);
    float amax = 0.f;
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[c]));
    e[g] = e8m0_for_amax(amax);
    for (int64_t c = c0; c < c1; ++c) q[c] = e2m1_from_float(std::ldexp(w[c], kE8m0Bias - int(e[g])));
  }
  mxfp4_store_row(h, pr, q, e, data, scales);
}

void check_header(const PackedMatrixHeader& h) {
  if (h.magic != kPackedMagic || h.version != kPackedVersion)
    throw std::invalid_argument("pack_matrix: header has a bad magic or version");
  const WeightFormatTraits* traits = find_format_traits(h.format);
  if (!traits || h.role > static_cast<uint8_t>(MatrixRole::kDown) || h.n <= 0 || h.k <= 0 ||
      h.np % kBlockN != 0 || h.kp % kAlignK != 0 || h.kp < h.k || h.np < h.n)
    throw std::invalid_argument("pack_matrix: inconsistent header (use packed_matrix_header)");
  if (traits->group != GroupRule::kNone && (h.group <= 0 || h.kp % h.group))
    throw std::invalid_argument(std::string("pack_matrix: ") + traits->name + " group must divide kp");
}

}  // namespace

void check_exact_header(const PackedMatrixHeader& h, WeightFormat format, const char* who) {
  if (h.magic != kPackedMagic || h.version != kPackedVersion || h.format != uint8_t(format) ||
      h.role > static_cast<uint8_t>(MatrixRole::kDown) || h.n <= 0 || h.k <= 0 || h.group <= 0 ||
      h.group % kAlignK || h.kp % h.group || h.kp < h.k || h.np % kBlockN || h.np < h.n)
    throw std::invalid_argument(std::string(who) + ": inconsistent header (use packed_matrix_header)");
}

PackedMatrixHeader packed_matrix_header(WeightFormat format, MatrixRole role, int64_t n,
                                        int64_t k, int64_t group) {
  if (n <= 0 || k <= 0) throw std::invalid_argument("packed_matrix_header: n and k must be > 0");
  if (role == MatrixRole::kGateUp && n % 2 != 0)
    throw std::invalid_argument("packed_matrix_header: kGateUp needs n = 2*I (even)");
  const WeightFormatTraits* traits = find_format_traits(uint8_t(format));
  if (!traits) throw std::invalid_argument("packed_matrix_header: unknown weight format");
  int64_t kp = round_up(k, kAlignK), g = 0;  // GroupRule::kNone
  if (traits->group == GroupRule::kRow && group <= 0) g = kp;  // int8's default: one group per row
  if (traits->group == GroupRule::kChosen || (traits->group == GroupRule::kRow && group > 0)) {
    g = group > 0 ? group : traits->default_group;
    if (g % kAlignK != 0)
      throw std::invalid_argument(std::string("packed_matrix_header: ") + traits->name +
                                  " group must be a multiple of 32, got " + std::to_string(g));
    kp = round_up(k, g);  // kp / g whole groups per row, still a multiple of 32 (see [NOTE])
  }
  const int64_t np = role == MatrixRole::kGateUp ? 2 * round_up(n / 2, kBlockN) : round_up(n, kBlockN);
  if (np > std::numeric_limits<int32_t>::max() || kp > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("packed_matrix_header: matrix too large");

  PackedMatrixHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kPackedMagic;
  h.version = kPackedVersion;
  h.format = static_cast<uint8_t>(format);
  h.role = static_cast<uint8_t>(role);
  h.n = static_cast<int32_t>(n);
  h.k = static_cast<int32_t>(k);
  h.np = static_cast<int32_t>(np);
  h.kp = static_cast<int32_t>(kp);
  h.group = static_cast<int32_t>(g);
  h.data_offset = sizeof(PackedMatrixHeader);
  const int64_t data_bytes = (np / kBlockN) * block_data_bytes(format, kp);
  const int64_t scale_bytes = traits->scale_bytes ? np * (kp / g) * traits->scale_bytes : 0;  // a scale per (row, group)
  const int64_t data_end = round_up(h.data_offset + data_bytes, 64);
  h.scale_offset = scale_bytes ? data_end : 0;
  h.total_bytes = round_up(data_end + scale_bytes, 64);
  return h;
}

void pack_matrix(const PackedMatrixHeader& header, const float* const* rows, uint8_t* out) {
  check_header(header);
  for (int64_t r = 0; r < header.n; ++r)  // before any byte is written
    for (int64_t c = 0; c < header.k; ++c)
      if (!std::isfinite(rows[r][c]))
        throw std::domain_error(std::string(std::isnan(rows[r][c]) ? "nan" : "inf") + " at row " +
                                std::to_string(r) + ", column " + std::to_string(c));
  std::memset(out, 0, static_cast<size_t>(header.total_bytes));
  std::memcpy(out, &header, sizeof(header));
  uint8_t* data = out + header.data_offset;
  uint8_t* scales = header.scale_offset ? out + header.scale_offset : nullptr;
  const auto format = static_cast<WeightFormat>(header.format);
  // int4 scratch: the chosen q of one group and the candidate being tried.
  std::vector<uint8_t> q_buf(format == WeightFormat::kINT4 ? size_t(2 * header.group) : 0);
  // int4_affine scratch: one row's codes, and its scales and zero points.
  // mxfp4 scratch: one row's codes and E8M0 bytes.
  const bool affine = format == WeightFormat::kINT4A, nibbles = affine || format == WeightFormat::kMXFP4;
  std::vector<uint8_t> aq(nibbles ? size_t(header.kp) : 0), az(nibbles ? size_t(header.kp / header.group) : 0);
  std::vector<float> as(affine ? az.size() : 0);
  for (int64_t pr = 0; pr < header.np; ++pr) {
    const int64_t r = dense_row(header, pr);
    const float* w = r >= 0 ? rows[r] : nullptr;
    switch (format) {
      case WeightFormat::kBF16:
        if (w) pack_row_bf16(header, pr, w, data);
        break;
      case WeightFormat::kINT8: pack_row_int8(header, pr, w, data, scales); break;
      case WeightFormat::kFP8:
        if (w) pack_row_fp8(header, pr, w, data, scales);
        break;
      case WeightFormat::kINT4A:
        if (w) pack_row_int4_affine(header, pr, w, aq.data(), as.data(), az.data(), data, scales);
        break;
      case WeightFormat::kMXFP4:
        if (w) pack_row_mxfp4(header, pr, w, aq.data(), az.data(), data, scales);
        break;
      case WeightFormat::kINT4:
        if (w) {
          pack_row_int4(header, pr, w, data, scales, q_buf.data(), q_buf.data() + header.group);
        }
        break;
    }
  }
}

}  // namespace ktmoe
