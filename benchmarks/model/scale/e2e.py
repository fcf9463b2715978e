"""The whole 30B-class model end to end: ours eager, ours compiled and llama.cpp, cold and steady.

    python -m benchmarks.model.bench_e2e --model scale16 [--routings uniform,zipf] [--rounds 1] [--first 16]
        [--warmup 64] [--steady 32] [--profile-tokens 8] [--threads 2] [--omp-wait-policy ''] [--data /work/scale_data]
        [--regenerate] [--delete]

The model is bench_scale's (benchmarks/model/scale/common.py: Qwen3-30B-A3B's shape, N layers from
``--model scaleN``, random seeded weights; 16 layers: 10.4 GB of int8 experts, which fit in RAM),
as a packed directory for ours and a q8_0 GGUF for llama.cpp (models.py). Both files are kept under
--data and reused by later runs (--regenerate writes them again, --delete removes them at the end).

Every run is a fresh process after ``sync`` + dropping the page cache, 2 threads, the same seeded
tokens (a prompt of --prompt-tokens, then one token at a time, each forced to the next of the
sequence so both systems decode the same inputs). Configurations alternate: for each routing, for
each round, eager -> compiled -> llama.cpp:
  * ours, eager: decode_generate.py, ``model.generate`` with transformers' defaults;
  * ours, compiled: the same after ``hf.compile_decode`` (static cache of the run's length, decode
    step compiled with fullgraph=True). A priming run first compiles the same graph once, so the
    timed runs load it from the inductor's on-disk cache, as a restarted server does; the priming
    run's compile time is printed. The graphs compiled per run are counted (1: no recompiles);
  * llama.cpp: libllama with its default mmap (llama_decode.cpp).
Reported per run: when the model was loaded and the first token came (from process start, cold
page cache), the next --first tokens' tok/s and major faults (compiled: after its compiling step,
whose time is shown), then after --warmup more tokens the last --steady tokens' tok/s median and
min and major faults (none: the page cache is warm), and for ours per token the time inside the
experts op (``ktmoe::moe_forward``, summed by torch.profiler over --profile-tokens more forwards)
against the rest (the steady median minus it). Plus the time to read the non-expert weights at the
read roof measured in the same run (benchmarks/baselines/roofs.py), against that rest. One markdown table,
the issue's targets, and JSON (--out, default benchmarks/results/bench_e2e_scaleN.json). Needs root (drop_caches).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import ROOT
from benchmarks.cli import add_out_argument, write_result
from benchmarks.model.scale import common as C
from benchmarks.model.scale import e2e_report as R
from benchmarks.model.scale import models

SYSTEMS = ("eager", "compiled", "llama")
ROUTINGS = ("uniform", "zipf")
LLAMA_CTX = 512  # llama_decode.cpp's context


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def layers_of(model: str) -> int:
    """``scaleN`` -> N (``scale``: 16)."""
    if not model.startswith("scale") or not (model[5:].isdigit() or model == "scale") or model[5:] == "0":
        raise ValueError(f"--model must be 'tiny' or 'scaleN' (N layers of the 30B-class model), got {model!r}")
    return int(model[5:] or 16)


def _names(kind: str, allowed: tuple):
    def parse(text: str) -> list:
        names = [s for s in text.split(",") if s]
        bad = [s for s in names if s not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{kind} must be a comma-separated subset of {','.join(allowed)}, "
                                             f"got {text!r}")
        return names
    return parse


def parse_args(argv, layers: int):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.model.bench_e2e --model scaleN",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=C.DATA, help="where the model files are kept (outside the repo)")
    ap.add_argument("--systems", type=_names("--systems", SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--routings", type=_names("--routings", ROUTINGS), default=list(ROUTINGS))
    ap.add_argument("--rounds", type=int, default=1, help="runs of each configuration (alternating)")
    ap.add_argument("--prompt-tokens", type=int, default=1)
    ap.add_argument("--first", type=int, default=16, help="tokens in the cold window after the first token")
    ap.add_argument("--warmup", type=int, default=64, help="tokens between the cold and the steady window")
    ap.add_argument("--steady", type=int, default=32, help="tokens in the steady window")
    ap.add_argument("--profile-tokens", type=int, default=8, help="forwards profiled for experts vs rest (0: none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--omp-wait-policy", default="", help="both systems' OMP_WAIT_POLICY ('' leaves the "
                    "default, as users run them; 'passive' costs ours ~25 ms a token on a 2-core VM: dozens of "
                    "parallel regions a token, each waking sleeping threads)")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled runs")
    ap.add_argument("--no-prime", action="store_true", help="skip the compile priming run")
    ap.add_argument("--regenerate", action="store_true", help="write the model files even if whole ones exist")
    ap.add_argument("--delete", action="store_true", help="delete the model files at the end")
    ap.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    add_out_argument(ap, f"bench_e2e_scale{layers}")
    args = ap.parse_args(argv)
    for name in ("rounds", "prompt_tokens", "first", "steady", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.profile_tokens < 0:
        ap.error("--warmup and --profile-tokens cannot be negative")
    args.layers = layers
    args.new_tokens = 2 + args.first + args.warmup + args.steady  # token 0, the compiling step, the windows
    if args.prompt_tokens + args.new_tokens > LLAMA_CTX:
        ap.error(f"prompt + new tokens ({args.prompt_tokens} + {args.new_tokens}) exceed llama_decode's "
                 f"context of {LLAMA_CTX}")
    if args.profile_tokens >= args.prompt_tokens + args.new_tokens:
        ap.error(f"--profile-tokens must be below {args.prompt_tokens + args.new_tokens}")
    return args


def ours_argv(path, routing, tokens, mode, args, profile):
    return [sys.executable, "-m", "benchmarks.model.scale.decode_generate", path, routing, tokens, "--mode", mode,
            "--threads", str(args.threads), "--prompt", str(args.prompt_tokens), "--profile", str(profile),
            "--cache-len", str(args.prompt_tokens + args.new_tokens), "--backend", args.backend]


def spawn(system, routing, path, harness, tokens, args, cold=True, profile=None):
    """One fresh process of `system` decoding `tokens` (after dropping the page cache when `cold`):
    (its JSON lines, {t_spawn, rc, wall_s, load_avg, page_cache, stderr tail when it failed})."""
    env = C.child_env(args.threads, args.omp_wait_policy)
    if system == "llama":  # the last token is only generate's last output on our side: never fed
        argv = models.llama_argv(harness, path, routing, args.threads, ",".join(tokens.split(",")[:-1]),
                                 args.prompt_tokens)
    else:
        argv = ours_argv(path, routing, tokens, system, args, args.profile_tokens if profile is None else profile)
    if cold:
        C.drop_caches()
    meta = dict(load_avg=C.loadavg(), page_cache=C.page_cache_state(), t_spawn=time.time())
    rc, out, err, wall, _ = C.run_limited(argv, None, f"bench_e2e_{system}", args.timeout, env=env, cwd=ROOT)
    meta.update(rc=rc, wall_s=round(wall, 1))
    if rc != 0:
        meta["error"] = f"rc {rc}: " + (err or "")[-1500:]
    return C.parse_lines(out), meta


def timed_run(system, routing, path, harness, tokens, args) -> dict:
    rows, meta = spawn(system, routing, path, harness, tokens, args)
    res = R.summarize_run(system, routing, rows, meta.pop("t_spawn"), args.first, args.steady)
    res.update(meta)
    log(json.dumps({k: v for k, v in res.items() if k != "error"}))
    if "error" in res:
        log("  error:", res["error"][-800:])
    return res


def prime_compile(path, tokens, args) -> dict:
    """A short compiled run (page cache as it is) that compiles the timed runs' decode graph into the
    inductor's on-disk cache: its compiling step's seconds and graph counts."""
    short = ",".join(tokens.split(",")[:args.prompt_tokens + 3])
    rows, meta = spawn("compiled", args.routings[0], path, None, short, args, cold=False, profile=0)
    toks = [r for r in rows if "i" in r]
    compiled = next((r for r in rows if r.get("event") == "compile"), {})
    res = dict(compile_step_s=round(toks[1]["dt"], 1) if len(toks) > 1 else None, rc=meta["rc"],
               wall_s=meta["wall_s"], graphs=compiled.get("graphs"), graph_breaks=compiled.get("graph_breaks"))
    if "error" in meta:
        res["error"] = meta["error"]
    log(json.dumps(res))
    return res


def ensure_models(args, bases) -> tuple[dict, dict]:
    """({system: path}, {system: generation report}) with whole model files for `bases`."""
    path = {b: models.model_path(args.data, b, args.layers) for b in bases}
    sizes = models.expected_sizes(args.layers)
    todo = [b for b in bases if args.regenerate or not models.is_complete(b, path[b], args.layers)]
    free = C.free_disk(args.data) + sum(models.disk_bytes(b, path[b]) for b in todo)
    need = sum(sizes[b] for b in todo) + 2 * 10**9
    if need > free:
        sys.exit(f"bench_e2e: {args.data} has {free / 1e9:.1f} GB free (counting files it would replace); "
                 f"the models need {need / 1e9:.1f} GB with a 2 GB margin. Free space or pass --data elsewhere.")
    gen = {}
    for b in todo:
        log(f"generating {b}'s model ({args.layers} layers, ~{sizes[b] / 1e9:.1f} GB) at {path[b]} ...")
        gen[b] = models.generate(b, path[b], args.layers)
        log(json.dumps(gen[b]))
    for b in bases:
        if b not in gen:
            log(f"reusing {path[b]} ({models.disk_bytes(b, path[b]) / 1e9:.1f} GB)")
    return path, gen


def main(argv, layers: int):
    args = parse_args(argv, layers)
    if os.geteuid() != 0:
        sys.exit("bench_e2e --model scaleN: needs root (it drops the page cache before each run)")
    t_start = time.time()
    uptime_start = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    log(f"start: {uptime_start}")
    bases = list(dict.fromkeys("llama" if s == "llama" else "ours" for s in args.systems))
    os.makedirs(args.data, exist_ok=True)
    path, gen = ensure_models(args, bases)
    harness = models.build_llama(args.data) if "llama" in bases else None
    t_runs = time.time()

    from benchmarks.baselines import roofs

    roof = roofs.read_roof_gbps(args.threads)
    roofs._buffer.cache_clear()
    ne = C.nonexpert_read_bytes(args.layers)
    read_ms = ne["total"] / (roof * 1e9) * 1e3
    tokens = C.tokens_for(C.SEED + 11, args.prompt_tokens + args.new_tokens)
    prime = None
    if "compiled" in args.systems and not args.no_prime:
        log("priming the compiled decode graph (a short compiled run, page cache not dropped) ...")
        prime = prime_compile(path["ours"], tokens, args)
    results = []
    for routing in args.routings:
        for _ in range(args.rounds):
            for system in args.systems:
                results.append(timed_run(system, routing, path["llama" if system == "llama" else "ours"],
                                         harness, tokens, args))
    t_end = time.time()
    uptime_end = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    report = dict(args={k: v for k, v in vars(args).items()}, uptime_start=uptime_start, uptime_end=uptime_end,
                  generation=gen, generation_s=round(t_runs - t_start, 1), runs_s=round(t_end - t_runs, 1),
                  read_roof_gbps=round(roof, 1), nonexpert_read_bytes=ne, nonexpert_read_ms=round(read_ms, 2),
                  prime=prime, results=results)
    write_result(args.out, report)
    if args.delete:
        for b in bases:
            models.delete(b, path[b])
    print(R.fmt_report(report))


if __name__ == "__main__":
    main(sys.argv[1:], 16)
