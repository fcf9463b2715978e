// Reading packed blobs back by the formulas of packed_format.h (see packed_reference.h).
#include "packed_reference.h"

#include "kernels/pack.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

int64_t ref_packed_row(const PackedMatrixHeader& h, int64_t r) {
  if (h.role != uint8_t(MatrixRole::kGateUp)) return r;
  const int64_t inter = h.n / 2;
  if (r < inter) return 32 * (r / 16) + r % 16;
  r -= inter;
  return 32 * (r / 16) + 16 + r % 16;
}

}  // namespace

Decoded decode(const uint8_t* blob) {
  Decoded D;
  std::memcpy(&D.h, blob, sizeof(D.h));
  const auto& h = D.h;
  D.n = h.n, D.k = h.k, D.np = h.np, D.kp = h.kp, D.f = WeightFormat(h.format);
  D.g = D.f == WeightFormat::kBF16 ? 0 : h.group;
  D.ng = D.g ? D.kp / D.g : 0;
  D.touched.assign(size_t(h.total_bytes), 0);
  for (int i = 0; i < 64; ++i) D.touched[i] = 1;
  D.packed_of.resize(size_t(D.n));
  D.logical_of.assign(size_t(D.np), -1);
  for (int64_t r = 0; r < D.n; ++r) {
    D.packed_of[r] = ref_packed_row(h, r);
    D.logical_of[D.packed_of[r]] = r;
  }
  D.w.assign(size_t(D.np * D.kp), 0.0);
  D.wi.assign(size_t(D.np * D.kp), 0);
  D.wb.assign(size_t(D.np * D.kp), 0);
  D.s.assign(size_t(D.np), 0.f);
  D.d.assign(size_t(D.np * std::max<int64_t>(D.ng, 1)), 0.f);
  auto rd16 = [&](int64_t off) {
    D.touched[off] = D.touched[off + 1] = 1;
    return uint16_t(blob[off] | (blob[off + 1] << 8));
  };
  const int64_t dof = h.data_offset, sof = h.scale_offset;
  for (int64_t pr = 0; pr < D.np; ++pr) {
    const int64_t blk = pr / 16, i = pr % 16;
    if (D.f == WeightFormat::kINT8) {  // fp32 s per (block, group) record, n % 16 inside
      for (int64_t G = 0; G < D.ng; ++G) {
        const int64_t off = sof + ((blk * D.ng + G) * 16 + i) * 4;
        for (int b = 0; b < 4; ++b) D.touched[off + b] = 1;
        std::memcpy(&D.d[pr * D.ng + G], blob + off, 4);
      }
      D.s[pr] = D.d[pr * D.ng];
    }
    if (D.f == WeightFormat::kINT4)
      for (int64_t G = 0; G < D.ng; ++G) {
        D.d[pr * D.ng + G] = bf16_value(rd16(sof + (blk * D.ng + G) * 32 + i * 2));
      }
    for (int64_t c = 0; c < D.kp; ++c) {
      const size_t e = size_t(pr * D.kp + c);
      if (D.f == WeightFormat::kBF16) {
        D.wb[e] = rd16(dof + blk * (D.kp * 32) + (c / 2) * 64 + i * 4 + (c % 2) * 2);
        D.w[e] = bf16_value(D.wb[e]);
      } else if (D.f == WeightFormat::kINT8) {
        const int64_t off = dof + blk * (D.kp * 16) + (c / 4) * 64 + i * 4 + (c % 4);
        D.touched[off] = 1;
        D.wi[e] = int32_t(blob[off]) - 128;
        D.w[e] = double(D.d[pr * D.ng + c / D.g]) * D.wi[e];
      } else {
        const int64_t off = dof + blk * (D.kp * 8) + (c / 8) * 64 + i * 4 + (c % 4);
        D.touched[off] = 1;
        D.wi[e] = (c % 8) < 4 ? (blob[off] & 15) : (blob[off] >> 4);
        const int64_t G = c / D.g;
        D.w[e] = double(D.d[pr * D.ng + G]) * kInt4Levels[D.wi[e]];
      }
    }
  }
  return D;
}

// Spec of the int4 group search, reimplemented: the smallest squared error over the
// candidate scales (both signs: each base's factors and their refits), nearest levels
// by distance.
double ref_int4_best_err(const float* v, int64_t len) {
  float lo = 0, hi = 0;  // min and max of v and 0
  for (int64_t i = 0; i < len; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
  auto levels_err = [&](float d, std::vector<int>* lv) {
    double err = 0;
    for (int64_t i = 0; i < len; ++i) {
      int best = 0;  // nearest level of v / d, the lower one on ties
      const float x = v[i] * (1.f / d);
      for (int q = 1; q < 16; ++q)
        if (std::fabs(x - kInt4Levels[q]) < std::fabs(x - kInt4Levels[best])) best = q;
      if (lv) (*lv)[size_t(i)] = kInt4Levels[best];
      const double e = double(v[i]) - double(d) * kInt4Levels[best];
      err += e * e;
    }
    return err;
  };
  double best = 0;
  for (int64_t i = 0; i < len; ++i) best += double(v[i]) * v[i];  // d = 0
  std::vector<int> lv(static_cast<size_t>(len));
  const float bottom = -float(kInt4Levels[0]), top = float(kInt4Levels[15]);
  for (float base : {std::max(-lo / bottom, hi / top), -std::max(hi / bottom, -lo / top)})
    for (float f : {1.05f, 1.0f, 0.95f, 0.9f}) {
      const float d = ref_bf16_value(base * f);
      if (d == 0) continue;
      best = std::min(best, levels_err(d, &lv));
      double num = 0, den = 0;
      for (int64_t i = 0; i < len; ++i) {
        const double l = lv[static_cast<size_t>(i)];
        num += double(v[i]) * l, den += l * l;
      }
      const float refit = ref_bf16_value(float(num / den));
      if (refit != 0) best = std::min(best, levels_err(refit, nullptr));
    }
  return best;
}

std::vector<float> random_matrix(int64_t n, int64_t k, Rng& rng, bool with_constants) {
  std::vector<float> w(static_cast<size_t>(n * k));
  const double sd = 1.0 / std::sqrt(double(k));
  for (auto& v : w) v = float(rng.gauss() * sd);
  if (with_constants && n > 3) {
    for (int64_t c = 0; c < std::min<int64_t>(k, 32); ++c) w[size_t(1 * k + c)] = 0.25f;  // constant group
    for (int64_t c = 0; c < std::min<int64_t>(k, 32); ++c) w[size_t(2 * k + c)] = 0.f;    // zero group
    for (int64_t c = 0; c < k; ++c) w[size_t(3 * k + c)] = 0.f;                            // zero row
  }
  return w;
}

AlignedBytes pack(const PackedMatrixHeader& h, const std::vector<float>& w, uint8_t fill) {
  AlignedBytes out(size_t(h.total_bytes), fill);
  std::vector<const float*> rows(static_cast<size_t>(h.n));
  for (int64_t r = 0; r < h.n; ++r) rows[r] = w.data() + r * h.k;
  pack_matrix(h, rows.data(), out.get());
  return out;
}

}  // namespace ktmoe_test
