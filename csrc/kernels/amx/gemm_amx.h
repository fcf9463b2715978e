// [NOTE] The amx gemms (kBF16, kINT8, kINT4, and kBF16 tiles over weights another format
// decodes to bf16: kMXFP4 with its scales folded in, kFP8 and kINT4A with a scale per k-group
// applied after each group) as one template over a TileOps policy: the
// real instructions (tile_ops_native.h, in gemm_bf16_amx.cpp / gemm_int_amx.cpp) or the
// emulator (tile_ops_emulated.h, in tests/native), so the same indexing and tails run
// everywhere. Plain C++ besides the tile calls (and a GCC vector shuffle); no intrinsics.
//
//   c[r, 16*(b - b0) + j] = Σ_k a[r][k] · W[16b + j][k]   r < m, b0 <= b < b1, j < 16
// fully dequantized as the IsaKernels contract says (isa_kernels.h).
//
// Loop nest (tile layout in tile_config.h):
//   for each pair of packed blocks (the last alone when b1 - b0 is odd):
//     prepare the pair's B source (kINT4: unpack the codes to u8 k-quads, kp/4 rows of
//     64 bytes per block; a decoded format: its BlockDecoder writes the block as kBF16
//     k-pair rows, kp/2 rows of 64 bytes; both L2-resident, reused by every row pair;
//     kINT8 with kp % 64 = 32: the last half step copied into a zero-padded B tile)
//     for each pair of 16-row groups (the last alone, rows past m zero):
//       for each group G of steps (kBF16 / kINT8: one group, all of kp; kINT4 and a decoded
//       format with GroupScales: w->group / 32 steps):
//         zero C; per step: load A[i], B[j], C[i][j] += A[i]·B[j]; store C to a 2 KiB..4 KiB
//         buffer; the format's epilogue (below) reads it
// The driver calls with at most 32 rows (moe_driver.cpp kTokenTile), so a call is one row
// pair (or one 16-row group) over a panel of blocks. A tiles read the caller's rows in place; the last
// m % 16 rows (and all rows when a step would read past the row stride) are staged with zero
// padding (stage_activations), so tile loads never read past the caller's rows.
//
// Epilogues (the same float operations, in the same order, as the avx512 kernels, whose
// integer sums are the same exact int32: so kINT8 / kINT4 give avx512's bits):
//   kBF16: c = C (each tdpbf16ps step adds (even + odd) of its 16 k-pairs, tile_ops_emulated.h)
//   decoded with GroupScales (kFP8, kINT4A): f = fma(s[n,G], C_G, f) over G (f from +0), then, with
//          row sums, f = fma(o[n,G], xsum[r,G], f); c = f: the avx512 kernels' group_end
//          (gemm_decoded_avx512.h) on tdpbf16ps's sums
//   kINT8: c = (sx[r] · s[n]) · float(C − 128·gsum[r])          C = Σ_k u·xq (tdpbsud); per channel
//          only: grouped int8 runs avx512's kernel (gemm_int_amx.cpp says why)
//   kINT4: f = fma(d[n,G], float(C_G − 64·gsum[r,G]), f) over G, c = sx[r] · f
// Every output column depends only on its own block, rows and k, so the bits do not depend
// on the (b0, b1) split, the pairing or the thread.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "kernels/amx/tile_config.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace amx {

enum class TileFormat { kBF16, kINT8, kINT4 };

// Writes packed block `block` of w as the kBF16 layout: kp/2 k-pair rows of 16 columns x 2
// bf16, 64 bytes each, to out (64-byte aligned), and returns true; or returns false where a
// weight of the block is not a normal bf16 (or zero), i.e. tiles would not compute the format's
// value (AMX reads subnormals as 0; an overflow to Inf would make 0 * Inf = NaN). Such a block
// runs the format's fallback gemm (bf16 rows, IsaKernels' signature) for the call's rows.
using BlockDecoder = bool (*)(const PackedMatrixHeader* w, int64_t block, uint8_t* out);
using BlockFallback = void (*)(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                               int64_t b1, float* c, int64_t ldc);
// kMXFP4's (gemm_mxfp4_amx.cpp: AVX-512 BW, no tile instructions): false for a block with a
// nonzero code under an E8M0 scale outside [2, 252].
bool mxfp4_block_to_bf16(const PackedMatrixHeader* w, int64_t block, uint8_t* out);
// A decoded format's 16 column scales s of (block, group g) to s[0, 16) and, for a format with row
// sums, its offsets o to o[0, 16) (the value is s·Σ a·decoded + o·Σ a over each group).
using GroupScales = void (*)(const PackedMatrixHeader* w, int64_t block, int64_t g, float* s, float* o);

// Everything one call needs; built by the entry points below.
struct TileGemmArgs {
  TileFormat fmt;
  const PackedMatrixHeader* w;
  const uint8_t* a;        // activation row 0: bf16 (kBF16) or int8 q
  int64_t lda_bytes;       // its row stride in bytes
  int64_t m, b0, b1;
  float* c;
  int64_t ldc;
  const float* sx = nullptr;      // kINT8 / kINT4: row scales [m]
  const int32_t* gsum = nullptr;  // and group sums [m, gsum_ld]
  int64_t gsum_ld = 0;
  BlockDecoder decode = nullptr;  // kBF16 only: w's blocks decoded to bf16 (w->format is not kBF16)
  BlockFallback fallback = nullptr;  // and the blocks decode refuses
  GroupScales scales = nullptr;   // decoded: per (block, k-group of w->group) scales, applied per group
  const float* xsum = nullptr;    // and, where scales gives offsets, the rows' group sums [m, xsum_ld]
  int64_t xsum_ld = 0;
};

template <class T>
struct TileGemm {
  // A growable 64-byte aligned buffer (one per thread and use; a member, so each TileOps
// instantiation has its own copy of the code).
  struct TileBuffer {
    uint8_t* p = nullptr;
    size_t cap = 0;
    TileBuffer() = default;
    TileBuffer(const TileBuffer&) = delete;
    TileBuffer& operator=(const TileBuffer&) = delete;
    ~TileBuffer() { std::free(p); }
    uint8_t* get(size_t n) {
      if (n > cap) {
        std::free(p);
        p = nullptr;
        cap = (n + 4095) / 4096 * 4096;
        p = static_cast<uint8_t*>(std::aligned_alloc(64, cap));
        if (!p) cap = 0, throw std::bad_alloc();
      }
      return p;
    }
  };

  // Per format: bytes of A per step (tile A's colsb), B rows per step, steps per group.
  static int a_step(TileFormat f) { return f == TileFormat::kINT4 ? 32 : 64; }
  static int b_rows(TileFormat f) { return f == TileFormat::kINT4 ? 8 : 16; }

  struct Ctx {
    TileGemmArgs x;
    int64_t kp, steps, group_steps, ngroups;
    const uint8_t* as;      // the caller's rows [m][astride] (bytes), read in place below m_direct
    int64_t astride, mp;    // mp = round_up(m, 16)
    int64_t m_direct;       // rows [0, m_direct) in place (a multiple of 16)
    const uint8_t* staged;  // rows [m_direct, mp) copied, [mp - m_direct][sstride]
    int64_t sstride;
    const uint8_t* data;  // packed block 0
    int64_t bstride;      // bytes per packed block
    // B of the current block pair: step s of block j at bsrc[j] + s * kBStepBytes, except
    // steps >= full_steps (kINT8's last half step), read from btail[j].
    const uint8_t* bsrc[2];
    const uint8_t* btail[2];
    int64_t full_steps;
  };
  static constexpr int64_t kBStepBytes = 16 * 64;  // kBF16 / kINT8 (kINT4 unpacked: 8 * 64)

  static void run(const TileGemmArgs& x) {
    if (x.fmt == TileFormat::kINT8 && x.w->group != x.w->kp)
      throw std::invalid_argument("amx int8 tiles take per-channel int8 (one group per row); grouped int8 "
                                  "runs avx512's gemm_int8 (gemm_int_amx.cpp)");
    Ctx k;
    k.x = x;
    k.kp = x.w->kp;
    const TileFormat f = x.fmt;
    const int64_t kstep = f == TileFormat::kBF16 ? 32 : a_step(f);  // k values per step
    k.steps = (k.kp + kstep - 1) / kstep;
    k.full_steps = f == TileFormat::kINT8 ? k.kp / 64 : k.steps;
    k.group_steps = f == TileFormat::kINT4 || x.scales ? x.w->group / 32 : k.steps;
    k.ngroups = k.steps / k.group_steps;
    k.data = packed_data(x.w);
    k.bstride = block_data_bytes(WeightFormat(x.w->format), k.kp);
    stage_activations(k);
    static thread_local TileBuffer unpacked, tail;
    const int64_t ub_block = f == TileFormat::kINT4 ? k.kp * 16 : x.decode ? k.kp * 32 : 0;  // bytes per block
    uint8_t* ub = ub_block ? unpacked.get(size_t(2 * ub_block)) : nullptr;
    uint8_t* tb = k.full_steps < k.steps ? tail.get(2 * kBStepBytes) : nullptr;

    T::configure(gemm_tile_config(a_step(f), b_rows(f)));
    for (int64_t b = x.b0; b < x.b1; b += 2) {
      int nb = 0;         // blocks of the pair on tiles (a decoded format's refused ones go to its fallback)
      int64_t first = b;  // the first of them; with two, they are b and b + 1
      for (int64_t blk_no = b; blk_no < std::min(b + 2, x.b1); ++blk_no) {
        const uint8_t* blk = k.data + blk_no * k.bstride;
        uint8_t* u = ub ? ub + nb * ub_block : nullptr;  // kINT4: the codes as u8 k-quads; decoded: bf16
        if (x.decode && !x.decode(x.w, blk_no, u)) {
          x.fallback(x.w, reinterpret_cast<const uint16_t*>(x.a), x.lda_bytes / 2, x.m, blk_no, blk_no + 1,
                     x.c + (blk_no - x.b0) * 16, x.ldc);
          continue;
        }
        if (nb == 0) first = blk_no;
        if (u && !x.decode) unpack_int4(blk, k.kp, u);
        k.bsrc[nb] = u ? u : blk;
        if (tb) {  // kINT8, kp % 64 = 32: the last 8 k-quads, then 8 zero rows
          uint8_t* t = tb + nb * kBStepBytes;
          std::memcpy(t, blk + k.full_steps * kBStepBytes, kBStepBytes / 2);
          std::memset(t + kBStepBytes / 2, 0, kBStepBytes / 2);
          k.btail[nb] = t;
        }
        ++nb;
      }
      for (int64_t r0 = 0; r0 < k.mp && nb > 0; r0 += 32) {
        const bool two_rows = k.mp - r0 >= 32;
        if (nb == 2)
          two_rows ? macro_tile<2, 2>(k, r0, first) : macro_tile<1, 2>(k, r0, first);
        else
          two_rows ? macro_tile<2, 1>(k, r0, first) : macro_tile<1, 1>(k, r0, first);
      }
    }
    T::release();
  }

  // A tiles read the caller's rows in place when a whole number of steps fits in its row
  // stride (always for kBF16 and kINT4; kINT8 when kp % 64 = 0 or the stride has 32 bytes
  // past kp, whose contents meet the zero rows of the tail B tile). Otherwise, and for the
  // last group of m % 16 rows, rows are copied to a thread-local buffer: columns padded
  // with zeros to whole steps, rows to 16 with zero rows, stride a multiple of 64 plus 64.
  static void stage_activations(Ctx& k) {
    static thread_local TileBuffer staged;
    const TileGemmArgs& x = k.x;
    const int64_t kbytes = k.kp * (x.fmt == TileFormat::kBF16 ? 2 : 1);
    const int64_t padded = k.steps * (x.fmt == TileFormat::kBF16 ? 64 : a_step(x.fmt));
    k.mp = (x.m + 15) / 16 * 16;
    const bool in_place = padded <= x.lda_bytes;
    k.m_direct = in_place ? x.m / 16 * 16 : 0;
    k.as = x.a, k.astride = x.lda_bytes;
    k.sstride = (padded + 63) / 64 * 64 + 64;
    uint8_t* s = staged.get(size_t((k.mp - k.m_direct) * k.sstride));
    for (int64_t r = k.m_direct; r < k.mp; ++r) {
      uint8_t* row = s + (r - k.m_direct) * k.sstride;
      if (r < x.m) {
        std::memcpy(row, x.a + r * x.lda_bytes, size_t(kbytes));
        std::memset(row + kbytes, 0, size_t(k.sstride - kbytes));
      } else {
        std::memset(row, 0, size_t(k.sstride));
      }
    }
    k.staged = s;
  }

  // The 16 activation rows from `row` (a multiple of 16): in place or staged.
  static const uint8_t* a_rows(const Ctx& k, int64_t row, int64_t* stride) {
    if (row < k.m_direct) return *stride = k.astride, k.as + row * k.astride;
    return *stride = k.sstride, k.staged + (row - k.m_direct) * k.sstride;
  }

  // kINT4 octet j of a block -> k-quad rows 2j (low nibbles) and 2j+1 (high nibbles) of
  // u = kInt4U8[q] (packed_format.h). GCC vector extensions: a 16-entry byte shuffle, one
  // pshufb per 16 bytes where the target has SSSE3 (the amx objects), scalar elsewhere.
  typedef uint8_t U8x16 __attribute__((vector_size(16)));
  static void unpack_int4(const uint8_t* blk, int64_t kp, uint8_t* u) {
    U8x16 table, nib;
    std::memcpy(&table, kInt4U8, 16);
    for (int i = 0; i < 16; ++i) nib[i] = 0xF;
    for (int64_t o = 0; o < kp / 8; ++o) {
      for (int v = 0; v < 4; ++v) {
        U8x16 codes;
        std::memcpy(&codes, blk + o * 64 + 16 * v, 16);
        const U8x16 lo = __builtin_shuffle(table, U8x16(codes & nib));
        const U8x16 hi = __builtin_shuffle(table, U8x16((codes >> 4) & nib));
        std::memcpy(u + (2 * o) * 64 + 16 * v, &lo, 16);
        std::memcpy(u + (2 * o + 1) * 64 + 16 * v, &hi, 16);
      }
    }
  }

  // Row groups [r0, r0 + 16*NS) x blocks [b, b + NB), every group of steps, then the epilogue.
  template <int NS, int NB>
  static void macro_tile(const Ctx& k, int64_t r0, int64_t b) {
    const TileFormat f = k.x.fmt;
    const int64_t astep = f == TileFormat::kBF16 ? 64 : a_step(f);
    const int64_t bstep = f == TileFormat::kINT4 ? 8 * 64 : kBStepBytes;
    alignas(64) int32_t cbuf[32 * 32];      // C as stored: [16*NS rows][32] 4-byte values
    alignas(64) float facc[32 * 32];        // kINT4, a scaled decoded format: the fp32 sum over groups
    int64_t as0 = 0, as1 = 0;
    const uint8_t* a0 = a_rows(k, r0, &as0);
    const uint8_t* a1 = NS == 2 ? a_rows(k, r0 + 16, &as1) : nullptr;
    for (int64_t G = 0; G < k.ngroups; ++G) {
      zero_c<NS, NB>();
      for (int64_t s = G * k.group_steps; s < (G + 1) * k.group_steps; ++s) {
        T::template load<tile_a(0)>(a0 + s * astep, as0);
        if constexpr (NS == 2) T::template load<tile_a(1)>(a1 + s * astep, as1);
        T::template load<tile_b(0)>(b_at(k, 0, s, bstep), 64);
        if constexpr (NB == 2) T::template load<tile_b(1)>(b_at(k, 1, s, bstep), 64);
        if (f == TileFormat::kBF16)
          dots<NS, NB, true>();
        else
          dots<NS, NB, false>();
      }
      store_c<NS, NB>(cbuf);
      epilogue<NS, NB>(k, cbuf, facc, r0, b, G);
    }
  }

  static const uint8_t* b_at(const Ctx& k, int j, int64_t s, int64_t bstep) {
    return s < k.full_steps ? k.bsrc[j] + s * bstep : k.btail[j];
  }

  template <int NS, int NB>
  static void zero_c() {
    T::template zero<tile_c(0, 0)>();
    if constexpr (NB == 2) T::template zero<tile_c(0, 1)>();
    if constexpr (NS == 2) T::template zero<tile_c(1, 0)>();
    if constexpr (NS == 2 && NB == 2) T::template zero<tile_c(1, 1)>();
  }

  template <int C, int A, int B, bool kBf16>
  static void dot1() {
    if constexpr (kBf16)
      T::template dpbf16ps<C, A, B>();
    else
      T::template dpbsud<C, A, B>();
  }
  template <int NS, int NB, bool kBf16>
  static void dots() {
    dot1<tile_c(0, 0), tile_a(0), tile_b(0), kBf16>();
    if constexpr (NB == 2) dot1<tile_c(0, 1), tile_a(0), tile_b(1), kBf16>();
    if constexpr (NS == 2) dot1<tile_c(1, 0), tile_a(1), tile_b(0), kBf16>();
    if constexpr (NS == 2 && NB == 2) dot1<tile_c(1, 1), tile_a(1), tile_b(1), kBf16>();
  }

  // C[i][j] -> cbuf rows 16i.., columns 16j.. (row stride 128 bytes).
  template <int NS, int NB>
  static void store_c(int32_t* cbuf_words) {
    uint8_t* cbuf = reinterpret_cast<uint8_t*>(cbuf_words);
    T::template store<tile_c(0, 0)>(cbuf, 128);
    if constexpr (NB == 2) T::template store<tile_c(0, 1)>(cbuf + 64, 128);
    if constexpr (NS == 2) T::template store<tile_c(1, 0)>(cbuf + 16 * 128, 128);
    if constexpr (NS == 2 && NB == 2) T::template store<tile_c(1, 1)>(cbuf + 16 * 128 + 64, 128);
  }

  static float bf16_to_f32(const uint8_t* p) {
    const uint32_t u = uint32_t(p[0] | (p[1] << 8)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }

  // One row's 16*NB columns of every format, written as loops over whole columns (vectorized in
  // the amx objects: the int32 offset, the conversion, one multiply or fma per 16 columns).
  template <int NS, int NB>
  static void epilogue(const Ctx& k, const int32_t* cbuf, float* facc, int64_t r0, int64_t b, int64_t G) {
    constexpr int kCols = 16 * NB;
    const TileGemmArgs& x = k.x;
    const int64_t rows = std::min<int64_t>(16 * NS, x.m - r0);
    const bool last = G + 1 == k.ngroups;
    if (x.fmt == TileFormat::kBF16 && !x.scales) {
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(x.c + (r0 + r) * x.ldc + (b - x.b0) * 16, cbuf + r * 32, kCols * 4);
      return;
    }
    if (x.fmt == TileFormat::kBF16) {  // decoded, scaled per group: f = fma(s, C_G, f) (+ o * xsum), c = f
      alignas(64) float s[kCols], o[kCols] = {};
      for (int j = 0; j < NB; ++j) x.scales(x.w, b + j, G, s + 16 * j, o + 16 * j);
      for (int64_t r = 0; r < rows; ++r) {
        float* __restrict f = facc + r * 32;
        const float* __restrict acc = reinterpret_cast<const float*>(cbuf + r * 32);
        if (G == 0)
          for (int col = 0; col < kCols; ++col) f[col] = std::fma(s[col], acc[col], 0.f);
        else
          for (int col = 0; col < kCols; ++col) f[col] = std::fma(s[col], acc[col], f[col]);
        if (x.xsum) {
          const float xs = x.xsum[(r0 + r) * x.xsum_ld + G];
          for (int col = 0; col < kCols; ++col) f[col] = std::fma(o[col], xs, f[col]);
        }
        if (last) std::memcpy(x.c + (r0 + r) * x.ldc + (b - x.b0) * 16, f, kCols * 4);
      }
      return;
    }
    alignas(64) float s[kCols];  // kINT8: s[n]; kINT4: d[n, G]
    for (int j = 0; j < NB; ++j)
      for (int col = 0; col < 16; ++col)
        s[16 * j + col] = x.fmt == TileFormat::kINT8
                              ? reinterpret_cast<const float*>(packed_scales(x.w))[16 * (b + j) + col]
                              : bf16_to_f32(packed_scales(x.w) + ((b + j) * k.ngroups + G) * kInt4ScaleBytes + col * 2);
    for (int64_t r = 0; r < rows; ++r) {
      float* __restrict out = x.c + (r0 + r) * x.ldc + (b - x.b0) * 16;
      const int32_t* __restrict acc = cbuf + r * 32;
      const int32_t gs = x.gsum[(r0 + r) * x.gsum_ld + G];
      const float sx = x.sx[r0 + r];
      if (x.fmt == TileFormat::kINT8) {  // c = (sx[r] * s[n]) * float(C - 128 * gsum[r])
        const int32_t off = 128 * gs;
        for (int col = 0; col < kCols; ++col) out[col] = (sx * s[col]) * static_cast<float>(acc[col] - off);
        continue;
      }
      // kINT4: f = fma(d[n, G], float(C_G - 64 * gsum[r, G]), f), c = sx[r] * f after the last group
      float* __restrict f = facc + r * 32;
      const int32_t off = kInt4Offset * gs;
      if (G == 0)
        for (int col = 0; col < kCols; ++col) f[col] = std::fma(s[col], static_cast<float>(acc[col] - off), 0.f);
      else
        for (int col = 0; col < kCols; ++col) f[col] = std::fma(s[col], static_cast<float>(acc[col] - off), f[col]);
      if (last)
        for (int col = 0; col < kCols; ++col) out[col] = sx * f[col];
    }
  }
};

// Shape comments: w [np, kp] packed; a [m, lda] (bf16 or int8); c [m, ldc] fp32, columns
// 0 .. 16*(b1-b0) written. gemm_bf16_tiles: w is kBF16, or any format with its decode.
template <class T>
void gemm_bf16_tiles(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                     int64_t b1, float* c, int64_t ldc, BlockDecoder decode = nullptr,
                     BlockFallback fallback = nullptr) {
  TileGemmArgs x{TileFormat::kBF16, w, reinterpret_cast<const uint8_t*>(a), lda * 2, m, b0, b1, c, ldc};
  x.decode = decode, x.fallback = fallback;
  TileGemm<T>::run(x);
}

// A decoded format with a scale per k-group: decode writes each block as kBF16 k-pair rows (it
// never refuses one), scales gives (block, group)'s s and o, xsum the rows' group sums [m, xsum_ld]
// (nullptr: no offsets).
template <class T>
void gemm_scaled_tiles(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                       int64_t b1, float* c, int64_t ldc, BlockDecoder decode, GroupScales scales,
                       const float* xsum = nullptr, int64_t xsum_ld = 0) {
  TileGemmArgs x{TileFormat::kBF16, w, reinterpret_cast<const uint8_t*>(a), lda * 2, m, b0, b1, c, ldc};
  x.decode = decode, x.scales = scales, x.xsum = xsum, x.xsum_ld = xsum_ld;
  TileGemm<T>::run(x);
}

template <class T>
void gemm_int_tiles(TileFormat f, const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
                    int64_t b1, float* c, int64_t ldc) {
  TileGemmArgs x{f, w, reinterpret_cast<const uint8_t*>(a.q), a.ldq, m, b0, b1, c, ldc, a.scale, a.gsum, a.gsum_ld};
  TileGemm<T>::run(x);
}

}  // namespace amx
}  // namespace ktmoe
