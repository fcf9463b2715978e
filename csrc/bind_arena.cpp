// [NOTE] Binds WeightArena (memory, residency, statistics) and the process-wide arena
// statistics. The cache methods are bind_cache.cpp's.
#include <unistd.h>

#include <vector>

#include "arena/page_cache.h"
#include "arena/reader_pool.h"
#include "ops/arena_tensor.h"
#include "ops/expert_reads.h"
#include "python_bindings.h"

namespace ktmoe {
namespace {

namespace py = pybind11;

py::dict arena_stats_dict(const ArenaStats& s) {
  py::dict d;
  d["allocations"] = s.allocations;
  d["file_backed_bytes"] = s.file_backed_bytes;
  d["anon_bytes"] = s.anon_bytes;
  d["fallbacks"] = s.fallbacks;
  d["fallback_reasons"] = s.fallback_reasons;
  return d;
}

// Throws the error of a call that reports one through *error.
template <typename Call>
void or_raise(Call call) {
  std::string error;
  if (!call(&error)) throw std::runtime_error(error);
}

void bind_residency(PyArenaClass& c) {
  c.def("writeback", [](const PyArena& a, bool wait) { or_raise([&](auto* e) { return a.arena->writeback(wait, e); }); },
        py::arg("wait") = true, py::call_guard<py::gil_scoped_release>(),
        "push dirty pages of the backing file to disk (clean, reclaimable page cache)")
      .def("resident_bytes", [](const PyArena& a) { return a.arena->resident_bytes(); },
           py::call_guard<py::gil_scoped_release>(), "bytes in RAM: mincore over the file's slices + anonymous allocations")
      .def("evict", [](const PyArena& a) { or_raise([&](auto* e) { return a.arena->evict(e); }); },
           py::call_guard<py::gil_scoped_release>(),
           "drop the backing file's pages from memory (writeback, MADV_DONTNEED, fadvise DONTNEED)")
      .def("prefault", [](const PyArena& a, bool wait, bool map_only) {
             or_raise([&](auto* e) { return a.arena->prefault(wait, e, map_only); });
           },
           py::arg("wait") = true, py::arg("map_only") = false, py::call_guard<py::gil_scoped_release>(),
           "read the backing file into memory: read() what is not cached, read through the mapping what is, then "
           "MADV_POPULATE_READ (else MADV_WILLNEED); map_only=True: MADV_POPULATE_READ alone (a prefill's next "
           "layer); wait=False: on a background thread")
      .def("join_prefault", [](const PyArena& a) { a.arena->prefaulter().join(); },
           py::call_guard<py::gil_scoped_release>(), "wait for a background prefault")
      .def("stop_prefault", [](const PyArena& a) { a.arena->prefaulter().stop(); },
           py::call_guard<py::gil_scoped_release>(),
           "stop a running prefault at its next 64 MiB step and wait for it (status 'error: stopped')")
      .def_property_readonly("prefault_status", [](const PyArena& a) { return a.arena->prefaulter().status(); })
      .def_property_readonly("prefault_done_bytes", [](const PyArena& a) { return a.arena->prefaulter().done_bytes(); },
                             "bytes the current (or last) prefault has gone through")
      .def_static("read_file_through_cache", [](const std::string& path) {
             int64_t n = 0;
             or_raise([&](auto* e) { return (n = read_file_through_cache(path, e)) >= 0; });
             return n;
           },
           py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "read a whole regular file with read() (page cache, readahead; every page read once); its size");
}

py::list live_arenas() {
  // Snapshot first, then mincore without the GIL; the list holds no arena.
  std::vector<std::shared_ptr<WeightArena>> arenas;
  std::vector<int64_t> resident;
  {
    py::gil_scoped_release release;
    arenas = WeightArena::live();
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
}

py::dict reader_pool_stats() {
  const ReaderPoolStats s = ReaderPool::instance().stats();
  py::dict d;
  d["threads"] = s.threads;
  d["threads_running"] = s.threads_running;
  d["requests"] = s.requests;
  d["pieces_queued"] = s.pieces_queued;
  d["pieces_read"] = s.pieces_read;
  d["bytes_read"] = s.bytes_read;
  d["duplicates"] = s.duplicates;
  d["dropped"] = s.dropped;
  d["errors"] = s.errors;
  d["last_error"] = s.last_error;
  d["queued_now"] = s.queued_now;
  d["in_flight_now"] = s.in_flight_now;
  d["busy_s"] = double(s.busy_ns) * 1e-9;
  d["thread_busy_s"] = double(s.thread_busy_ns) * 1e-9;
  return d;
}

// The reader pool (arena/reader_pool.h, ops/expert_reads.h): its reads, statistics and threads.
void bind_reader_pool(py::module_& m) {
  m.def("read_ahead_experts", [](const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& expert_ids) {
    read_ahead_experts(w13, w2, expert_ids);
  }, py::arg("w13"), py::arg("w2"), py::arg("expert_ids"), py::call_guard<py::gil_scoped_release>(),
        "queue the listed experts' packed rows (w13, w2 of file-backed arenas) to the reader pool; returns at once");
  m.def("reader_pool_stats", &reader_pool_stats,
        "the reader pool's counters: threads, threads_running, requests, pieces_*, bytes_read, duplicates, dropped, "
        "errors, last_error, queued_now, in_flight_now, busy_s (wall time with a read in flight), thread_busy_s");
  m.def("reader_pool_set_threads", [](int n) { ReaderPool::instance().set_threads(n); }, py::arg("threads"),
        py::call_guard<py::gil_scoped_release>(),
        "threads of the next start (0: pool off, read-ahead by MADV_WILLNEED); stops a running pool first");
  m.def("reader_pool_stop", [] { ReaderPool::instance().stop(); }, py::call_guard<py::gil_scoped_release>(),
        "drop the queued reads and join the pool's threads (the next read starts them again)");
  m.def("reader_pool_read_file", [](const PyArena& a, int64_t offset, int64_t bytes) {
    std::string error;
    auto file = a.arena->read_file(&error);
    if (!file) throw std::runtime_error(error);
    ReaderPool::instance().read(file, {{offset, bytes}});
  }, py::arg("arena"), py::arg("offset"), py::arg("bytes"), py::call_guard<py::gil_scoped_release>(),
        "queue [offset, offset + bytes) of the arena's backing file to the reader pool (benchmarks, tests)");
  // interpreter exit: the threads stop before Python tears down (their pieces need nothing of Python)
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    py::gil_scoped_release release;
    ReaderPool::instance().stop();
  }));
}

}  // namespace

PyArenaClass bind_arena(py::module_& m) {
  PyArenaClass c(m, "WeightArena");
  c.def(py::init([](const std::string& dir, const std::string& name, bool hugepage, int numa_node, bool persistent,
                    bool trust_others, bool map_only) {
          ArenaOptions options;
          options.hugepage = hugepage;
          options.numa_node = numa_node;
          options.trust_others = trust_others;
          options.map_only = map_only;
          options.persistent = persistent || map_only;
          return PyArena{WeightArena::open(dir, name, options)};
        }),
        py::arg("dir"), py::arg("name"), py::arg("hugepage") = true, py::arg("numa_node") = -1,
        py::arg("persistent") = false, py::arg("trust_others") = false, py::arg("map_only") = false)
      .def("empty", [](const PyArena& a, std::vector<int64_t> sizes) { return arena_empty(a.arena, sizes); },
           py::arg("sizes"), py::call_guard<py::gil_scoped_release>(),
           "uint8 tensor of `sizes` in arena memory (keeps the arena alive); thread-safe")
      .def("take_warning", [](const PyArena& a) { return a.arena->warn_once(); },
           "the first fallback reason, once (then '')")
      .def_property_readonly("dir", [](const PyArena& a) { return a.arena->dir(); })
      .def_property_readonly("name", [](const PyArena& a) { return a.arena->name(); })
      .def_property_readonly("file_mode", [](const PyArena& a) { return a.arena->file_mode(); })
      .def_property_readonly("open_error", [](const PyArena& a) { return a.arena->open_error(); })
      .def_property_readonly("file_bytes", [](const PyArena& a) { return a.arena->file_bytes(); })
      .def("stats", [](const PyArena& a) { return arena_stats_dict(a.arena->stats()); });
  bind_residency(c);
  m.def("process_arena_stats", [] {
    const ProcessArenaStats s = WeightArena::process_stats();
    py::dict d = arena_stats_dict(s);
    d["arenas"] = s.arenas;
    return d;
  });
  m.def("live_arenas", &live_arenas,
        "per live arena, oldest first: id, name, dir, file_mode, resident_bytes and its stats()");
  // packed: a layer's packed tensors ([E, B] uint8, contiguous: w13 and w2 of each NUMA part); ids: its routing
  // [T, k] (int64 or int32, < 0 skipped) -> (hits, misses) over the distinct routed experts: a hit when every
  // page of the expert's row in every tensor is in the page cache (mincore; anonymous memory is resident).
  // torch_ktmoe/residency.py asks it before each forward of file-backed experts: one call, no Python loop.
  m.def("routed_to_most", [](int64_t num_experts, const at::Tensor& ids) { return routed_to_most(num_experts, ids); },
        py::arg("num_experts"), py::arg("topk_ids"),
        "whether the distinct routed ids (>= 0) are at least 3/4 of num_experts: a prefill, whose routed experts "
        "moe_forward(prefetch=True) leaves to the gemms' faults and whose next layer KTMoE streams");
  m.def("routed_experts_resident", [](const std::vector<at::Tensor>& packed, const at::Tensor& ids) {
    TORCH_CHECK(!packed.empty(), "routed_experts_resident: no packed tensors");
    const int64_t experts = packed[0].size(0), page = int64_t(::sysconf(_SC_PAGESIZE));
    for (const at::Tensor& w : packed)
      TORCH_CHECK(w.dim() == 2 && w.size(0) == experts && w.scalar_type() == at::kByte && w.is_contiguous() &&
                      w.device().is_cpu(),
                  "routed_experts_resident: packed tensors must be contiguous CPU uint8 [E, B] with one E, got ",
                  w.sizes(), " ", w.scalar_type());
    const at::Tensor flat = ids.to(at::kLong).contiguous().reshape(-1);
    std::vector<char> seen(size_t(experts), 0);
    int64_t hits = 0, misses = 0;
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const int64_t e = flat.data_ptr<int64_t>()[i];
      if (e < 0) continue;
      TORCH_CHECK(e < experts, "routed_experts_resident: expert id ", e, " >= num_experts ", experts);
      if (seen[size_t(e)]) continue;  // (a flag, not a count: a char count wraps after 256 rows of one expert)
      seen[size_t(e)] = 1;
      bool resident = true;
      for (size_t t = 0; t < packed.size() && resident; ++t) {
        const int64_t row_bytes = packed[t].size(1);
        const uintptr_t begin = reinterpret_cast<uintptr_t>(packed[t].data_ptr<uint8_t>() + e * row_bytes);
        const uintptr_t first = begin & ~uintptr_t(page - 1);
        const int64_t span = int64_t(begin + uintptr_t(row_bytes) - first);
        resident = row_bytes == 0 || mincore_resident(reinterpret_cast<void*>(first), span) >= span;
      }
      ++(resident ? hits : misses);
    }
    return py::make_tuple(hits, misses);
  }, py::arg("packed"), py::arg("ids"));
  bind_reader_pool(m);
  return c;
}

}  // namespace ktmoe
