"""A 30B-class MoE on a 24 GiB, 2-core box: torch_ktmoe's file-backed experts against llama.cpp's mmap.

    python -m benchmarks.model.bench_scale [--data /work/scale_data] [--tokens 16] [--warmup 4]
                                     [--limits none,16,12] [--routings uniform,zipf] [--keep]

Qwen3-30B-A3B's shape (48 layers, 128 experts, top-8, H=2048, I=768, GQA 32/4 x 128; vocab 4096 instead
of 151936), random seeded weights (benchmarks/model/scale/common.py):
  * ours: a packed model directory with int8 experts (~29 GB; benchmarks/model/scale/gen_packed.py, a layer at
    a time), decoded by transformers' Qwen3MoeForCausalLM with real attention and KV cache, experts
    mapped from the files by torch_ktmoe.hf.from_pretrained (benchmarks/model/scale/decode_ours.py);
  * llama.cpp: the same shapes and the same non-expert weights as a q8_0-experts GGUF (arch qwen3moe,
    benchmarks/model/scale/gen_gguf.py), decoded through libllama with its default mmap
    (benchmarks/baselines/llama/llama_decode.cpp, built from the llama-cpp-python sdist's vendored llama.cpp).
Both: 2 threads (OMP_WAIT_POLICY=passive by default: both are OpenMP programs and this host is
shared), T=1 decode of a seeded token sequence (the argmax of each step is computed), routing
by the model's own router; "uniform" and "zipf" (s=1 per layer) differ only in the embedding's
popularity channel (see common.py). Each run: sync + drop the page cache, start a fresh process
(in a fresh v1 memory cgroup of the given limit, no swap), load, --warmup tokens, then --tokens
measured tokens: tok/s median and min, major faults per measured token, time to first token from
process start (cold page cache); for ours also the disk figures of the measured tokens: MB read per
token (/proc/self/io), the disk rate while the layers waited on it and over the decode, each as % of the
disk roof (benchmarks/baselines/disk_roof.py: the best of one buffered stream, O_DIRECT 4 MiB requests and
8 buffered streams over the model's own files, measured once per model in the same run) and of its rate for
the same bytes as 2 MiB runs in random order (what reading routed experts can get at best), the routed
experts' hit rate and the next-layer predictor's recall (torch_ktmoe.residency_report). Plus: anonymous
experts (no mmap_experts_dir) under each limit.

The two models do not fit on the disk together (~31 + ~33 GB here): unless they do, the script runs
ours, deletes it, then llama.cpp's (phases); when both fit it alternates per configuration. It refuses
to start when the disk cannot hold the larger model with a margin, and deletes the model files at the
end unless --keep. Needs root (drop_caches, cgroups v1). Results: benchmarks/results/bench_scale.json (--out).

--gguf FILE: one existing GGUF of this model (e.g. a Q4_K_M made by llama.cpp's own llama-quantize; its
token_embd must stay BF16, the routing is written into it) decoded by every system, alternated per
configuration, --rounds times; nothing generated or deleted; the disk roof over that file. Systems: ours-gguf
(torch_ktmoe.hf.from_pretrained(dir, gguf_file=FILE): the experts the file's blocks where they lie, mapped;
prefetch="auto", next-layer prefetch off), ours-gguf-nextlayer (next_layer_prefetch="auto" too: the library's
defaults), ours-gguf-noprefetch (both off), llama (llama.cpp's defaults: mmap, repack on) and llama-norepack
(its --no-repack: every weight stays in the mapping). A limit "1/3" is a third of the file's bytes. Bytes read per
token (/proc/self/io) and disk busy (the device's io_ticks over the measured tokens) for both systems.
--page-cache warm reads the file whole right before each run instead of leaving it dropped: with --limits none
and few tokens, "load s" is the time to ready (ours: from_pretrained until the first token can be computed,
imports before the clock; llama.cpp: model load + context creation). The runs of benchmarks/RESULTS.md
("A 30B-class Q4_K_M GGUF bigger than RAM"):

    benchmarks/baselines/llama/build.sh llama_decode /work/data-gguf/llama
    cmake --build /work/data-gguf/llama/cmake-llama_decode --target llama-quantize -j 2
    python -m benchmarks.model.scale.gen_gguf /work/data-gguf/qwen3moe30b_L27_q8_0.gguf --layers 27
    /work/data-gguf/llama/cmake-llama_decode/bin/llama-quantize --allow-requantize --token-embedding-type bf16 \
        /work/data-gguf/qwen3moe30b_L27_q8_0.gguf /work/data-gguf/qwen3moe30b_L27_Q4_K_M.gguf Q4_K_M 2
    rm /work/data-gguf/qwen3moe30b_L27_q8_0.gguf
    python -m benchmarks.model.bench_scale --gguf /work/data-gguf/qwen3moe30b_L27_Q4_K_M.gguf --data /work/data-gguf \
        --systems ours-gguf,ours-gguf-nextlayer,ours-gguf-noprefetch,llama-norepack,llama --limits 1/3 \
        --routings uniform,zipf --rounds 2 --tokens 16 --warmup 4 --roof-gib 1
    python -m benchmarks.model.bench_scale --gguf /work/data-gguf/qwen3moe30b_L27_Q4_K_M.gguf --data /work/data-gguf \
        --systems ours-gguf,llama,llama-norepack --limits none --routings uniform --tokens 2 --warmup 1 --rounds 3 \
        --page-cache warm --roof-gib 0
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import numpy as np

from benchmarks import ROOT
from benchmarks.baselines.disk_roof import disk_rates, disk_roof, roof_line
from benchmarks.cli import add_out_argument, write_result
from benchmarks.model.scale import common as C
from benchmarks.model.scale import models

GB = 1e9


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def summarize(system, routing, limit, rc, out, err, wall, stats, t_spawn, warmup, n):
    rows = C.parse_lines(out)
    loaded = next((r for r in rows if r.get("event") == "loaded"), None)
    toks = [r for r in rows if "i" in r]
    res = dict(system=system, routing=routing, limit=limit, rc=rc, wall_s=round(wall, 1), cgroup=stats,
               load_avg=C.loadavg())
    if loaded:
        res["load_s"] = round(loaded["load_s"], 2)
        if loaded.get("start_s") is not None:
            res["start_s"] = round(loaded["start_s"], 2)
        res["load_majflt"] = loaded["majflt"]
    if toks:
        res["ttft_s"] = round(toks[0]["t"] - t_spawn, 2)
        res["first_token_s"] = round(toks[0]["dt"], 3)
    meas = toks[warmup:warmup + n]
    if len(meas) == n and n > 0:
        dts = [r["dt"] for r in meas]
        base = toks[warmup - 1] if warmup > 0 else loaded
        res.update(tok_s_median=round(1 / statistics.median(dts), 3), tok_s_min=round(1 / max(dts), 3),
                   tok_s_mean=round(n / sum(dts), 3),
                   majflt_per_tok=round((meas[-1]["majflt"] - base["majflt"]) / n, 1),
                   warmup_tok_s=[round(1 / r["dt"], 3) for r in toks[:warmup]])
        if "io" in meas[-1] and "io" in (base or {}):
            res.update(disk_figures(base["io"], meas[-1]["io"], sum(dts), n))
        elif _read_bytes(meas[-1]) is not None and _read_bytes(base or {}) is not None:  # llama.cpp's harness
            res.update(read_bytes_per_tok=round((_read_bytes(meas[-1]) - _read_bytes(base)) / n),
                       disk_GBps_decode=(_read_bytes(meas[-1]) - _read_bytes(base)) / sum(dts) / GB)
        if meas[-1].get("disk_ms", -1) >= 0 and (base or {}).get("disk_ms", -1) >= 0:
            res["disk_busy_pct"] = round(100 * (meas[-1]["disk_ms"] - base["disk_ms"]) / 1e3
                                         / (meas[-1]["t"] - base["t"]), 1)
        if "experts_s" in meas[0]:
            res["experts_ms_median"] = round(1e3 * statistics.median(r["experts_s"] for r in meas), 1)
            res["ms_median"] = round(1e3 * statistics.median(dts), 1)
    routing_rows = next((r for r in rows if r.get("event") == "routing"), None)
    if routing_rows:
        c = np.array(routing_rows["counts"], dtype=np.float64)
        c = c[c.sum(1) > 0]  # layers that ran (--layers)
        s = np.sort(c, axis=1)[:, ::-1]
        tot = s.sum(axis=1, keepdims=True)
        res["routing_share_top8"] = round(float((s[:, :8].sum(1) / tot[:, 0]).mean()), 3)
        res["routing_share_top32"] = round(float((s[:, :32].sum(1) / tot[:, 0]).mean()), 3)
        res["experts_touched_per_layer"] = round(float((c > 0).sum(1).mean()), 1)
    if rc != 0 or not toks:
        res["error"] = (err or "")[-1500:]
    return res


def _read_bytes(row: dict):
    """A child's row's cumulative read_bytes (/proc/self/io): decode_ours' under ``io``, llama_decode's at the top."""
    return row.get("read_bytes", (row.get("io") or {}).get("read_bytes"))


def disk_figures(before: dict, after: dict, decode_s: float, n: int) -> dict:
    """The measured tokens' disk figures from two cumulative ``io`` rows of decode_ours: bytes read per token,
    the disk rate while the layers waited on it (residency: bytes / seconds of forwards with misses) and over
    the decode, the routed experts' hit rate and the next-layer predictor's recall (None where not counted)."""
    d = {k: after[k] - before[k] for k in before}
    routed = d["hits"] + d["misses"]
    return dict(read_bytes_per_tok=round(d["read_bytes"] / n), disk_GBps_decode=d["read_bytes"] / decode_s / GB,
                disk_GBps_waiting=d["wait_bytes"] / d["wait_s"] / GB if d["wait_s"] else None,
                hit_rate=d["hits"] / routed if routed else None,
                recall=d["found"] / d["routed"] if d["routed"] else None)


def limit_bytes(limit: str, model_bytes: int = 0):
    """None for "none"; GiB for a number; "1/3": that fraction of the model's bytes on disk."""
    if limit == "none":
        return None
    if "/" in limit:
        num, den = limit.split("/")
        return int(model_bytes * float(num) / float(den))
    return int(float(limit) * C.GIB)


def prepare_cache(paths, mode: str) -> dict:
    """The page cache before a run: "cold" drops it (sync + drop_caches); "warm" drops it too, then reads the
    model's files whole (the host's reclaim drops unmapped file pages idle for ~1 min, so this is done right before
    each run). Returns the state: the mode, GB cached and free after it, the model's cached share, read seconds."""
    C.drop_caches()
    state = dict(mode=mode)
    if mode == "warm":
        state["read_s"] = round(sum(C.read_whole(p) for p in paths), 1)
    state.update(C.page_cache_state())
    state["model_cached"] = round(sum(C.cached_fraction(p) * os.path.getsize(p) for p in paths)
                                  / max(1, sum(os.path.getsize(p) for p in paths)), 3)
    return state


def run_one(system, routing, limit, model_path, harness, args):
    toks = C.tokens_for(C.SEED + 7, args.warmup + args.tokens)
    env = C.child_env(args.threads, args.omp_wait_policy)
    if system.startswith("ours"):
        argv = [sys.executable, "-m", "benchmarks.model.scale.decode_ours", model_path, routing, str(args.threads), toks]
        env.update(KTMOE_SCALE_DTYPE=args.ours_dtype,
                   KTMOE_SCALE_PREFETCH="off" if system.endswith("noprefetch") else "auto",
                   KTMOE_SCALE_NEXT_LAYER="auto" if system.endswith("nextlayer") else "off",
                   KTMOE_SCALE_K_PRIME=str(args.k_prime), KTMOE_SCALE_NEXT_SOURCE=args.next_layer_source,
                   KTMOE_SCALE_READER_THREADS=str(args.reader_threads))
    else:
        argv = models.llama_argv(harness, model_path, routing, args.threads, toks,
                                 no_repack=system == "llama-norepack")  # (sets the routing: before the cache)
    paths = models.files("ours" if os.path.isdir(model_path) else "llama", model_path)
    model_bytes = sum(os.path.getsize(p) for p in paths)
    page_cache = prepare_cache(paths, args.page_cache)
    t_spawn = time.time()
    rc, out, err, wall, stats = C.run_limited(argv, limit_bytes(limit, model_bytes), f"bench_scale_{system}",
                                              args.timeout, env=env, cwd=ROOT)
    res = summarize(system, routing, limit, rc, out, err, wall, stats, t_spawn, args.warmup, args.tokens)
    res["page_cache"] = page_cache
    if limit_bytes(limit, model_bytes) is not None:
        res["limit_gib"] = round(limit_bytes(limit, model_bytes) / C.GIB, 2)
    log(json.dumps({k: v for k, v in res.items() if k not in ("error",)}))
    if "error" in res:
        log("  error:", res["error"][-600:])
    return res


def run_anon(limit, args):
    """Anonymous experts (no mmap_experts_dir) under a memory limit: pack layers until the OOM killer."""
    C.drop_caches()
    t_spawn = time.time()
    argv = [sys.executable, "-m", "benchmarks.model.scale.decode_ours", "--anon-pack", str(args.layers),
            str(args.threads), ""]
    rc, out, err, wall, stats = C.run_limited(argv, limit_bytes(limit), "bench_scale_anon", args.timeout,
                                              env={"PYTHONPATH": ROOT}, cwd=ROOT)
    rows = [r for r in C.parse_lines(out) if r.get("event") == "anon_layer"]
    res = dict(system="ours-anonymous", limit=limit, rc=rc, wall_s=round(wall, 1), layers_packed=len(rows),
               packed_gb=round(rows[-1]["packed_bytes"] / GB, 2) if rows else 0, cgroup=stats,
               load_avg=C.loadavg(), stderr_tail=(err or "")[-400:])
    res["outcome"] = ("OOM-killed (SIGKILL)" if rc == -9 else f"exit {rc}" +
                      (" MemoryError" if "MemoryError" in (err or "") else ""))
    log(json.dumps({k: v for k, v in res.items() if k != "stderr_tail"}))
    return res


def _pct(rate, roof) -> str:
    """GB/s (% of the roof's best rate, % of its random expert-sized runs' rate)."""
    if rate is None:
        return "-"
    r = disk_rates(rate * 1e9, 1.0, roof)
    shares = [f"{r[k]:.0f} %" for k in ("pct_of_roof", "pct_of_runs") if r[k] is not None]
    return f"{rate:.2f} ({', '.join(shares)})" if shares else f"{rate:.2f}"


def _opt(v, f) -> str:
    return "-" if v is None else format(v, f)


NAMES = {"ours": "torch_ktmoe int8, packed dir", "llama": "llama.cpp q8_0, mmap",
         "ours-noprefetch": "torch_ktmoe int8, packed dir, prefetch=False",
         "ours-nextlayer": "torch_ktmoe int8, packed dir, next-layer prefetch"}
GGUF_NAMES = {"ours-gguf": "torch_ktmoe, GGUF experts in place",
              "ours-gguf-nextlayer": "torch_ktmoe, GGUF experts in place, next-layer prefetch",
              "ours-gguf-noprefetch": "torch_ktmoe, GGUF experts in place, prefetch=False",
              "llama": "llama.cpp, mmap (repack on: its default)", "llama-norepack": "llama.cpp, mmap, --no-repack"}


def roof_key(system: str, gguf: bool) -> str:
    """Which model's disk roof a system's row is measured against (--gguf: the one file for all)."""
    return "gguf" if gguf else ("ours" if system.startswith("ours") else system)


def fmt_table(results, roofs=None, gguf: bool = False) -> str:
    """The runs' table; ``roofs``: {model: disk_roof()} measured over each model's files in the same run. Bytes read
    per token: /proc/self/io of the decoding process (both systems); disk busy: the device's io_ticks over the
    measured tokens' wall time (anything else on the disk counts too)."""
    roofs = roofs or {}
    names = {**NAMES, **GGUF_NAMES} if gguf else NAMES
    lines = ["| system | routing | memory limit | page cache | tok/s median | tok/s min | major faults/token | "
             "load s | time to first token | disk GB/s while waiting (% of best, of random runs) | "
             "disk GB/s over decode (same) | MB read / token | disk busy | hit rate | recall | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["system"] == "ours-anonymous":
            continue
        name = names.get(r["system"], r["system"])
        lim = "none" if r["limit"] == "none" else (f"{r['limit']} ({r['limit_gib']:.2f} GiB)" if "/" in r["limit"]
                                                   else f"{r['limit']} GiB")
        cache = (r.get("page_cache") or {}).get("mode", "cold")
        if "tok_s_median" in r:
            roof = roofs.get(roof_key(r["system"], gguf))
            mb = r.get("read_bytes_per_tok")
            busy = r.get("disk_busy_pct")
            lines.append(f"| {name} | {r['routing']} | {lim} | {cache} | {r['tok_s_median']:.2f} | "
                         f"{r['tok_s_min']:.2f} | "
                         f"{r['majflt_per_tok']:.0f} | {_opt(r.get('load_s'), '.2f')} | "
                         f"{r.get('ttft_s', float('nan')):.1f} s | "
                         f"{_pct(r.get('disk_GBps_waiting'), roof)} | {_pct(r.get('disk_GBps_decode'), roof)} | "
                         f"{_opt(None if mb is None else mb / 1e6, '.0f')} | "
                         f"{'-' if busy is None else f'{busy:.0f} %'} | {_opt(r.get('hit_rate'), '.2f')} | "
                         f"{_opt(r.get('recall'), '.2f')} | {r['load_avg']:.1f} |")
        else:
            oom = re.search(r"^oom_kill (\d+)", (r.get("cgroup") or {}).get("memory.oom_control", ""), re.M)
            why = "OOM-killed" if r["rc"] == -9 or (oom and int(oom.group(1)) > 0) else f"rc {r['rc']}"
            lines.append(f"| {name} | {r['routing']} | {lim} | {cache} | failed ({why}) | | | "
                         f"{_opt(r.get('load_s'), '.2f')} | | | | | | | | {r['load_avg']:.1f} |")
    anon = [r for r in results if r["system"] == "ours-anonymous"]
    if anon:
        lines += ["", "| anonymous experts (no mmap_experts_dir) | memory limit | outcome | after | packed before |",
                  "|---|---|---|---|---|"]
        for r in anon:
            lines.append(f"| torch_ktmoe int8 | {r['limit']} GiB | {r['outcome']} | {r['wall_s']:.0f} s | "
                         f"{r['layers_packed']} layers, {r['packed_gb']:.1f} GB |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=C.DATA, help="where the big files go (outside the repo)")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=C.LAYERS, help="fewer layers: a quick smoke run")
    ap.add_argument("--limits", default="none,16,12", help="GiB, comma separated; 'none' = no cgroup")
    ap.add_argument("--routings", default="uniform,zipf")
    ap.add_argument("--systems", default="ours-nextlayer,ours,llama",
                    help="ours-nextlayer (KTMoE's defaults: prefetch='auto', next_layer_prefetch='auto'), ours "
                         "(next_layer_prefetch=False), ours-noprefetch (both off), llama")
    ap.add_argument("--reader-threads", type=int, default=-1, help="ours: the reader pool's threads (-1: its "
                    "default; 0: next-layer reads become MADV_WILLNEED from the compute thread)")
    ap.add_argument("--k-prime", type=int, default=0,
                    help="ours-nextlayer: experts predicted per token (0: the predictor's default, k)")
    ap.add_argument("--next-layer-source", default="experts", choices=("experts", "layer"),
                    help="ours-nextlayer: predict from the experts' input (default) or the decoder layer's input")
    ap.add_argument("--ours-dtype", default="bfloat16", help="dtype of ours' non-expert weights")
    ap.add_argument("--omp-wait-policy", default="passive",
                    help="OMP_WAIT_POLICY of both systems (both use OpenMP; on a shared, loaded 2-core host "
                         "spinning threads cost 10-100x: 'passive'; '' leaves the default)")
    ap.add_argument("--anon-limits", default="12", help="limits for the anonymous-mode demo ('' to skip)")
    ap.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    ap.add_argument("--rounds", type=int, default=1, help="--gguf: rounds over every configuration (alternated)")
    ap.add_argument("--roof-gib", type=float, default=2.0,
                    help="bytes the disk roof reads per pattern over each model's files (0: no roof)")
    ap.add_argument("--keep", action="store_true", help="keep the generated models")
    ap.add_argument("--gguf", default=None, help="an existing GGUF (e.g. a Q4_K_M from llama-quantize) that every "
                    "system decodes (systems ours-gguf, ours-gguf-nextlayer, ours-gguf-noprefetch, llama, "
                    "llama-norepack); nothing is generated or deleted; its token_embd must be BF16 (the routing is "
                    "written into it)")
    ap.add_argument("--page-cache", default="cold", choices=("cold", "warm"),
                    help="before each run: drop the page cache (cold), or drop it and read the model whole (warm)")
    ap.add_argument("--reuse", action="store_true", help="reuse models already in --data")
    add_out_argument(ap, "bench_scale")
    args = ap.parse_args(argv)
    from ktmoe_harness.memcg import memory_cgroup_available

    if not memory_cgroup_available():
        sys.exit("bench_scale: needs root and cgroup-v1 memory controller (drop_caches, memory limits)")
    systems = [s for s in args.systems.split(",") if s]
    limits = [s for s in args.limits.split(",") if s]
    routings = [s for s in args.routings.split(",") if s]
    if args.gguf:
        return main_gguf(args, systems, limits, routings)
    os.makedirs(args.data, exist_ok=True)
    sizes = models.expected_sizes(args.layers)
    path = {s: models.model_path(args.data, s, args.layers) for s in models.SYSTEMS}
    base = lambda s: "ours" if s.startswith("ours") else s  # noqa: E731
    bases = list(dict.fromkeys(base(s) for s in systems))
    have = {s: args.reuse and models.is_complete(s, path[s], args.layers) for s in models.SYSTEMS}
    free = C.free_disk(args.data)
    margin = 2 * 10**9
    need = {s: (0 if have[s] else sizes[s]) for s in bases}
    together = sum(need.values()) + margin <= free
    # sequentially, a reused model is deleted before the next one is generated (unless --keep)
    freed = 0 if args.keep else sum(models.disk_bytes(b, path[b]) for b in bases if have[b])
    if max(need.values(), default=0) + margin > free + freed:
        sys.exit(f"bench_scale: {args.data} has {free / GB:.1f} GB free; the models need "
                 + ", ".join(f"{s} {sizes[s] / GB:.1f} GB" for s in bases)
                 + f" (one at a time, + {margin / GB:.0f} GB margin). Free space or pass --data elsewhere.")
    log(f"disk: {free / GB:.1f} GB free in {args.data}; models "
        + ", ".join(f"{s} ~{sizes[s] / GB:.1f} GB" for s in bases)
        + (": both fit, alternating systems" if together else ": not together, one system after the other"))
    harness = models.build_llama(args.data) if "llama" in bases else None
    results, gen, roofs = [], {}, {}

    def generate(system):
        if not have[system]:
            log(f"generating {system} model ...")
            gen[system] = models.generate(system, path[system], args.layers)
            log(json.dumps(gen[system]))
            have[system] = True
        if args.roof_gib > 0 and system not in roofs:  # the disk's best rate over these files, in this run
            roofs[system] = disk_roof(models.files(system, path[system]), int(args.roof_gib * C.GIB),
                                      drop=lambda paths: C.drop_caches())
            log(f"{system}: {roof_line(roofs[system])}")

    def delete(system):
        if args.keep:
            return
        models.delete(system, path[system])
        have[system] = False

    try:
        if together:
            for b in bases:
                generate(b)
            for routing in routings:
                for limit in limits:
                    for s in systems:
                        results.append(run_one(s, routing, limit, path[base(s)], harness, args))
            if "ours" in bases:
                for lim in [x for x in args.anon_limits.split(",") if x]:
                    results.append(run_anon(lim, args))
        else:
            for b in bases:
                generate(b)
                for routing in routings:
                    for limit in limits:
                        for s in systems:
                            if base(s) == b:
                                results.append(run_one(s, routing, limit, path[b], harness, args))
                if b == "ours":
                    for lim in [x for x in args.anon_limits.split(",") if x]:
                        results.append(run_anon(lim, args))
                if b != bases[-1]:
                    if args.keep and C.free_disk(args.data) < sizes[bases[-1]] + margin:
                        log(f"--keep: not enough disk left for the next model; deleting {b}'s anyway")
                        args_keep, args.keep = args.keep, False
                        delete(b)
                        args.keep = args_keep
                    else:
                        delete(b)
    finally:
        if not args.keep:
            for b in bases:
                delete(b)
    write_result(args.out, dict(args=vars(args), generation=gen, results=results, sizes=sizes, disk_roofs=roofs))
    for system, roof in roofs.items():
        print(f"{system}: {roof_line(roof)}")
    print(fmt_table(results, roofs))
    for s, g in gen.items():
        print(f"generated {s}: {g['total_bytes'] / GB:.1f} GB in {g['seconds']:.0f} s ({g['MBps']:.0f} MB/s, "
              f"load {g['load_avg']:.1f})")


def main_gguf(args, systems, limits, routings):
    """--gguf FILE: every system decodes that one file, alternated per configuration (routing, limit)."""
    from torch_ktmoe.checkpoint.gguf import expert_layers, open_gguf

    bad = [s for s in systems if s not in GGUF_NAMES]
    if bad:
        sys.exit(f"bench_scale --gguf: systems are {', '.join(GGUF_NAMES)}; got {', '.join(bad)}")
    path = os.path.abspath(args.gguf)
    g = open_gguf(path)
    experts = sum(layer.nbytes for layer in expert_layers(g))
    info = dict(file=path, bytes=os.path.getsize(path), experts_bytes=experts, layers=len(expert_layers(g)))
    log(json.dumps(info))
    harness = models.build_llama(args.data) if any(s.startswith("llama") for s in systems) else None
    roofs = {}
    if args.roof_gib > 0:
        roofs["gguf"] = disk_roof([path], int(args.roof_gib * C.GIB), drop=lambda paths: C.drop_caches())
        log(f"gguf: {roof_line(roofs['gguf'])}")
    results = []
    for _ in range(args.rounds):
        for routing in routings:
            for limit in limits:
                for s in systems:  # alternated
                    results.append(run_one(s, routing, limit, path, harness, args))
    write_result(args.out, dict(args=vars(args), gguf=info, results=results, disk_roofs=roofs))
    if roofs:
        print(f"gguf: {roof_line(roofs['gguf'])}")
    print(fmt_table(results, roofs, gguf=True))
    print(f"{path}: {info['bytes'] / GB:.2f} GB, {info['layers']} layers, experts {experts / GB:.2f} GB")


if __name__ == "__main__":
    main()
