"""Decode under memory pressure: packed experts twice a memory cgroup's limit.

Run (root, cgroup v1): python -m benchmarks.memory.bench_bigger_than_ram [--limit-mib 400] [--tokens 16] [--rounds 1]

Builds a Qwen3-MoE model (default 17 layers x 48 MiB = 816 MiB of packed bf16
experts), then in one child process per row loads it with
torch_ktmoe.hf.from_pretrained and decodes greedily:
  * file-backed, no limit                  (the reference speed);
  * file-backed, inside a --limit-mib cgroup (experts >= 2x the limit: every
    token refaults evicted experts from disk), with KTMoE's default
    prefetch="auto" (it reads the routed experts ahead: on here) and with
    prefetch=False (one page fault at a time), alternated --rounds times;
  * anonymous, inside the same cgroup       (expected: OOM-killed).
Prints decode tok/s, major page faults per token and whether the tokens match, and the disk figures: MB read
per token (/proc/self/io), the disk rate while the layers waited on it and over the decode as % of the disk roof
(benchmarks/baselines/disk_roof.py over the checkpoint's files, measured first in the same run), the routed
experts' hit rate and the next-layer predictor's recall (torch_ktmoe.residency_report).
"""
import argparse
import json
import os
import shutil
import statistics
import sys

from benchmarks.baselines.disk_roof import disk_rates, disk_roof, roof_line
from ktmoe_harness.checkpoint import checkpoint_for, make_workdir
from ktmoe_harness.child import run_python
from ktmoe_harness.memcg import run_in_memory_cgroup
from ktmoe_harness.options import add_model_arguments

MiB = 1 << 20


def _fmt(v, spec) -> str:
    return "-" if v is None else format(v, spec)


def disk_columns(done: list, roof: dict) -> str:
    """Medians over a row's runs: disk rate while waiting and over the decode (% of the roof), MB read per token,
    hit rate, recall (residency_report; None where not counted: a model that fits)."""
    def med(key):
        vals = [r[key] for r in done if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    waiting = disk_rates(med("wait_bytes") or 0, med("wait_s") or 0, roof)
    overall = disk_rates(med("read_bytes") or 0, med("decode_s") or 0, roof)
    mb = med("read_bytes_per_token")
    return (f"{_fmt(waiting['GBps'], '.2f')} ({_fmt(waiting['pct_of_roof'], '.0f')} %) | "
            f"{_fmt(overall['GBps'], '.2f')} ({_fmt(overall['pct_of_roof'], '.0f')} %) | "
            f"{_fmt(None if mb is None else mb / 1e6, '.0f')} | {_fmt(med('hit_rate'), '.2f')} | "
            f"{_fmt(med('recall'), '.2f')}")

CHILD = r"""
import json, resource, sys, time, torch
import torch_ktmoe
from torch_ktmoe import hf
from torch_ktmoe.residency.counters import process_read_bytes
from ktmoe_harness.generate import generate
checkpoint, experts_dir, tokens, out, prefetch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
torch.set_num_threads(2)
model = hf.from_pretrained(checkpoint, mmap_experts_dir=experts_dir or None, dtype=torch.bfloat16,
                           progress=False, cache="off", ktmoe_kwargs={"prefetch": "auto" if prefetch == "auto" else False})
prompt = torch.tensor([[3, 17, 42, 8, 99]])
generate(model, prompt, 2, progress=False)                    # warm-up
torch_ktmoe.residency_report(model, reset=True)
f0, r0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt, process_read_bytes()
out_tokens, _, _, decode_s = generate(model, prompt, tokens, progress=False)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - f0
res = torch_ktmoe.residency_report(model)
json.dump({"tok_s": (tokens - 1) / decode_s, "major_faults_per_token": faults / tokens,
           "read_bytes_per_token": (process_read_bytes() - r0) / tokens, "decode_s": decode_s,
           "read_bytes": process_read_bytes() - r0, "wait_bytes": res["read_bytes"], "wait_s": res["read_seconds"],
           "hit_rate": res["hit_rate"], "recall": res["recall"],
           "tokens": out_tokens, "packed": model.ktmoe_report.packed_bytes,
           "prefetching": any(m.prefetching for m in model.modules() if hasattr(m, "prefetching"))}, open(out, "w"))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-mib", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1, help="times the two limited file-backed runs alternate")
    add_model_arguments(ap)
    ap.set_defaults(layers=17, hidden=512, intermediate=256, experts=64, top_k=4, vocab=1024)
    args = ap.parse_args(argv)
    work = make_workdir(args, "ktmoe-btr-")
    env = {"MALLOC_MMAP_THRESHOLD_": str(MiB)}  # freed staging buffers go back to the kernel at once
    try:
        checkpoint = checkpoint_for(args, work)  # outside the cgroup: its page cache is not charged there
        roof = disk_roof([os.path.join(checkpoint, f) for f in sorted(os.listdir(checkpoint))], 1 << 30)
        limited = f"{args.limit_mib} MiB limit"
        runs = [("file-backed, no limit", "experts-free", False, "auto")]
        runs += [(f"file-backed, {limited}, prefetch={p}", "experts-limited", True, p)
                 for _ in range(args.rounds) for p in ("auto", "off")]
        runs += [(f"anonymous, {limited}", "", True, "auto")]
        rows = {}
        for i, (name, directory, in_cgroup, prefetch) in enumerate(runs):
            experts_dir = os.path.join(work, directory) if directory else ""
            os.makedirs(experts_dir or work, exist_ok=True)
            out = os.path.join(work, f"run{i}.json")
            child_args = [checkpoint, experts_dir, args.tokens, out, prefetch]
            print(f"[{name}] ...", flush=True)
            if in_cgroup:
                res = run_in_memory_cgroup(f"ktmoe_bench_btr_{i}", args.limit_mib * MiB, CHILD, child_args,
                                           timeout=900, env=env)
            else:
                res = run_python(CHILD, child_args, timeout=900, env=env)
            if res.returncode == 0:
                with open(out) as f:
                    rows.setdefault(name, []).append(json.load(f))
            else:
                rows.setdefault(name, []).append({"returncode": res.returncode, "stderr": res.stderr[-500:]})
        ref = next(iter(rows.values()))[0]
        print(f"\n{ref.get('packed', 0) / MiB:.0f} MiB of packed bf16 experts, limit {args.limit_mib} MiB "
              f"({ref.get('packed', 0) / (args.limit_mib * MiB):.2f}x), {args.tokens} tokens, 2 threads, "
              f"{args.rounds} round(s)\n")
        print(roof_line(roof) + "  (over the checkpoint's files: the experts' files are unnamed, cache='off')\n")
        print("| run | reads ahead | decode tok/s (median / min) | major faults / token | same tokens | "
              "disk GB/s while waiting (% of roof) | disk GB/s over decode (% of roof) | MB read / token | "
              "hit rate | recall |")
        print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for name, results in rows.items():
            done = [r for r in results if "tok_s" in r]
            if done:
                tok_s = [r["tok_s"] for r in done]
                faults = statistics.median(r["major_faults_per_token"] for r in done)
                same = all(r["tokens"] == ref.get("tokens") for r in done)
                print(f"| {name} | {any(r['prefetching'] for r in done)} | {statistics.median(tok_s):.2f} / "
                      f"{min(tok_s):.2f} | {faults:.1f} | {same} | {disk_columns(done, roof)} |")
            for r in results:
                if "tok_s" not in r:
                    killed = " (OOM-killed, as expected)" if r["returncode"] == -9 else ""
                    print(f"| {name} | - | rc {r['returncode']}{killed} | - | - | - | - | - | - | - |")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
