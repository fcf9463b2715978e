// [NOTE] Binds the persistent cache: PackedCacheKey, the arena names, temp-file
// listing, WeightArena.load_or_build (the whole protocol in one call, see
// arena/cache_protocol.h), and inspection of kept files.
#include "arena/cache_file.h"
#include "arena/cache_lock.h"
#include "ops/packed_cache.h"
#include "python_bindings.h"

namespace ktmoe {
namespace {

namespace py = pybind11;

// (hit, reason, w13, w2, warning): see WeightArena.load_or_build in torch_ktmoe/arena.py.
py::tuple load_or_build(const PyArena& a, const PackedCacheKey& key, const std::string& policy, bool verify_data,
                        const py::object& build, int64_t read_first_max_bytes, const py::object& log) {
  const CacheRequest request{parse_cache_policy(policy), read_first_max_bytes, cache_lock_wait_seconds()};
  PackExperts pack;
  if (!build.is_none())
    pack = [&build] {
      py::gil_scoped_acquire gil;
      return build().cast<std::pair<at::Tensor, at::Tensor>>();
    };
  const CacheLog to_log = [&log](int level, const std::string& text) {
    py::gil_scoped_acquire gil;
    if (!log.is_none()) log(level, text);
  };
  PackedCacheResult r;
  {
    py::gil_scoped_release release;
    r = load_or_build_packed_cache(a.arena, key, request, verify_data, pack, to_log);
  }
  const auto tensor = [](const at::Tensor& t) -> py::object { return t.defined() ? py::cast(t) : py::none(); };
  return py::make_tuple(r.outcome.hit, r.outcome.reason, tensor(r.w13), tensor(r.w2), r.outcome.warning);
}

// Header text as printable ASCII: a random or hostile file must not break the listing.
std::string printable(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return out;
}

// What `inspect` prints of one cache file: its header, validity (the checks of a
// load against the file's own key; verify: data checksums too), residency.
py::dict inspection_dict(const std::string& path, const PackedCacheInspection& in) {
  const CacheFileInspection& f = in.file;
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
    const PackedCacheKey& key = in.key;
    d["weight_format"] = printable(key.weight_format);
    d["group_size"] = key.group_size;
    d["experts"] = key.experts;
    d["hidden"] = key.hidden;
    d["inter"] = key.inter;
    d["inter_range"] = py::make_tuple(key.inter_lo, key.inter_hi);
    d["numa_part"] = key.numa_part;
    d["packed_version"] = key.packed_version;
    d["w13_shape"] = shape(0);
    d["w2_shape"] = shape(1);
    d["fingerprint"] = printable(key.fingerprint);
  }
  return d;
}

}  // namespace

void bind_cache(py::module_& m, PyArenaClass& arena) {
  arena.def("load_or_build", &load_or_build, py::arg("key"), py::arg("policy"), py::arg("verify_data") = false,
            py::arg("build") = py::none(), py::arg("read_first_max_bytes") = 0, py::arg("log") = py::none(),
            "validate-or-build this arena's kept file (arena/cache_protocol.h): (hit, reason, w13, w2, warning)")
      .def_property_readonly("cache_refusal", [](const PyArena& a) { return a.arena->cache_refusal(); })
      .def_property_readonly("read_only", [](const PyArena& a) { return a.arena->read_only(); });

  py::class_<PackedCacheKey>(m, "PackedCacheKey", "what a layer part's cache file must hold")
      .def_readonly("weight_format", &PackedCacheKey::weight_format)
      .def_readonly("fingerprint", &PackedCacheKey::fingerprint);
  m.def("packed_cache_key", &packed_cache_key, py::arg("weight_format"), py::arg("group_size"), py::arg("experts"),
        py::arg("hidden"), py::arg("inter"), py::arg("inter_lo"), py::arg("inter_hi"), py::arg("numa_part"),
        py::arg("fingerprint"));
  m.def("cache_arena_name", &cache_arena_name, py::arg("layer"), py::arg("part"),
        "the arena name of a layer's NUMA part: layer0003.part1");
  m.def("parse_cache_arena_name", [](const std::string& name) -> py::tuple {
    int64_t layer = 0, part = 0;
    if (!parse_cache_arena_name(name, &layer, &part)) return py::make_tuple(py::none(), py::none());
    return py::make_tuple(layer, part);
  }, py::arg("name"), "(layer, part) of layer0003.part1[.ktmoe], or (None, None)");
  m.def("cache_suffix", [] { return std::string(kCacheSuffix); }, "the suffix of kept cache files");
  m.def("cache_file_name", &cache_file_name, py::arg("name"), "the kept file of arena `name`: layer0003.part1.ktmoe");
  m.def("cache_lock_name", &cache_lock_name, py::arg("name"),
        "the build lock of arena `name`: layer0003.part1.ktmoe.lock");
  m.def("cache_temp_files", &cache_temp_files, py::arg("dir"), py::arg("name") = "",
        "temporary build files in dir (of arena `name`; all when empty), sorted");
}

void bind_inspection(py::module_& m) {
  m.def("inspect_cache_file", [](const std::string& path, bool verify) {
    PackedCacheInspection in;
    {
      py::gil_scoped_release release;
      in = inspect_packed_cache_file(path, verify);
    }
    return inspection_dict(path, in);
  }, py::arg("path"), py::arg("verify") = false,
        "header fields, valid/reason (the checks of a load against the file's own key; verify: data "
        "checksums too) and resident_bytes of a .ktmoe file");
  m.def("cache_dir_problem", [](const std::string& dir) {
    return WeightArena::open(dir, "probe", {})->open_error();
  }, py::arg("dir"), "why an arena in dir would fall back to anonymous memory ('' if it would not)");
}

}  // namespace ktmoe
