// Binds the C++ side to torch and Python: every ktmoe op (schema + CPU kernel)
// and the Python module torch_ktmoe._C (arenas, ISA selection, statistics).
#include <torch/extension.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "arena/cache_lock.h"
#include "arena/numa_first_touch.h"
#include "arena/weight_arena.h"
#include "common/cpu_features.h"
#include "kernels/isa_kernels.h"
#include "ops/arena_tensor.h"
#include "ops/isa_dispatch.h"
#include "ops/ops.h"
#include "ops/packed_cache.h"

TORCH_LIBRARY(ktmoe, m) {
  // Fused MoE forward over packed experts (format read from the packed headers).
  m.def("moe_forward(Tensor hidden_states, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2) -> Tensor");
  // Dense HF (gate_up [E,2I,H]) or kt-kernel (gate, up [E,I,H]) weights -> packed (w13, w2) on the heap.
  m.def("pack_experts(Tensor gate_up, Tensor? up, Tensor down, str weight_format, int group_size) -> (Tensor, Tensor)");
  // The same into caller-allocated outputs (Python takes them from a WeightArena).
  m.def("pack_experts_out(Tensor gate_up, Tensor? up, Tensor down, str weight_format, int group_size, "
        "Tensor(a!) w13, Tensor(b!) w2) -> ()");
}

TORCH_LIBRARY_IMPL(ktmoe, CPU, m) {
  m.impl("moe_forward", &ktmoe::moe_forward);
  m.impl("pack_experts", &ktmoe::pack_experts);
  m.impl("pack_experts_out", &ktmoe::pack_experts_out);
}

namespace {

namespace py = pybind11;

py::dict arena_stats_dict(const ktmoe::ArenaStats& s) {
  py::dict d;
  d["allocations"] = s.allocations;
  d["file_backed_bytes"] = s.file_backed_bytes;
  d["anon_bytes"] = s.anon_bytes;
  d["fallbacks"] = s.fallbacks;
  d["fallback_reasons"] = s.fallback_reasons;
  return d;
}

// The Python face of an arena: the shared_ptr (lifetime).
struct PyArena {
  std::shared_ptr<ktmoe::KtWeightArena> arena;
};

// Reads every byte of the tensors with 512-bit loads on all threads of ATen's
// pool (1 MiB chunks); returns the seconds taken. The benchmarks' read probe.
double stream_read_seconds(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(ktmoe::cpu_features().avx512, "stream_read needs AVX-512");
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<std::pair<const uint8_t*, int64_t>> chunks;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.is_contiguous() && t.device().is_cpu(), "stream_read: contiguous CPU tensors only");
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    const int64_t n = t.numel() * t.element_size();
    for (int64_t off = 0; off < n; off += kChunk) chunks.emplace_back(p + off, std::min(kChunk, n - off));
  }
  std::atomic<float> sink{0.f};
  const auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, int64_t(chunks.size()), 1, [&](int64_t b, int64_t e) {
    float s = 0.f;
    for (int64_t i = b; i < e; ++i) s += ktmoe::stream_read_avx512(chunks[i].first, chunks[i].second);
    sink.store(sink.load() + s);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GB/s of the best of `repeats` passes over a fresh buffer of `bytes` (the read roof).
double stream_read_gbps(int64_t bytes, int64_t repeats) {
  at::Tensor buf = at::ones({bytes}, at::kByte);
  double best = 0;
  for (int64_t r = 0; r < repeats; ++r) best = std::max(best, double(bytes) / stream_read_seconds({buf}) / 1e9);
  return best;
}

// Header text as printable ASCII: a random or hostile file must not break the listing.
std::string printable(const char* p, size_t n) {
  std::string out(p, n);
  for (char& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return out;
}

// What `inspect` prints of one cache file: its header, validity (the checks of a
// load against the file's own key; verify: data checksums too), residency.
py::dict inspect_cache_file(const std::string& path, bool verify) {
  py::dict d;
  d["path"] = path;
  ktmoe::CacheHeader h;
  ktmoe::PackedCacheKey key;
  int64_t file_bytes = 0;
  bool key_ok = false;
  std::string reason;
  {
    py::gil_scoped_release release;
    reason = ktmoe::inspect_packed_cache_file(path, verify, &h, &file_bytes, &key, &key_ok);
  }
  d["file_bytes"] = file_bytes;
  d["valid"] = reason.empty();
  d["reason"] = reason;
  std::string error;
  d["resident_bytes"] = ktmoe::file_resident_bytes(path, &error);
  if (key_ok) {
    d["weight_format"] = printable(key.weight_format.data(), key.weight_format.size());
    d["group_size"] = key.group_size;
    d["experts"] = key.experts;
    d["hidden"] = key.hidden;
    d["inter"] = key.inter;
    d["inter_range"] = py::make_tuple(key.inter_lo, key.inter_hi);
    d["numa_part"] = key.numa_part;
    d["packed_version"] = key.packed_version;
    d["w13_shape"] = py::make_tuple(h.tensors[0].rows, h.tensors[0].cols);
    d["w2_shape"] = py::make_tuple(h.tensors[1].rows, h.tensors[1].cols);
    d["fingerprint"] = printable(key.fingerprint.data(), key.fingerprint.size());
  }
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_ktmoe native extension: ktmoe ops, weight arenas, ISA selection";

  py::class_<PyArena>(m, "WeightArena")
      .def(py::init([](const std::string& dir, const std::string& name, bool hugepage, int numa_node,
                       bool persistent, bool trust_others) {
             ktmoe::ArenaOptions options;
             options.hugepage = hugepage;
             options.numa_node = numa_node;
             options.persistent = persistent;
             options.trust_others = trust_others;
             return PyArena{ktmoe::KtWeightArena::open(dir, name, options)};
           }),
           py::arg("dir"), py::arg("name"), py::arg("hugepage") = true, py::arg("numa_node") = -1,
           py::arg("persistent") = false, py::arg("trust_others") = false)
      .def("load_cached", [](const PyArena& a, const ktmoe::PackedCacheKey& key, bool verify_data) -> py::tuple {
             at::Tensor w13, w2;
             std::string reason;
             {
               py::gil_scoped_release release;
               reason = ktmoe::load_packed_cache(a.arena, key, verify_data, &w13, &w2);
             }
             if (!reason.empty()) return py::make_tuple(reason, py::none(), py::none());
             return py::make_tuple(reason, w13, w2);
           },
           py::arg("key"), py::arg("verify_data") = false,
           "(\"\", w13, w2) mapped copy-on-write from a valid cache file, or (reason, None, None); "
           "verify_data: also compare the data checksums")
      .def("refuse_cache", [](const PyArena& a, const std::string& reason) { a.arena->refuse_cache(reason); },
           py::arg("reason"), "keep and map no cache file (an unnamed file instead); cache calls answer `reason`")
      .def_property_readonly("cache_refusal", [](const PyArena& a) { return a.arena->cache_refusal(); })
      .def("begin_build", [](const PyArena& a) {
             std::string error;
             a.arena->begin_build(&error);
             return error;
           },
           "start a cache file build (temp file); '' or why not (allocations then fall back)")
      .def("commit_build", [](const PyArena& a, const at::Tensor& w13, const at::Tensor& w2,
                              const ktmoe::PackedCacheKey& key) { return ktmoe::commit_packed_cache(a.arena, key, w13, w2); },
           py::arg("w13"), py::arg("w2"), py::arg("key"), py::call_guard<py::gil_scoped_release>(),
           "header last, fsync, rename, fsync dir; '' or the error")
      .def("abort_build", [](const PyArena& a) { a.arena->abort_build(); }, "remove an uncommitted temp file")
      .def_property_readonly("read_only", [](const PyArena& a) { return a.arena->read_only(); })
      .def("empty", [](const PyArena& a, std::vector<int64_t> sizes) {
             return ktmoe::arena_empty(a.arena, sizes);
           },
           py::arg("sizes"), py::call_guard<py::gil_scoped_release>(),
           "uint8 tensor of `sizes` in arena memory (keeps the arena alive); thread-safe")
      .def("take_warning", [](const PyArena& a) { return a.arena->warn_once(); },
           "the first fallback reason, once (then '')")
      .def("writeback", [](const PyArena& a, bool wait) {
             std::string error;
             if (!a.arena->writeback(wait, &error)) throw std::runtime_error(error);
           },
           py::arg("wait") = true, py::call_guard<py::gil_scoped_release>(),
           "push dirty pages of the backing file to disk (clean, reclaimable page cache)")
      .def("resident_bytes", [](const PyArena& a) { return a.arena->resident_bytes(); },
           py::call_guard<py::gil_scoped_release>(),
           "bytes in RAM: mincore over the file's slices + anonymous allocations")
      .def("evict", [](const PyArena& a) {
             std::string error;
             if (!a.arena->evict(&error)) throw std::runtime_error(error);
           },
           py::call_guard<py::gil_scoped_release>(),
           "drop the backing file's pages from memory (writeback, MADV_DONTNEED, fadvise DONTNEED)")
      .def("prefault", [](const PyArena& a, bool wait) {
             std::string error;
             if (!a.arena->prefault(wait, &error)) throw std::runtime_error(error);
           },
           py::arg("wait") = true, py::call_guard<py::gil_scoped_release>(),
           "read the backing file into memory: read() what is not cached, read through the mapping what is, then "
           "MADV_POPULATE_READ (else MADV_WILLNEED); wait=False: on a background thread")
      .def("join_prefault", [](const PyArena& a) { a.arena->join_prefault(); },
           py::call_guard<py::gil_scoped_release>(), "wait for a background prefault")
      .def_property_readonly("prefault_status", [](const PyArena& a) { return a.arena->prefault_status(); })
      .def_static("read_file_through_cache", [](const std::string& path) {
             std::string error;
             const int64_t n = ktmoe::read_file_through_cache(path, &error);
             if (n < 0) throw std::runtime_error(error);
             return n;
           },
           py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "read a whole regular file with read() (page cache, readahead; every page read once); its size")
      .def_property_readonly("id", [](const PyArena& a) { return a.arena->id(); }, "creation order in this process")
      .def_property_readonly("dir", [](const PyArena& a) { return a.arena->dir(); })
      .def_property_readonly("name", [](const PyArena& a) { return a.arena->name(); })
      .def_property_readonly("file_mode", [](const PyArena& a) { return a.arena->file_mode(); })
      .def_property_readonly("open_error", [](const PyArena& a) { return a.arena->open_error(); })
      .def_property_readonly("file_bytes", [](const PyArena& a) { return a.arena->file_bytes(); })
      .def("stats", [](const PyArena& a) { return arena_stats_dict(a.arena->stats()); });

  py::class_<ktmoe::PackedCacheKey>(m, "CacheKey", "what a layer part's cache file must hold")
      .def_readonly("weight_format", &ktmoe::PackedCacheKey::weight_format)
      .def_readonly("fingerprint", &ktmoe::PackedCacheKey::fingerprint);
  m.def("cache_key", &ktmoe::packed_cache_key, py::arg("weight_format"), py::arg("group_size"),
        py::arg("experts"), py::arg("hidden"), py::arg("inter"), py::arg("inter_lo"), py::arg("inter_hi"),
        py::arg("numa_part"), py::arg("fingerprint"));
  m.def("inspect_cache_file", &inspect_cache_file, py::arg("path"), py::arg("verify") = false,
        "header fields, valid/reason (the checks of a load against the file's own key; verify: data "
        "checksums too) and resident_bytes of a .ktmoe file");
  m.def("cache_dir_problem", [](const std::string& dir) {
    // Why an arena in dir would fall back to anonymous memory ("" if it would not).
    return ktmoe::KtWeightArena::open(dir, "probe", {})->open_error();
  }, py::arg("dir"));

  m.def("cache_suffix", [] { return std::string(ktmoe::kCacheSuffix); }, "the suffix of kept cache files");
  m.def("cache_temp_files", &ktmoe::cache_temp_files, py::arg("dir"), py::arg("name") = "",
        "temporary build files in dir (of arena `name`; all when empty), sorted");
  m.def("remove_stale_temp_files", &ktmoe::remove_stale_temp_files, py::arg("dir"), py::arg("name"),
        "remove arena `name`'s temporary build files (under its CacheLock); the names removed");

  py::class_<ktmoe::CacheLock>(m, "CacheLock", "flock on <dir>/<name>.ktmoe.lock; a context manager")
      .def(py::init<std::string, std::string>(), py::arg("dir"), py::arg("name"))
      .def("__enter__", [](ktmoe::CacheLock& l) -> ktmoe::CacheLock& {
             py::gil_scoped_release release;
             l.acquire();
             return l;
           }, py::return_value_policy::reference)
      .def("__exit__", [](ktmoe::CacheLock& l, py::args) { l.release(); return false; })
      .def_property_readonly("locked", &ktmoe::CacheLock::locked)
      .def_property_readonly("refused", &ktmoe::CacheLock::refused, "why the lock path is hostile ('' if not)")
      .def_property_readonly("error", &ktmoe::CacheLock::error, "why no lock file could be made ('' if none)")
      .def_property_readonly("path", &ktmoe::CacheLock::path);
  m.def("process_arena_stats", [] {
    const ktmoe::ProcessArenaStats s = ktmoe::KtWeightArena::process_stats();
    py::dict d = arena_stats_dict(s);
    d["arenas"] = s.arenas;
    return d;
  });
  m.def("live_arenas", [] {
    // Snapshot first, then mincore without the GIL; the list holds no arena.
    std::vector<std::shared_ptr<ktmoe::KtWeightArena>> arenas;
    std::vector<int64_t> resident;
    {
      py::gil_scoped_release release;
      arenas = ktmoe::KtWeightArena::live();
      for (const auto& arena : arenas) resident.push_back(arena->resident_bytes());
    }
    py::list out;
    for (size_t i = 0; i < arenas.size(); ++i) {
      const auto& arena = arenas[i];
      py::dict d = arena_stats_dict(arena->stats());
      d["id"] = arena->id();
      d["name"] = arena->name();
      d["dir"] = arena->dir();
      d["file_mode"] = arena->file_mode();
      d["resident_bytes"] = resident[i];
      out.append(d);
    }
    {
      py::gil_scoped_release release;  // the last reference to an arena may go here: not under the GIL's watch
      arenas.clear();
    }
    return out;
  }, "per live arena, oldest first: id, name, dir, file_mode, resident_bytes and its stats()");
  m.def("packed_sizes", [](const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                           const std::string& weight_format, int64_t group_size) {
    const ktmoe::PackPlan plan = ktmoe::plan_pack(gate_up, up, down, weight_format, group_size);
    return py::make_tuple(py::make_tuple(plan.experts, plan.h13.total_bytes),
                          py::make_tuple(plan.experts, plan.h2.total_bytes));
  }, py::arg("gate_up"), py::arg("up"), py::arg("down"), py::arg("weight_format"), py::arg("group_size") = 0,
  "((E, B13), (E, B2)): the shapes pack_experts_out needs, after the same argument checks");
  m.def("packed_matrix_bytes", &ktmoe::packed_matrix_bytes, py::arg("weight_format"), py::arg("role"),
        py::arg("n"), py::arg("k"), py::arg("group_size") = 0);
  m.def("set_isa", &ktmoe::set_isa, py::arg("name"));
  m.def("active_isa", [] { return std::string(ktmoe::active_isa().name); });
  m.def("available_isas", &ktmoe::available_isas);
  m.def("default_isa", &ktmoe::default_isa);
  m.def("numa_node_count", &ktmoe::numa_node_count);
  m.def("stream_read_gbps", &stream_read_gbps, py::arg("bytes"), py::arg("repeats") = 5);
  m.def("stream_read_seconds", &stream_read_seconds, py::arg("tensors"),
        py::call_guard<py::gil_scoped_release>());
}
