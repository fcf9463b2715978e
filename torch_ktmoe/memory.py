"""Process memory as a user checks it: anonymous vs file-backed RSS, plus arenas."""
from ._native import _C

_SMAPS_FIELDS = ("Rss", "Anonymous", "Private_Clean", "Private_Dirty", "Shared_Clean",
                 "Shared_Dirty", "Swap")


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


def memory_report() -> dict:
    """Memory of this process and of its weight arenas.

    Keys: ``anon_rss_bytes`` (resident anonymous memory: what only swap can
    reclaim), ``file_rss_bytes`` (resident file-backed memory: clean page cache
    the kernel can drop), ``swap_bytes``, ``rss_bytes``, the raw smaps figures
    under ``smaps``; and over all live weight arenas: ``arenas``,
    ``arena_allocations``, ``arena_file_backed_bytes``, ``arena_anon_bytes``,
    ``arena_fallbacks`` (since start) with ``arena_fallback_reasons``.
    """
    smaps = _smaps_rollup()
    rss, anon = smaps.get("Rss", 0), smaps.get("Anonymous", 0)
    arenas = _C.process_arena_stats()
    return {
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
        "smaps": {k: smaps[k] for k in _SMAPS_FIELDS if k in smaps},
    }
