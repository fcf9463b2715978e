// [NOTE] advise_experts and read_ahead_experts (see expert_reads.h): routed rows -> MADV_WILLNEED, or
// reader pool requests.
#include "ops/expert_reads.h"

#include <utility>
#include <vector>

#include "arena/page_cache.h"
#include "arena/read_ahead.h"
#include "arena/reader_pool.h"
#include "arena/weight_arena.h"

namespace ktmoe {
namespace {

// The rows of `w` of the experts in `experts` not already in the page cache, queued to the pool when w lies
// in one file-backed slice; nothing where it does not (anonymous or foreign memory: no file to read, and
// nothing for WILLNEED to gain). A resident expert is skipped: the pool would copy its pages out of the cache
// for nothing (a next-layer prediction names the popular experts every token).
void queue_rows(const at::Tensor& w, const std::vector<int64_t>& experts) {
  const auto* base = w.data_ptr<uint8_t>();
  const int64_t row = w.size(1), bytes = w.size(0) * row;
  if (bytes == 0) return;
  const std::shared_ptr<WeightArena> arena = WeightArena::holding(base, bytes);
  if (!arena) return;
  int64_t offset = 0;
  const std::shared_ptr<const ReadFile> file = arena->file_range(base, bytes, &offset);
  if (!file) return;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  ranges.reserve(experts.size());
  for (int64_t e : experts)
    if (!range_in_page_cache(base + e * row, row)) ranges.push_back({offset + e * row, row});
  if (ranges.empty()) return;
  ReaderPool::instance().read(file, ranges);
}

std::vector<int64_t> distinct_experts(int64_t num_experts, const int64_t* ids, int64_t n) {
  std::vector<bool> seen(size_t(num_experts), false);
  std::vector<int64_t> experts;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = ids[i];
    if (e < 0 || seen[size_t(e)]) continue;
    seen[size_t(e)] = true;
    experts.push_back(e);
  }
  return experts;
}

// routed_to_most's share: at least 3/4 of the experts (expert_reads.h).
bool most_of(int64_t distinct, int64_t num_experts) { return distinct * 4 >= num_experts * 3; }

// Each tensor [E, ...]: expert e's numel / E bytes at e * stride(0).
void advise(std::initializer_list<const at::Tensor*> tensors, const std::vector<int64_t>& experts) {
  for (const at::Tensor* w : tensors) {
    const auto* p = w->data_ptr<uint8_t>();
    const int64_t bytes = w->size(0) ? w->numel() / w->size(0) : 0;
    for (int64_t e : experts) read_ahead(p + e * w->stride(0), bytes);
  }
}

}  // namespace

bool routed_to_most(int64_t num_experts, const int64_t* ids, int64_t n) {
  return most_of(int64_t(distinct_experts(num_experts, ids, n).size()), num_experts);
}

bool routed_to_most(int64_t num_experts, const at::Tensor& topk_ids) {
  TORCH_CHECK(num_experts > 0, "routed_to_most: num_experts must be > 0, got ", num_experts);
  TORCH_CHECK(topk_ids.device().is_cpu() && at::isIntegralType(topk_ids.scalar_type(), /*includeBool=*/false),
              "routed_to_most: topk_ids must be an integer CPU tensor, got ", topk_ids.scalar_type());
  const at::Tensor ids = topk_ids.to(at::kLong).contiguous();
  const int64_t top = ids.numel() ? ids.max().item<int64_t>() : -1;
  TORCH_CHECK(top < num_experts, "routed_to_most: topk_ids holds expert id ", top, " but there are only ", num_experts,
              " experts");
  return routed_to_most(num_experts, ids.data_ptr<int64_t>(), ids.numel());
}

void advise_experts(std::initializer_list<const at::Tensor*> tensors, const int64_t* ids, int64_t n) {
  const int64_t num_experts = (*tensors.begin())->size(0);
  const std::vector<int64_t> experts = distinct_experts(num_experts, ids, n);
  if (most_of(int64_t(experts.size()), num_experts)) return;  // a prefill: the faults do better
  advise(tensors, experts);
}

void advise_experts(const at::Tensor& w13, const at::Tensor& w2, const int64_t* ids, int64_t n) {
  advise_experts({&w13, &w2}, ids, n);
}

void read_ahead_experts(const at::Tensor& w13, const at::Tensor& w2, const int64_t* ids, int64_t n) {
  const std::vector<int64_t> experts = distinct_experts(w13.size(0), ids, n);
  if (experts.empty()) return;
  if (ReaderPool::instance().threads() == 0) return advise({&w13, &w2}, experts);  // the pool is off
  queue_rows(w13, experts);
  queue_rows(w2, experts);
}

void read_ahead_experts(const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& expert_ids) {
  for (const auto& [w, name] : {std::make_pair(&w13, "w13"), std::make_pair(&w2, "w2")})
    TORCH_CHECK(w->device().is_cpu() && w->scalar_type() == at::kByte && w->dim() == 2 && w->is_contiguous(),
                "read_ahead_experts: ", name, " must be a contiguous CPU uint8 [E, B] tensor (packed experts), got ",
                w->scalar_type(), " ", w->sizes());
  TORCH_CHECK(w13.size(0) == w2.size(0), "read_ahead_experts: w13 has ", w13.size(0), " experts but w2 has ",
              w2.size(0));
  TORCH_CHECK(expert_ids.device().is_cpu() && !at::isFloatingType(expert_ids.scalar_type()) &&
                  !at::isComplexType(expert_ids.scalar_type()) && expert_ids.scalar_type() != at::kBool,
              "read_ahead_experts: expert_ids must be an integer CPU tensor, got ", expert_ids.scalar_type());
  const at::Tensor ids = expert_ids.to(at::kLong).contiguous().reshape(-1);
  const int64_t experts = w13.size(0);
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    TORCH_CHECK(p[i] < experts, "read_ahead_experts: expert id ", p[i], " >= num_experts ", experts,
                " (ids must be < ", experts, "; negative ids mean 'skip')");
  read_ahead_experts(w13, w2, p, ids.numel());
}

}  // namespace ktmoe
