"""Memory benchmark: file-backed vs anonymous experts on one Qwen3-MoE-shaped model.

Run: python -m benchmarks.memory.bench_memory [--layers 8 --hidden 1024 --intermediate 512 --experts 32 ...]

Builds a random Qwen3-MoE checkpoint (ktmoe_harness's builder and flags; the
default packs ~768 MiB of bf16 experts), then loads it with
torch_ktmoe.hf.from_pretrained in one child process per mode (anonymous, file)
so each mode's memory figures are its own, and prints in one table:

* steady decode tok/s, file-backed / anonymous (target >= 0.99);
* anonymous RSS growth across the load (transformers already imported), as %
  of the packed expert bytes (target for file-backed: <= 2 %), also after
  malloc_trim(0): glibc keeps freed dense staging buffers in its heap;
* first forward after the page cache is dropped / steady forward (file-backed
  only): without warm, after a blocking KTMoE.warm(), and with warm started in
  the background right before the forward (target with warm <= 1.05). The
  experts are made cold with the arenas' evict() (drop_caches alone keeps pages
  this process maps) and, when root, ``echo 1 > /proc/sys/vm/drop_caches`` too
  (it also drops library and checkpoint pages, as a real cold start does);
* time to ready (from_pretrained until the model can run; the modeling module is
  imported before, its import time is shown apart) in a new process with
  a valid persistent packed cache in the experts directory vs the file-backed
  run that streamed and packed the checkpoint into that cache (target >= 10x);
* arena fallbacks (target 0).
Writes benchmarks/results/bench_memory.json (--out).
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks.cli import add_out_argument, write_result
from ktmoe_harness.checkpoint import checkpoint_for, make_workdir
from ktmoe_harness.child import run_child
from ktmoe_harness.generate import generate, load_timed, seeded_prompt
from ktmoe_harness.options import add_model_arguments, add_run_arguments

MiB = 1 << 20
MODES = ("anonymous", "file", "cached")  # child runs: anonymous experts, file-backed (packs the cache), cache hit


def _forward_seconds(model, prompt):
    import torch

    with torch.inference_mode():
        t0 = time.perf_counter()
        model(input_ids=prompt, use_cache=False)
        return time.perf_counter() - t0


def _drop(layers, method):
    """Makes the experts cold: evict() every arena, then (drop_caches) drop the whole page cache.

    evict() is needed either way: drop_caches leaves pages that a process still maps,
    and this process maps every expert slice.
    """
    for layer in layers:
        for arena in layer.arenas:
            arena.evict()
    if method == "drop_caches":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:  # root only ("auto" checks)
            f.write("1")


def run_mode(args) -> int:
    """Child process: load one mode, measure, write a JSON result."""
    import torch

    import torch_ktmoe

    if args.threads:
        torch.set_num_threads(args.threads)
    # file: streams and packs into the (empty) cache dir; cached: a later process that finds it valid
    keep = args.experts_dir is not None
    experts_dir = None if args.mode == "anonymous" else (
        args.experts_dir if keep else tempfile.mkdtemp(prefix="experts-", dir=args.mmap_dir))
    try:
        from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401  (imports outside the growth)

        config = AutoConfig.from_pretrained(args.checkpoint)
        t0 = time.perf_counter()
        AutoModelForCausalLM._model_mapping[type(config)]  # imports the modeling module: not load time
        import_s = time.perf_counter() - t0
        before = torch_ktmoe.memory_report()
        model, load_s = load_timed(args.checkpoint, experts_dir, args.format)
        model.eval()
        after = torch_ktmoe.memory_report()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed dense staging buffers that glibc keeps in its heap
        trimmed = torch_ktmoe.memory_report()
        packed = model.ktmoe_report.packed_bytes
        layers = [m for m in model.modules() if isinstance(m, torch_ktmoe.KTMoE)]
        cache_hits = sum(m.cache_hit for m in layers)
        prompt = seeded_prompt(model.config.vocab_size, args.prompt_tokens)
        if args.mode == "cached":  # time to ready only, and the same tokens
            tokens, _, _, _ = generate(model, prompt, args.tokens, progress=False)
            with open(args.result, "w") as f:
                json.dump({"mode": args.mode, "load_s": load_s, "import_s": import_s, "cache_hits": cache_hits, "layers": len(layers),
                           "arena_fallbacks": after["arena_fallbacks"], "tokens": tokens}, f)
            return 0
        generate(model, prompt, min(4, args.tokens), progress=False)  # warm-up
        tokens, _, _, decode_s = generate(model, prompt, args.tokens, progress=False)
        steady = statistics.median(_forward_seconds(model, prompt) for _ in range(3))
        result = {
            "mode": args.mode, "load_s": load_s, "import_s": import_s, "packed_bytes": packed,
            "decode_tok_s": (args.tokens - 1) / decode_s,
            "anon_rss_before_load": before["anon_rss_bytes"], "anon_rss_after_load": after["anon_rss_bytes"],
            "anon_rss_after_trim": trimmed["anon_rss_bytes"],
            "arena_fallbacks": after["arena_fallbacks"], "steady_forward_s": steady, "tokens": tokens,
            "threads": torch.get_num_threads(), "isa": torch_ktmoe.active_isa(), "cache_hits": cache_hits,
        }
        if args.mode == "file":
            method = args.drop if args.drop != "auto" else ("drop_caches" if os.geteuid() == 0 else "evict")
            result["drop_method"] = method
            cold = {}
            for variant in ("none", "blocking", "background"):
                _drop(layers, method)
                t0 = time.perf_counter()
                if variant != "none":
                    for layer in layers:
                        layer.warm(wait=variant == "blocking")
                warm_s = time.perf_counter() - t0
                r0 = torch_ktmoe.memory_report()  # after a blocking warm: its own faults are not the forward's
                first = _forward_seconds(model, prompt)
                r1 = torch_ktmoe.memory_report()
                for layer in layers:
                    layer.join_warm()
                cold[variant] = {"first_forward_s": first, "warm_s": warm_s,
                                 "major_faults": r1["major_faults"] - r0["major_faults"],
                                 "resident_after": r1["arena_resident_bytes"]}
            result["cold"] = cold
        with open(args.result, "w") as f:
            json.dump(result, f)
    finally:
        if experts_dir and not keep:
            shutil.rmtree(experts_dir, ignore_errors=True)
    return 0


def _table(a, f, cached):
    def growth(r, key="anon_rss_after_load"):
        return (r[key] - r["anon_rss_before_load"]) / r["packed_bytes"] * 100

    rows = [
        ("packed expert bytes", f"{a['packed_bytes'] / MiB:.0f} MiB", f"{f['packed_bytes'] / MiB:.0f} MiB", ""),
        ("load (stream + pack)", f"{a['load_s']:.1f} s", f"{f['load_s']:.1f} s", ""),
        ("steady decode", f"{a['decode_tok_s']:.1f} tok/s", f"{f['decode_tok_s']:.1f} tok/s",
         f"file/anon {f['decode_tok_s'] / a['decode_tok_s']:.3f} (target >= 0.99)"),
        ("anon RSS growth over load", f"{growth(a):.1f} % of packed", f"{growth(f):.1f} % of packed",
         "target file-backed <= 2 %"),
        ("  same, after malloc_trim(0)", f"{growth(a, 'anon_rss_after_trim'):.1f} % of packed",
         f"{growth(f, 'anon_rss_after_trim'):.1f} % of packed", "glibc returns freed staging buffers"),
        ("steady forward (prompt)", f"{a['steady_forward_s'] * 1e3:.0f} ms", f"{f['steady_forward_s'] * 1e3:.0f} ms", ""),
    ]
    for variant, label in (("none", "no warm"), ("blocking", "warm, blocking"), ("background", "warm, background")):
        c = f["cold"][variant]
        ratio = c["first_forward_s"] / f["steady_forward_s"]
        extra = f"; warm took {c['warm_s']:.2f} s" if variant == "blocking" else ""
        rows.append((f"cold first forward / steady, {label}", "-", f"{ratio:.2f}",
                     f"{c['major_faults']} major faults in the forward{extra}"
                     + ("; target <= 1.05" if variant == "blocking" else "")))
    rows += [
        ("time to ready: packing (cold cache dir)", f"{a['load_s']:.2f} s", f"{f['load_s']:.2f} s",
         "from_pretrained: stream + pack (file-backed: + write the cache files)"),
        ("  (model class import, excluded above)", f"{a['import_s']:.2f} s", f"{f['import_s']:.2f} s",
         "Python imports of the modeling module, the same with or without a cache"),
        ("time to ready: valid cache", "-", f"{cached['load_s']:.2f} s",
         f"packing / valid cache {f['load_s'] / cached['load_s']:.1f}x (target >= 10x); "
         f"{cached['cache_hits']}/{cached['layers']} layers hit, same tokens: {cached['tokens'] == f['tokens']}"),
        ("arena fallbacks", a["arena_fallbacks"], f["arena_fallbacks"], "target 0"),
    ]
    out = [f"| {'':40} | {'anonymous':>18} | {'file-backed':>18} | |", f"| {'-' * 40} | {'-' * 17}:| {'-' * 17}:| --- |"]
    out += [f"| {n:40} | {x!s:>18} | {y!s:>18} | {z} |" for n, x, y, z in rows]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_run_arguments(ap, modes=MODES)
    ap.add_argument("--drop", choices=["auto", "drop_caches", "evict"], default="auto",
                    help="how to make the experts cold: evict the arenas, plus drop_caches (auto: when root)")
    ap.add_argument("--experts-dir", help=argparse.SUPPRESS)  # child: kept cache directory
    add_out_argument(ap, "bench_memory")
    args = ap.parse_args(argv)
    if args.mode:
        return run_mode(args)
    work = make_workdir(args, "ktmoe-bench-memory-")
    try:
        checkpoint = checkpoint_for(args, work)
        results = {}
        experts_dir = os.path.join(work, "experts-cache")
        os.makedirs(experts_dir)
        for mode in MODES:
            print(f"[{mode}] loading and measuring ...", flush=True)
            extra = ["--drop", args.drop] + (["--experts-dir", experts_dir] if mode != "anonymous" else [])
            results[mode] = run_child("benchmarks.memory.bench_memory", mode, checkpoint, work, args, extra=extra)
            if results[mode] is None:
                print(f"bench_memory: the {mode} run failed", file=sys.stderr)
                return 1
        a, f, c = results["anonymous"], results["file"], results["cached"]
        print(f"\nweight format {args.format}, ISA {a['isa']}, {a['threads']} threads, {args.prompt_tokens}-token "
              f"prompt, {args.tokens} new tokens, cold start by {f['drop_method']}\n")
        print(_table(a, f, c))
        print(f"\nsame tokens: {a['tokens'] == f['tokens']}")
        write_result(args.out, {"args": {k: v for k, v in vars(args).items() if k not in ("mode", "result")},
                                "results": results})
        return 0 if a["tokens"] == f["tokens"] == c["tokens"] else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
