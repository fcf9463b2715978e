// [NOTE] moe_forward: routing, scratch and threading around an IsaKernels table.
//
//   out[t] = Σ_j w[t,j] · (down_e(act(gate_e x_t + bg_e, up_e x_t + bu_e)) + bd_e),  e = ids[t,j] >= 0
//   act = silu(gate) ⊙ up, or gpt-oss's clamped SwiGLU (p.act); biases optional.
//
// Sizes and formats come from the packed headers (expert 0's; all experts of a
// layer share them): w13 is kGateUp with n = 2I, k = H; w2 is kDown with n = H,
// k = I. Each matrix's activations are prepared in that matrix's format
// (bf16 rows, or int8 rows + scales and sums per header.group), so w13 and w2 may
// even use different formats. GGML experts where they lie (p.ggml: a GGUF's gate, up
// and down rows, each of its own type) run the same phases with bf16 rows and the
// gemm_ggml entry (Weights below).
//
// moe_forward() runs these phases in order, each a function with its own [NOTE]
// below (shapes, scratch layout, work items):
//   route()                 ids -> rows grouped by expert (serial)
//   carve_scratch()         the call's buffers, in one block
//   prepare_activations()   1. x -> w13's activation rows, per token, then per row
//   gate_up_items()         2. rows x w13 -> act(gate, up) = h, fp32
//   prepare_hidden_rows()      h -> w2's activation rows
//   down_items()            3. rows x w2 -> y, one fp32 slot per pair
//   combine()               4. out[t] = Σ_j w[t,j] · y[row(t,j)], in out's dtype
// Each parallel phase is one parallel_for over independent items that write
// disjoint outputs, so the result has the same bits for any thread count and
// partition.
//
// Item sizes. Items are cut at whole register groups (kGroupBlocks = 4 blocks,
// 2 gate/up pairs): the micro-kernels stream 4 blocks side by side, and an item of
// fewer blocks runs their narrower, slower tiles. An expert with few rows (decode:
// at most decode_rows(), 12 for kBF16 whose gemm has an L1-blocked path above 12
// rows, kTokenTile for int formats) reads each weight once whatever the item size,
// so its blocks are cut into small items (about decode_budget() of weights, at
// least one group) that spread one expert over all threads. (128 KiB items made
// bf16 decode items a single pair, 2 blocks: 66 % of the read roof against 84-88 %
// with whole groups.) The budget is 256 KiB, or less (down to 128 KiB) when the
// phase's weights give each thread fewer than 16 such items, so that many threads
// finish together: on 16 threads 128 KiB items ran int4 and bf16 decode 8-12 %
// faster than 256 KiB, 1 MiB items 15-35 % slower (benchmarks/measured/
// device_item_size_thp_*). An expert with more rows (prefill) gets items of about
// kPanelBytes of weights (half the 1 MiB L2): the item walks all the expert's rows
// in tiles of kTokenTile, and the panel is read from memory once and from L2 for
// every further tile.
// Item sizes depend on the problem and the thread count, never on which thread
// runs what; the gemms give the same bits for any block split (isa_kernels.h).
// bf16 activation rows have a stride of kp + 32 elements so that rows are never
// a multiple of 4 KiB apart (L1 set aliasing; the gemm then reads them in place).
//
// Scratch: one 64-byte-aligned block per call, carved into buffers (carve_scratch); it
// is owned by the calling thread and kept (grow-only) for the next call, so a
// steady stream of forwards does not page-fault fresh memory every time. A block
// above retain_bytes() (512 MiB, or KTMOE_SCRATCH_RETAIN_MB) is freed after the
// call: anonymous memory is what this library keeps small. (T=2048 tokens, k=8,
// H=2048 bf16 needs ~290 MB; refaulting that every call costs ~25 % of prefill.)
#include "kernels/moe_driver.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/generic/bf16_scalar.h"

namespace ktmoe {
namespace {

constexpr int64_t kTokenTile = 32;           // rows per gemm call
constexpr int64_t kPanelBytes = 512 << 10;   // prefill: weight bytes per item
// decode: weight bytes per item (see [NOTE]): at most 256 KiB, at least 128 KiB, and
// about a 16th of a thread's share of the phase's decode weights in between.
// KTMOE_DECODE_ITEM_KB fixes it for tuning runs.
int64_t decode_budget(int64_t phase_bytes, int64_t threads) {
  static const int64_t fixed = [] {
    const char* env = std::getenv("KTMOE_DECODE_ITEM_KB");
    const long long kb = env ? std::strtoll(env, nullptr, 10) : 0;
    return kb > 0 ? int64_t(kb) << 10 : int64_t(0);
  }();
  if (fixed > 0) return fixed;
  const int64_t share = phase_bytes / (16 * std::max<int64_t>(threads, 1));
  return std::min<int64_t>(256 << 10, std::max<int64_t>(128 << 10, share));
}
constexpr int64_t kGroupBlocks = 4;  // blocks of one register group: every gemm micro-kernel's widest tile
constexpr int64_t kMaxPairsPerCall = 8;      // gate/up stack tile: 32 x 8*32 fp32 = 32 KiB
constexpr int64_t kCombineCols = 512;        // combine: fp32 accumulator columns on the stack
constexpr size_t kAlign = 64;
// Largest scratch kept between calls.
size_t retain_bytes() {
  static const size_t bytes = [] {
    const char* env = std::getenv("KTMOE_SCRATCH_RETAIN_MB");
    return (env ? size_t(std::strtoull(env, nullptr, 10)) : size_t(512)) << 20;
  }();
  return bytes;
}

// Grow-only, 64-byte-aligned scratch owned by one (calling) thread.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(ptr_); }
  uint8_t* get(size_t bytes) {
    if (bytes > cap_) {
      std::free(ptr_);
      ptr_ = nullptr;
      cap_ = 0;
      const size_t cap = (bytes + kAlign - 1) / kAlign * kAlign;
      ptr_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, cap));
      if (!ptr_) throw std::bad_alloc();
      cap_ = cap;
    }
    return ptr_;
  }
  void release() {
    std::free(ptr_);
    ptr_ = nullptr;
    cap_ = 0;
  }

 private:
  uint8_t* ptr_ = nullptr;
  size_t cap_ = 0;
};

// Offsets of 64-byte-aligned buffers inside one scratch block.
struct Layout {
  size_t size = 0;
  size_t take(size_t bytes) {
    const size_t off = size;
    size += (bytes + kAlign - 1) / kAlign * kAlign;
    return off;
  }
};

// [NOTE] What the phases need of one role's experts (w13: gate/up, w2: down), packed or GGML where they lie:
//   activations  the rows its gemm multiplies: bf16 rows, or int8 rows + scales (per row or per weight
//                group) + group sums (packed int formats); kp columns, zero padded past k
//   units        what items cut: w13 block pairs (16 gate + 16 up outputs), w2 blocks (16 outputs); a
//                GGML matrix's 16 rows are its block of 16 outputs (I, H multiples of 16)
//   gemm         c[r][·] = rows [r0, r0+m) of a times units [u0, u1) of expert e, per w13 pair 16 gate
//                columns then 16 up (the packed kGateUp interleave; GGML: one gemm_ggml call per matrix over
//                all the units, gate and up then interleaved)
struct Weights {
  // packed
  const PackedMatrixHeader* h = nullptr;  // expert 0's header (all experts of a layer share it)
  const uint8_t* base = nullptr;
  int64_t stride = 0;
  const WeightFormatTraits* traits = nullptr;
  // GGML: w13 gate and up, w2 down (second nullptr)
  const GgmlMatrices* ggml[2] = {nullptr, nullptr};
  // activations
  bool bf16_rows = true;
  int64_t kp = 0, group = 0, scale_group = 0;
  int64_t units = 0, unit_bytes = 0;
  int64_t blocks_per_unit = 1;  // packed: 2 for w13's pairs

  static Weights packed(const uint8_t* base, int64_t stride, bool pairs) {
    Weights w;
    w.h = reinterpret_cast<const PackedMatrixHeader*>(base);
    w.base = base;
    w.stride = stride;
    w.traits = &format_traits(WeightFormat(w.h->format));
    w.bf16_rows = w.traits->activations == ActivationRows::kBF16;
    w.kp = w.h->kp;
    w.group = w.h->group;
    w.scale_group = w.bf16_rows ? 0 : w.traits->activation_scale_group(w.kp, w.group);
    const int64_t block_bytes = block_data_bytes(WeightFormat(w.h->format), w.h->kp);
    w.blocks_per_unit = pairs ? 2 : 1;
    w.units = w.h->np / (kBlockN * w.blocks_per_unit);
    w.unit_bytes = w.blocks_per_unit * block_bytes;
    return w;
  }
  static Weights gguf(const GgmlMatrices* first, const GgmlMatrices* second, int64_t n, int64_t k) {
    Weights w;
    w.ggml[0] = first;
    w.ggml[1] = second;
    w.kp = k;
    w.units = n / kBlockN;
    w.unit_bytes = kBlockN * (first->row_bytes + (second ? second->row_bytes : 0));
    return w;
  }
  // Experts with more rows than this get prefill items: bf16-row gemms run an L1-blocked path above one
  // row tile (12 rows), the int tiles prefer small items up to kTokenTile rows (measured).
  int64_t decode_rows() const { return bf16_rows ? 12 : kTokenTile; }
};

// Rows of activations in the format one role's gemm multiplies (Weights: bf16 rows [rows, kp], or int8
// rows [rows, kp] + scales [rows, nscales] (per row or per weight group) + group sums [rows, ngroups]).
struct ActRows {
  bool bf16_rows = true;
  int64_t kp = 0, group = 0, ngroups = 0;
  int64_t scale_group = 0, nscales = 0;  // int8 rows: columns per scale, scales per row
  int64_t ld = 0;  // bf16 row stride (elements): kp + 32, so rows are not 4 KiB apart (L1 sets)
  uint16_t* bf16 = nullptr;
  int8_t* q = nullptr;
  float* scale = nullptr;
  int32_t* gsum = nullptr;
  size_t off_bf16 = 0, off_q = 0, off_scale = 0, off_gsum = 0;

  ActRows() = default;
  ActRows(const Weights& w, int64_t rows, Layout& layout)
      : bf16_rows(w.bf16_rows), kp(w.kp), group(w.group), ld(w.kp + 32) {
    if (bf16_rows) {
      off_bf16 = layout.take(size_t(rows) * ld * 2);
    } else {
      ngroups = kp / group;
      scale_group = w.scale_group;
      nscales = kp / scale_group;
      off_q = layout.take(size_t(rows) * kp);
      off_scale = layout.take(size_t(rows) * nscales * 4);
      off_gsum = layout.take(size_t(rows) * ngroups * 4);
    }
  }
  void bind(uint8_t* base) {
    if (bf16_rows) {
      bf16 = reinterpret_cast<uint16_t*>(base + off_bf16);
    } else {
      q = reinterpret_cast<int8_t*>(base + off_q);
      scale = reinterpret_cast<float*>(base + off_scale);
      gsum = reinterpret_cast<int32_t*>(base + off_gsum);
    }
  }
  QuantizedRows quantized(int64_t r) const {
    return {q + r * kp, kp, scale + r * nscales, gsum + r * ngroups, ngroups};
  }
  // Row dst of this = row src of other (same activations and sizes).
  void copy_row_from(const ActRows& other, int64_t src, int64_t dst) const {
    if (bf16_rows) {
      std::memcpy(bf16 + dst * ld, other.bf16 + src * other.ld, size_t(kp) * 2);
    } else {
      std::memcpy(q + dst * kp, other.q + src * kp, size_t(kp));
      std::memcpy(scale + dst * nscales, other.scale + src * nscales, size_t(nscales) * 4);
      std::memcpy(gsum + dst * ngroups, other.gsum + src * ngroups, size_t(ngroups) * 4);
    }
  }
};

// c = rows [r0, r0+m) of a times units [u0, u1) of expert e of w (Weights' [NOTE]): a packed matrix by the
// gemm entry of its format's row, GGML rows by gemm_ggml.
void gemm(const IsaKernels& isa, const Weights& w, int64_t e, const ActRows& a, int64_t r0, int64_t m, int64_t u0,
          int64_t u1, float* c, int64_t ldc) {
  if (w.h != nullptr) {
    const auto* h = reinterpret_cast<const PackedMatrixHeader*>(w.base + e * w.stride);
    const int64_t b0 = w.blocks_per_unit * u0, b1 = w.blocks_per_unit * u1;
    if (a.bf16_rows) (isa.*w.traits->gemm_bf16)(h, a.bf16 + r0 * a.ld, a.ld, m, b0, b1, c, ldc);
    else (isa.*w.traits->gemm_int8)(h, a.quantized(r0), m, b0, b1, c, ldc);
    return;
  }
  // One gemm_ggml call per matrix over all the units' rows (a call prepares its activation rows once).
  const uint16_t* rows = a.bf16 + r0 * a.ld;
  const int64_t n = kBlockN * (u1 - u0);
  const auto rows_of = [&](const GgmlMatrices& g) { return g.data + e * g.expert_stride + kBlockN * u0 * g.row_bytes; };
  const GgmlMatrices& first = *w.ggml[0];
  if (w.ggml[1] == nullptr) {  // w2: the units' rows are c's columns
    isa.gemm_ggml(*first.type, rows_of(first), first.row_bytes, n, w.kp, rows, a.ld, m, c, ldc);
    return;
  }
  // w13: gate's and up's rows side by side in a thread-local tile, then per unit 16 gate and 16 up columns of c
  thread_local std::vector<float> tile;
  tile.resize(size_t(2 * m * n));
  const GgmlMatrices& up = *w.ggml[1];
  isa.gemm_ggml(*first.type, rows_of(first), first.row_bytes, n, w.kp, rows, a.ld, m, tile.data(), n);
  isa.gemm_ggml(*up.type, rows_of(up), up.row_bytes, n, w.kp, rows, a.ld, m, tile.data() + m * n, n);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t u = 0; u < u1 - u0; ++u) {
      std::memcpy(c + r * ldc + 2 * kBlockN * u, tile.data() + r * n + kBlockN * u, kBlockN * 4);
      std::memcpy(c + r * ldc + 2 * kBlockN * u + kBlockN, tile.data() + (m + r) * n + kBlockN * u, kBlockN * 4);
    }
}

// One work item: expert e, units [u0, u1) (gate/up: block pairs; down: blocks).
struct Item {
  int64_t e, u0, u1;
};

// Cuts each active expert's `units` units (of unit_bytes weight bytes each) into
// near-equal items, sized by the expert's row count (see [NOTE]).
// Prefill items have boundaries at multiples of `align` units (whole 4-block
// register groups of the gemm tiles).
std::vector<Item> make_items(const std::vector<int64_t>& active, const std::vector<int64_t>& row_begin,
                             int64_t units, int64_t unit_bytes, int64_t align,
                             int64_t decode_rows, int64_t threads) {
  int64_t decode_experts = 0;
  for (int64_t e : active) decode_experts += row_begin[e + 1] - row_begin[e] <= decode_rows;
  const int64_t decode_items_budget = decode_budget(decode_experts * units * unit_bytes, threads);
  std::vector<Item> items;
  for (int64_t e : active) {
    const int64_t rows = row_begin[e + 1] - row_begin[e];
    const bool prefill = rows > decode_rows;
    const int64_t budget = prefill ? kPanelBytes : decode_items_budget;
    const int64_t per_item = std::max<int64_t>(align, std::min(units, budget / unit_bytes));
    const int64_t n_items = (units + per_item - 1) / per_item;
    int64_t prev = 0;
    for (int64_t i = 0; i < n_items; ++i) {
      int64_t end = (i + 1) * units / n_items;
      if (end < units) end = (end + align / 2) / align * align;
      if (end <= prev) continue;
      items.push_back({e, prev, end});
      prev = end;
    }
  }
  return items;
}

// Runs item(i) for i < n, one item per chunk of parallel_for: the work pool hands
// them out from a shared counter (dynamic), so a thread that starts late or is
// descheduled (noisy VMs, co-tenants) takes fewer items instead of holding up the
// others. Items write disjoint outputs and do not depend on who runs them, so the
// bits are the same.
template <class F>
void for_each_item(const ParallelFor& parallel_for, int64_t n, const F& item) {
  parallel_for(n, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) item(i);
  });
}

// y[c] += bias[c] for c < n (n <= 16 * blocks: the last block may be partly padding).
inline void add_bias(float* y, const float* bias, int64_t n) {
  for (int64_t c = 0; c < n; ++c) y[c] += bias[c];
}

// h[0..16) = act(gate tile, up tile): 16 gate columns g, then 16 up columns g + 16.
inline void gated_activation(const IsaKernels& isa, const Activation& act, const float* g, float* h) {
  isa.gated_act(act, g, g + 16, h, 16);
}

// ---------------------------------------------------------------- routing
// [NOTE] Routing, serial, O(T·k): the valid pairs (t, j) (ids[t, j] >= 0) grouped by
// expert, in (t, j) order inside an expert. Pair (t, j) gets row r; the rows of
// expert e are [row_begin[e], row_begin[e+1]), P = row_begin[E] rows in all.
//   row_begin    [E + 1]  prefix sums of the experts' row counts
//   active       [<= E]   experts with at least one row, ascending
//   row_of_pair  [T·k]    row of pair t·k + j, -1 for a skipped id
//   token_of_row [P]      token t of row r
struct Routing {
  std::vector<int64_t> row_begin, active, row_of_pair, token_of_row;
  int64_t rows() const { return row_begin.back(); }  // P
};

Routing route(const MoeProblem& p) {
  const int64_t T = p.tokens, K = p.top_k, E = p.num_experts;
  Routing rt;
  rt.row_begin.assign(size_t(E) + 1, 0);
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = p.ids[i];
    if (e < 0) continue;
    if (e >= E)
      throw std::out_of_range("moe_forward: expert id " + std::to_string(e) + " >= num_experts " +
                              std::to_string(E));
    ++rt.row_begin[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) {
    if (rt.row_begin[e + 1] > 0) rt.active.push_back(e);
    rt.row_begin[e + 1] += rt.row_begin[e];
  }
  rt.row_of_pair.assign(static_cast<size_t>(T * K), -1);
  rt.token_of_row.resize(static_cast<size_t>(rt.rows()));
  std::vector<int64_t> cursor(rt.row_begin.begin(), rt.row_begin.end() - 1);
  for (int64_t i = 0; i < T * K; ++i) {
    const int64_t e = p.ids[i];
    if (e < 0) continue;
    rt.row_of_pair[i] = cursor[e];
    rt.token_of_row[cursor[e]++] = i / K;
  }
  return rt;
}

// ---------------------------------------------------------------- shapes and scratch
// [NOTE] Shapes come from expert 0's packed headers (all experts of a layer share
// them): w13 is kGateUp, n = 2I, k = H, np = 2·ip (ip = round_up(I, 16)), so
// `pairs` = ip / 16 interleaved (gate block, up block) pairs; w2 is kDown, n = H,
// k = I, np2 = round_up(H, 16). GGML experts: I / 16 pairs of 16 gate and 16 up rows,
// H / 16 blocks of down rows (both multiples of 16), bf16 rows of exactly k columns.
//
// Scratch: one 64-byte-aligned block per call (Layout below), each buffer
// 64-byte aligned, in this order:
//   stage  [T, H]      fp32  x widened first (only if stage_x: fp16 x, or bf16 x
//                            with an int w13; the row builders read fp32 or bf16)
//   h      [P, ip]     fp32  act(gate, up) per row (padding columns stay 0 by act(0, 0) = 0)
//   y      [P, np2]    fp32  down's output per row (pair)
//   x_rows [T]  w13's activation rows (ActRows) per token
//   g_rows [P]  the same, gathered per row (expert-contiguous: gemm's M rows)
//   h_rows [P]  h in w2's activation format
// ActRows in kBF16: bf16 [rows, kp + 32]; in kINT8 / kINT4: int8 [rows, kp] +
// scales fp32 [rows, kp / scale_group] (kINT8: one per weight group; kINT4: one per row) +
// group sums int32 [rows, kp / group].
struct Shapes {
  Weights w13, w2;
  int64_t inter;   // I
  int64_t pairs;   // ip / 16 block pairs of w13
  int64_t ldh;     // ip: row stride of h
  int64_t ldy;     // np2 = round_up(H, 16): row stride of y
  bool stage_x;    // x rows are widened to fp32 before the row builder
};

Shapes shapes_of(const MoeProblem& p) {
  Shapes sh;
  if (p.ggml) {
    sh.w13 = Weights::gguf(&p.ggml->gate, &p.ggml->up, p.ggml->inter, p.hidden);
    sh.w2 = Weights::gguf(&p.ggml->down, nullptr, p.hidden, p.ggml->inter);
    sh.inter = p.ggml->inter;
  } else {
    sh.w13 = Weights::packed(p.w13, p.w13_stride, true);
    sh.w2 = Weights::packed(p.w2, p.w2_stride, false);
    sh.inter = sh.w13.h->n / 2;
  }
  sh.pairs = sh.w13.units;
  sh.ldh = 16 * sh.pairs;
  sh.ldy = kBlockN * sh.w2.units;
  sh.stage_x = p.x_dtype == ActDtype::kF16 || (p.x_dtype == ActDtype::kBF16 && !sh.w13.bf16_rows);
  return sh;
}

struct Buffers {
  float* stage;
  float* h;
  float* y;
  ActRows x_rows, g_rows, h_rows;
  size_t bytes;  // of the whole block
};

// Carves the buffers of the [NOTE] above out of `scratch` (grown if needed).
Buffers carve_scratch(const MoeProblem& p, const Shapes& sh, int64_t P, Scratch& scratch) {
  const int64_t T = p.tokens, H = p.hidden;
  Layout layout;
  const size_t off_stage = layout.take(sh.stage_x ? size_t(T) * H * 4 : 0);
  const size_t off_h = layout.take(size_t(P) * sh.ldh * 4);
  const size_t off_y = layout.take(size_t(P) * sh.ldy * 4);
  Buffers b{nullptr, nullptr, nullptr, ActRows(sh.w13, T, layout), ActRows(sh.w13, P, layout),
            ActRows(sh.w2, P, layout), 0};
  b.bytes = layout.size;
  uint8_t* base = scratch.get(layout.size);
  b.stage = reinterpret_cast<float*>(base + off_stage);
  b.h = reinterpret_cast<float*>(base + off_h);
  b.y = reinterpret_cast<float*>(base + off_y);
  b.x_rows.bind(base);
  b.g_rows.bind(base);
  b.h_rows.bind(base);
  return b;
}

// ---------------------------------------------------------------- 1. activation prep
// [NOTE] x [T, H] (fp32, bf16 or fp16) -> x_rows [T] in w13's format, once per
// token, zero padded to kp; then x_rows -> g_rows [P] (row r = token_of_row[r]).
// What the format's row builder does not take directly (fp16 always, bf16 for
// the int formats) is widened into stage [T, H] fp32 first, in the same loop.
// Items: token ranges (grain 16), then row ranges (grain 64); disjoint outputs.
void prepare_activations(const MoeProblem& p, const IsaKernels& isa, const ParallelFor& parallel_for,
                         const Routing& rt, bool stage_x, const Buffers& b) {
  const int64_t T = p.tokens, H = p.hidden;
  const ActDtype xd = p.x_dtype;
  const uint16_t* x16 = static_cast<const uint16_t*>(p.x);
  const float* x32 = static_cast<const float*>(p.x);
  float* stage = b.stage;
  const ActRows& xa = b.x_rows;
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    const float* src = x32;
    if (stage_x) {
      if (xd == ActDtype::kF16) isa.f16_to_f32(x16 + t0 * H, stage + t0 * H, (t1 - t0) * H);
      else for (int64_t i = t0 * H; i < t1 * H; ++i) stage[i] = bf16_to_f32(x16[i]);
      src = stage;
    }
    if (xa.bf16_rows) {
      for (int64_t t = t0; t < t1; ++t) {
        uint16_t* dst = xa.bf16 + t * xa.ld;
        if (xd == ActDtype::kBF16) std::memcpy(dst, x16 + t * H, size_t(H) * 2);
        else isa.to_bf16(src + t * H, dst, H);
        std::fill(dst + H, dst + xa.kp, uint16_t{0});
      }
    } else {
      isa.quantize_rows(src + t0 * H, H, t1 - t0, H, xa.kp, xa.group, xa.scale_group, xa.q + t0 * xa.kp, xa.kp,
                        xa.scale + t0 * xa.nscales, xa.gsum + t0 * xa.ngroups, xa.ngroups);
    }
  });
  const ActRows& ga = b.g_rows;
  const int64_t* token_of_row = rt.token_of_row.data();
  parallel_for(rt.rows(), 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) ga.copy_row_from(xa, token_of_row[r], r);
  });
}

// ---------------------------------------------------------------- 2. gate/up items
// [NOTE] h [P, ip] fp32 = act(g_rows · gate_eᵀ + bg_e, g_rows · up_eᵀ + bu_e), per expert e.
// Item = (expert e, block pairs [u0, u1) of w13), cut by make_items. For every
// tile of up to kTokenTile of e's rows and up to kMaxPairsPerCall pairs, one gemm
// on blocks [2j0, 2j1) (gate/up interleaved) fills a stack tile
// [m, 32·nj] fp32 (per pair: 16 gate columns, then 16 up); per pair the biases
// are added (valid columns < I only) and the activation writes
// h[r][16j, 16j + 16). Items write disjoint (row, column) ranges of h.
void gate_up_items(const MoeProblem& p, const IsaKernels& isa, const ParallelFor& parallel_for,
                   const Routing& rt, const Shapes& sh, const Buffers& b) {
  const Weights& w13 = sh.w13;
  const int64_t inter = sh.inter, ldh = sh.ldh;
  const int64_t* row_begin = rt.row_begin.data();
  const ActRows& ga = b.g_rows;
  float* hbuf = b.h;
  const std::vector<Item> items = make_items(rt.active, rt.row_begin, w13.units, w13.unit_bytes, kGroupBlocks / 2,
                                             w13.decode_rows(), p.threads);
  for_each_item(parallel_for, int64_t(items.size()), [&](int64_t it) {
    alignas(64) float tile[kTokenTile * kMaxPairsPerCall * 32];
    const Item& item = items[it];
    const float* bias13 = p.w13_bias ? p.w13_bias + item.e * 2 * inter : nullptr;  // [2I]
    for (int64_t r0 = row_begin[item.e]; r0 < row_begin[item.e + 1]; r0 += kTokenTile) {
      const int64_t m = std::min(kTokenTile, row_begin[item.e + 1] - r0);
      for (int64_t j0 = item.u0; j0 < item.u1; j0 += kMaxPairsPerCall) {
        const int64_t nj = std::min(kMaxPairsPerCall, item.u1 - j0), ldc = 32 * nj;
        gemm(isa, w13, item.e, ga, r0, m, j0, j0 + nj, tile, ldc);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t jj = 0; jj < nj; ++jj) {
            float* g = tile + r * ldc + 32 * jj;  // 16 gate columns, then 16 up
            const int64_t col = 16 * (j0 + jj);   // intermediate column of g[0]
            if (bias13) {  // padding columns (>= I) stay 0: act(0, 0) = 0
              const int64_t valid = std::min<int64_t>(16, inter - col);
              add_bias(g, bias13 + col, valid);
              add_bias(g + 16, bias13 + inter + col, valid);
            }
            gated_activation(isa, p.act, g, hbuf + (r0 + r) * ldh + col);
          }
      }
    }
  });
}

// [NOTE] h [P, ip] fp32 -> h_rows [P] in w2's format (bf16 rows, or int8 rows +
// scales + group sums over the I valid columns, zero padded to kp). After all
// gate/up items: an int8 row (or group) needs its max over columns from several items.
// Items: row ranges (grain 16).
void prepare_hidden_rows(const IsaKernels& isa, const ParallelFor& parallel_for, int64_t P, const Shapes& sh,
                         const Buffers& b) {
  const int64_t inter = sh.inter, ldh = sh.ldh;
  const float* hbuf = b.h;
  const ActRows& ha = b.h_rows;
  parallel_for(P, 16, [&](int64_t r0, int64_t r1) {
    if (ha.bf16_rows) {
      for (int64_t r = r0; r < r1; ++r) {
        uint16_t* dst = ha.bf16 + r * ha.ld;
        isa.to_bf16(hbuf + r * ldh, dst, inter);
        std::fill(dst + inter, dst + ha.kp, uint16_t{0});
      }
    } else {
      isa.quantize_rows(hbuf + r0 * ldh, ldh, r1 - r0, inter, ha.kp, ha.group, ha.scale_group, ha.q + r0 * ha.kp,
                        ha.kp, ha.scale + r0 * ha.nscales, ha.gsum + r0 * ha.ngroups, ha.ngroups);
    }
  });
}

// ---------------------------------------------------------------- 3. down items
// [NOTE] y [P, np2] fp32 = h_rows · down_eᵀ (+ bd_e), one row (slot) per pair.
// Item = (expert e, blocks [u0, u1) of w2), cut by make_items at whole register
// groups; for every tile of up to kTokenTile of e's rows, gemm writes
// y[r][16·u0, 16·u1) in place, then the bias is added to the columns < H.
// Items write disjoint (row, column) ranges of y.
void down_items(const MoeProblem& p, const IsaKernels& isa, const ParallelFor& parallel_for, const Routing& rt,
                const Shapes& sh, const Buffers& b) {
  const Weights& w2 = sh.w2;
  const int64_t H = p.hidden, ldy = sh.ldy;
  const int64_t* row_begin = rt.row_begin.data();
  const ActRows& ha = b.h_rows;
  float* ybuf = b.y;
  const std::vector<Item> items = make_items(rt.active, rt.row_begin, w2.units, w2.unit_bytes, kGroupBlocks,
                                             w2.decode_rows(), p.threads);
  for_each_item(parallel_for, int64_t(items.size()), [&](int64_t it) {
    const Item& item = items[it];
    for (int64_t r0 = row_begin[item.e]; r0 < row_begin[item.e + 1]; r0 += kTokenTile) {
      const int64_t m = std::min(kTokenTile, row_begin[item.e + 1] - r0);
      float* y = ybuf + r0 * ldy + kBlockN * item.u0;
      gemm(isa, w2, item.e, ha, r0, m, item.u0, item.u1, y, ldy);
      if (p.w2_bias) {
        const int64_t cols = std::min(H, kBlockN * item.u1) - kBlockN * item.u0;
        for (int64_t r = 0; r < m; ++r) add_bias(y + r * ldy, p.w2_bias + item.e * H + kBlockN * item.u0, cols);
      }
    }
  });
}

// ---------------------------------------------------------------- 4. combine
// [NOTE] out [T, H] = Σ_j weights[t, j] · y[row_of_pair[t, j]], j in order (the
// same sum for any thread count), skipped pairs left out; accumulated in fp32 on
// the stack, kCombineCols columns at a time, then written in x's dtype (bf16 /
// fp16 rounded to nearest even). Items: token ranges (grain 8).
void combine(const MoeProblem& p, const IsaKernels& isa, const ParallelFor& parallel_for, const Routing& rt,
             const Shapes& sh, const Buffers& b) {
  const int64_t T = p.tokens, H = p.hidden, K = p.top_k, ldy = sh.ldy;
  const ActDtype xd = p.x_dtype;
  const int64_t* row_of_pair = rt.row_of_pair.data();
  const float* ybuf = b.y;
  parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    alignas(64) float acc[kCombineCols];
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c0 = 0; c0 < H; c0 += kCombineCols) {
        const int64_t cols = std::min(kCombineCols, H - c0);
        std::fill(acc, acc + cols, 0.f);
        for (int64_t j = 0; j < K; ++j) {
          const int64_t r = row_of_pair[t * K + j];
          if (r < 0) continue;
          const float wt = p.weights[t * K + j];
          const float* y = ybuf + r * ldy + c0;
          for (int64_t c = 0; c < cols; ++c) acc[c] += wt * y[c];
        }
        uint16_t* out16 = static_cast<uint16_t*>(p.out) + t * H + c0;
        if (xd == ActDtype::kBF16) isa.to_bf16(acc, out16, cols);
        else if (xd == ActDtype::kF16) isa.f32_to_f16(acc, out16, cols);
        else std::memcpy(static_cast<float*>(p.out) + t * H + c0, acc, size_t(cols) * 4);
      }
    }
  });
}

}  // namespace

void moe_forward(const MoeProblem& p, const IsaKernels& isa, const ParallelFor& parallel_for) {
  if (p.tokens <= 0) return;
  const Routing rt = route(p);
  if (rt.rows() == 0) {  // every id masked: out = 0 (w13 / w2 are not even looked at)
    std::memset(p.out, 0, size_t(p.tokens) * p.hidden * (p.x_dtype == ActDtype::kF32 ? 4 : 2));
    return;
  }
  const Shapes sh = shapes_of(p);
  static thread_local Scratch scratch;
  const Buffers b = carve_scratch(p, sh, rt.rows(), scratch);
  prepare_activations(p, isa, parallel_for, rt, sh.stage_x, b);
  gate_up_items(p, isa, parallel_for, rt, sh, b);
  prepare_hidden_rows(isa, parallel_for, rt.rows(), sh, b);
  down_items(p, isa, parallel_for, rt, sh, b);
  combine(p, isa, parallel_for, rt, sh, b);
  if (b.bytes > retain_bytes()) scratch.release();
}

}  // namespace ktmoe
