// The Python module torch_ktmoe._C: weight arenas (WeightArena, CacheLock, arena
// statistics), cache keys, cache directory helpers and inspection, packed sizes,
// ISA selection. The ops themselves are registered in torch_bindings.cpp.
//
// Includes: everything computed goes through ops/ (ISA choice, packing plan,
// cache keys, inspection). arena/ is included only for the objects Python holds
// and calls 1:1 (KtWeightArena, CacheLock, the cache file names, the NUMA node
// count): a pass-through layer in ops/ would only repeat their declarations.
#include <torch/extension.h>

#include "arena/cache_file.h"
#include "arena/cache_lock.h"
#include "arena/numa_first_touch.h"
#include "arena/weight_arena.h"
#include "ops/arena_tensor.h"
#include "ops/isa_dispatch.h"
#include "ops/ops.h"
#include "ops/packed_cache.h"
#include "python_formats.h"

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

// Header text as printable ASCII: a random or hostile file must not break the listing.
std::string printable(const char* p, size_t n) {
  std::string out(p, n);
  for (char& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return out;
}

// What `inspect` prints of one cache file: its header, validity (the checks of a
// load against the file's own key; verify: data checksums too), residency.
py::dict inspection_dict(const std::string& path, const ktmoe::PackedCacheInspection& in) {
  const ktmoe::CacheFileInspection& f = in.file;
  const auto shape = [&f](size_t t) -> py::tuple {
    if (t >= f.shapes.size()) return py::make_tuple(0, 0);
    return py::make_tuple(f.shapes[t].first, f.shapes[t].second);
  };
  py::dict d;
  d["path"] = path;
  d["file_bytes"] = f.file_bytes;
  d["valid"] = f.reason.empty();
  d["reason"] = f.reason;
  d["resident_bytes"] = f.resident_bytes;
  if (in.key_ok) {
    const ktmoe::PackedCacheKey& key = in.key;
    d["weight_format"] = printable(key.weight_format.data(), key.weight_format.size());
    d["group_size"] = key.group_size;
    d["experts"] = key.experts;
    d["hidden"] = key.hidden;
    d["inter"] = key.inter;
    d["inter_range"] = py::make_tuple(key.inter_lo, key.inter_hi);
    d["numa_part"] = key.numa_part;
    d["packed_version"] = key.packed_version;
    d["w13_shape"] = shape(0);
    d["w2_shape"] = shape(1);
    d["fingerprint"] = printable(key.fingerprint.data(), key.fingerprint.size());
  }
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_ktmoe native extension: weight arenas, cache helpers, ISA selection (ops: torch.ops.ktmoe)";

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
  m.def("inspect_cache_file", [](const std::string& path, bool verify) {
    ktmoe::PackedCacheInspection in;
    {
      py::gil_scoped_release release;
      in = ktmoe::inspect_packed_cache_file(path, verify);
    }
    return inspection_dict(path, in);
  }, py::arg("path"), py::arg("verify") = false,
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
  m.def("set_isa", &ktmoe::set_isa, py::arg("name"), "the ISA of every later op call of the process");
  m.def("set_thread_isa", &ktmoe::set_thread_isa, py::arg("name"),
        "the ISA of this thread's later op calls ('' : the process's); returns the thread's previous choice");
  m.def("active_isa", [] { return std::string(ktmoe::active_isa().name); }, "the ISA of this thread's next op call");
  m.def("available_isas", &ktmoe::available_isas);
  m.def("default_isa", &ktmoe::default_isa);
  m.def("numa_node_count", &ktmoe::numa_node_count);
  bind_weight_formats(m);
}
