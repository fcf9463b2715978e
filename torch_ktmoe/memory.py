"""Process memory as a user checks it (anonymous vs file-backed RSS, plus arenas); headroom; whether file-backed
experts fit in memory."""
import resource

from ._native import _C

# FilePmdMapped: file pages mapped 2 MiB at a time (WeightArena(hugepage=True) on a filesystem that can)
_SMAPS_FIELDS = ("Rss", "Anonymous", "Private_Clean", "Private_Dirty", "Shared_Clean",
                 "Shared_Dirty", "Swap", "FilePmdMapped")


def _smaps_rollup(path="/proc/self/smaps_rollup") -> dict:
    """Byte counts of /proc/self/smaps_rollup (empty where the file is missing)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[0].endswith(":") and parts[2] == "kB":
                    out[parts[0][:-1]] = int(parts[1]) * 1024
    except OSError:
        pass
    return out


def memory_report(per_layer: bool = False) -> dict:
    """Memory of this process and of its weight arenas.

    Keys: ``anon_rss_bytes`` (resident anonymous memory: what only swap can
    reclaim), ``file_rss_bytes`` (resident file-backed memory: clean page cache
    the kernel can drop), ``swap_bytes``, ``rss_bytes``, the raw smaps figures
    under ``smaps``; and over all live weight arenas: ``arenas``,
    ``arena_allocations``, ``arena_file_backed_bytes``, ``arena_anon_bytes``,
    ``arena_fallbacks`` (since start) with ``arena_fallback_reasons``,
    ``arena_resident_bytes`` (bytes of live arenas in RAM: ``mincore`` over their
    files plus their anonymous allocations); ``major_faults`` / ``minor_faults``
    of this process since start (``getrusage``: a major fault read a page from
    disk, e.g. a cold expert refaulted after reclaim).

    ``per_layer=True`` adds ``per_layer``: one dict per live arena (one per
    KTMoE layer and NUMA part) with ``name``, ``dir``, ``file_backed_bytes``,
    ``anon_bytes``, ``resident_bytes``, ``fallbacks``, in creation order.
    """
    smaps = _smaps_rollup()
    rss, anon = smaps.get("Rss", 0), smaps.get("Anonymous", 0)
    arenas = _C.process_arena_stats()
    live = _C.live_arenas()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = {
        "anon_rss_bytes": anon,
        "file_rss_bytes": max(rss - anon, 0),
        "swap_bytes": smaps.get("Swap", 0),
        "rss_bytes": rss,
        "arenas": arenas["arenas"],
        "arena_allocations": arenas["allocations"],
        "arena_file_backed_bytes": arenas["file_backed_bytes"],
        "arena_anon_bytes": arenas["anon_bytes"],
        "arena_fallbacks": arenas["fallbacks"],
        "arena_fallback_reasons": list(arenas["fallback_reasons"]),
        "arena_resident_bytes": sum(a["resident_bytes"] for a in live),
        "major_faults": usage.ru_majflt,
        "minor_faults": usage.ru_minflt,
        "smaps": {k: smaps[k] for k in _SMAPS_FIELDS if k in smaps},
    }
    if per_layer:
        report["per_layer"] = [
            {k: a[k] for k in ("name", "dir", "file_backed_bytes", "anon_bytes", "resident_bytes", "fallbacks")}
            for a in sorted(live, key=lambda a: a["id"])
        ]
    return report


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _stat_field(path, field):
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == field:
                    return int(parts[1])
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_memory():
    """(limit, usage, inactive file bytes) of this process's memory cgroup (v1 or v2), or None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):  # cgroup v1
            base = "/sys/fs/cgroup/memory" + path
            limit, usage = _read_int(base + "/memory.limit_in_bytes"), _read_int(base + "/memory.usage_in_bytes")
            inactive = _stat_field(base + "/memory.stat", "total_inactive_file")
            break
    else:
        v2 = [path for hid, controllers, path in lines if hid == "0" and controllers == ""]
        if not v2:
            return None
        base = "/sys/fs/cgroup" + v2[0]
        limit, usage = _read_int(base + "/memory.max"), _read_int(base + "/memory.current")
        inactive = _stat_field(base + "/memory.stat", "inactive_file")
    if limit is None or usage is None or limit >= 1 << 60:  # no limit
        return None
    return limit, usage, inactive


def _cgroup_headroom():
    """Bytes this process's memory cgroup can still take (limit - usage + inactive file), or None."""
    cgroup = _cgroup_memory()
    return None if cgroup is None else max(cgroup[0] - cgroup[1] + cgroup[2], 0)


def memory_headroom_bytes() -> int:
    """How many more bytes this process can bring into RAM without evicting others.

    ``MemAvailable`` of /proc/meminfo, lowered to the memory cgroup's headroom
    (limit - usage + inactive file pages) when the process runs under a limit.
    Warm-on-load reads at most this much (see :meth:`torch_ktmoe.KTMoE.warm`).
    """
    available = _stat_field_kb("/proc/meminfo", "MemAvailable:")
    cgroup = _cgroup_headroom()
    return available if cgroup is None else min(available, cgroup)


def file_experts_fit_in_memory() -> bool:
    """Whether the file-backed experts of all live arenas can stay in RAM together.

    Their bytes against the smaller of: RAM (or the memory cgroup's limit) less this
    process's anonymous memory, and its mapped file pages plus the memory headroom
    (:func:`memory_headroom_bytes`). False: a model bigger than RAM (or its cgroup),
    whose cold experts are read from disk again while it runs. KTMoE's
    ``prefetch="auto"`` reads ahead the routed experts then (the decision of each experts directory:
    :class:`torch_ktmoe.residency.experts_dir.ExpertsDir`). Every figure is a kernel
    counter (no page-table walk, no ``mincore``): each layer's load can ask.
    """
    file_bytes = _C.process_arena_stats()["file_backed_bytes"]
    if file_bytes == 0:
        return True
    mapped_file = _stat_field_kb("/proc/self/status", "RssFile:")
    return file_bytes <= min(file_room_bytes(), mapped_file + memory_headroom_bytes())


def file_room_bytes() -> int:
    """RAM (or the memory cgroup's limit, if lower) less this process's anonymous memory: the most file-backed
    experts that can be in RAM at once. A prefill streams the next layer only while it and the layer computing
    fit in it together (:meth:`torch_ktmoe.residency.experts_dir.ExpertsDir.stream`)."""
    cgroup = _cgroup_memory()
    ram = _stat_field_kb("/proc/meminfo", "MemTotal:")
    ram = ram if cgroup is None else min(ram, cgroup[0])
    return ram - _stat_field_kb("/proc/self/status", "RssAnon:")


def _stat_field_kb(path, field):
    return _stat_field(path, field) * 1024


def release_free_heap() -> bool:
    """Returns freed heap memory to the OS (glibc ``malloc_trim(0)``); False elsewhere.

    Loading packs each layer from dense staging tensors; glibc keeps the freed
    ones in its heap, where they would stay in anonymous RSS.
    """
    try:
        import ctypes

        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False
