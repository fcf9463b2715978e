#include "ops/arena_registry.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <mutex>

namespace ktmoe {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<KtWeightArena>> arenas;
  int64_t next_id = 0;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: tensors may outlive statics
  return *r;
}

}  // namespace

std::shared_ptr<KtWeightArena> open_registered_arena(const std::string& dir, const std::string& name,
                                                     const ArenaOptions& options, std::string* key) {
  auto arena = KtWeightArena::open(dir, name, options);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.arenas.begin(); it != r.arenas.end();)  // forget dead arenas
    it = it->second.expired() ? r.arenas.erase(it) : std::next(it);
  *key = "arena:" + std::to_string(r.next_id++) + ":" + name;
  r.arenas[*key] = arena;
  return arena;
}

std::shared_ptr<KtWeightArena> find_arena(const std::string& key) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.arenas.find(key);
  auto arena = it == r.arenas.end() ? nullptr : it->second.lock();
  TORCH_CHECK(arena, "ktmoe: no live weight arena with key '", key,
              "' (keep the WeightArena object alive while packing into it)");
  return arena;
}

std::vector<std::pair<std::string, std::shared_ptr<KtWeightArena>>> live_arenas() {
  Registry& r = registry();
  std::vector<std::pair<std::string, std::shared_ptr<KtWeightArena>>> out;
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [key, weak] : r.arenas)
    if (auto arena = weak.lock()) out.emplace_back(key, std::move(arena));
  return out;
}

at::Tensor arena_empty(const std::shared_ptr<KtWeightArena>& arena, at::IntArrayRef sizes) {
  int64_t bytes = 1;
  for (int64_t s : sizes) bytes *= s;
  bool file_backed = false;
  return arena_tensor(arena, arena->alloc(bytes, &file_backed), sizes);
}

at::Tensor arena_tensor(const std::shared_ptr<KtWeightArena>& arena, void* data, at::IntArrayRef sizes) {
  return at::from_blob(
      data, sizes, [arena](void*) {}, at::TensorOptions().dtype(at::kByte));
}

at::Tensor arena_empty(const std::string& key, at::IntArrayRef sizes) {
  if (key.empty()) return at::empty(sizes, at::TensorOptions().dtype(at::kByte));
  return arena_empty(find_arena(key), sizes);
}

}  // namespace ktmoe
