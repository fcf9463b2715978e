"""MoE layer forward: torch_ktmoe vs the roofs and the peers, measured in one run.

Run:  python -m benchmarks.bench_moe                     (full grid, ~15 min on 2 cores)
      python -m benchmarks.bench_moe --quick             (reference shape, T in {1, 512})
      python -m benchmarks.bench_moe --shapes ref --tokens 1,512 --formats bf16,int8 --threads 2

Per (shape, format, T, threads): median ms of a whole layer (gate+up+down), effective
weight GB/s (bytes of the distinct routed experts, packed, / time), GFLOP/s, and
ratios to the roofs measured in this run with the same thread count:
  * read roof: streaming read of a 512 MiB buffer with 512-bit loads on every thread
    (torch_ktmoe._C.stream_read_gbps; torch.sum underestimates it);
  * matmul roof: dense bf16 torch.matmul [T*k, H] x [H, 3I] (the layer's FLOP count).
Peers, when installed (benchmarks/peers.py says how): kt-kernel 0.7.2 (its C++ MoE
classes, thread counts 1 and 2, best kept) and transformers 5.x experts (eager,
grouped_mm). Writes benchmarks/results/bench_moe.json and prints markdown tables.
"""
import argparse
import json
import os
import statistics
import time

import torch

import torch_ktmoe
from torch_ktmoe import _C, ops

SHAPES = {  # name: (E, k, H, I)
    "ref": (128, 8, 2048, 768),       # one Qwen3-30B-A3B MoE layer
    "e64": (64, 6, 2048, 1408),       # Qwen1.5/2-MoE-like
    "e16big": (16, 8, 7168, 2048),    # few, large experts (DeepSeek-V3 expert size)
}
FORMATS = ("bf16", "int8", "int4")


def median_ms(fn, reps, budget_s):
    fn()  # warm-up
    times, t_end = [], time.perf_counter() + budget_s
    while len(times) < reps and (len(times) < 3 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def routing(tokens, experts, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :top_k].contiguous()
    w = torch.rand(tokens, top_k, generator=g) + 0.1
    return ids, (w / w.sum(1, keepdim=True)).contiguous()


def matmul_roof_gflops(tokens, top_k, hidden, inter, reps):
    a = torch.randn(tokens * top_k, hidden, dtype=torch.bfloat16)
    b = torch.randn(hidden, 3 * inter, dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b), reps, 5.0)
    return 2 * a.shape[0] * hidden * 3 * inter / ms / 1e6


def load_peers(enabled):
    if not enabled:
        return None, {}
    try:
        from benchmarks import peers
    except ImportError as exc:  # pragma: no cover
        print(f"peers unavailable: {exc}")
        return None, {}
    avail = peers.available_peers()
    for name, (ok, detail) in avail.items():
        print(f"  peer {name}: {'yes' if ok else 'no'} ({detail})")
    return peers, avail


def bench_shape(name, args, peers, avail, results):
    experts, top_k, hidden, inter = SHAPES[name]
    g = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(torch.bfloat16)
    down = (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(torch.bfloat16)
    roofs = {}
    for th in args.threads:
        torch.set_num_threads(th)
        roofs[th] = {"read_GBps": _C.stream_read_gbps(512 << 20, 5),
                     "matmul_GFLOPs": {t: matmul_roof_gflops(t, top_k, hidden, inter, args.reps)
                                       for t in args.tokens if t >= 32}}
        print(f"[{name}] {th} thread(s): read roof {roofs[th]['read_GBps']:.1f} GB/s, bf16 matmul roof "
              + ", ".join(f"T={t}: {v:.0f} GFLOP/s" for t, v in roofs[th]["matmul_GFLOPs"].items()), flush=True)
    for fmt in args.formats:
        w13, w2 = ops.pack_experts(gate_up, down, fmt)
        per_expert = w13.shape[1] + w2.shape[1]
        for t in args.tokens:
            ids, w = routing(t, experts, top_k, seed=t)
            x = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
            distinct = int(ids.unique().numel())
            flops = 6 * t * top_k * hidden * inter
            for th in args.threads:
                torch.set_num_threads(th)
                ms = median_ms(lambda: torch.ops.ktmoe.moe_forward(x, ids, w, w13, w2), args.reps, args.budget)
                gbps = distinct * per_expert / ms / 1e6
                row = {"shape": name, "format": fmt, "tokens": t, "threads": th, "ms": ms, "weight_GBps": gbps,
                       "GFLOPs": flops / ms / 1e6, "read_roof_frac": gbps / roofs[th]["read_GBps"]}
                mm = roofs[th]["matmul_GFLOPs"].get(t)
                row["matmul_roof_frac"] = row["GFLOPs"] / mm if mm else None
                results["rows"].append(row)
                print(f"[{name}] {fmt:4} T={t:<5} {th}t  {ms:9.3f} ms  {gbps:6.1f} GB/s "
                      f"({100 * row['read_roof_frac']:5.1f}% read roof)  {row['GFLOPs']:7.1f} GFLOP/s"
                      + (f" ({100 * row['matmul_roof_frac']:.0f}% matmul roof)" if mm else ""), flush=True)
        del w13, w2
    results["roofs"][name] = roofs
    if peers is not None and name == "ref":
        bench_peers(name, args, peers, avail, gate_up, down, results)


def bench_peers(name, args, peers, avail, gate_up, down, results):
    experts, top_k, hidden, inter = SHAPES[name]
    gate, up = gate_up[:, :inter].contiguous(), gate_up[:, inter:].contiguous()
    for fmt in args.formats:
        if not avail.get(f"kt-kernel {fmt}", (False,))[0]:
            continue
        for th in (1, 2):
            torch.set_num_threads(1)  # kt-kernel uses its own pool
            moe = peers.make_ktkernel_moe(fmt, experts, top_k, hidden, inter, th, gate, up, down,
                                          max_len=max(args.tokens))
            try:
                for t in args.tokens:
                    ids, w = routing(t, experts, top_k, seed=t)
                    x = torch.randn(t, hidden).to(torch.bfloat16)
                    ms = median_ms(lambda: moe(x, ids, w), args.reps, args.budget)
                    results["peers"].append({"peer": f"kt-kernel {fmt}", "format": fmt, "tokens": t,
                                             "threads": th, "ms": ms})
                    print(f"[peer] kt-kernel {fmt:4} T={t:<5} {th}t  {ms:9.3f} ms", flush=True)
            finally:
                moe.close()
    if "bf16" in args.formats:
        for impl in ("eager", "grouped_mm"):
            if not avail.get(f"transformers {impl}", (False,))[0]:
                continue
            fwd = peers.make_hf_experts(impl, experts, top_k, hidden, inter, gate_up, down)
            for th in args.threads:
                torch.set_num_threads(th)
                for t in args.tokens:
                    ids, w = routing(t, experts, top_k, seed=t)
                    x = torch.randn(t, hidden).to(torch.bfloat16)
                    ms = median_ms(lambda: fwd(x, ids, w), args.reps, args.budget)
                    results["peers"].append({"peer": f"transformers {impl}", "format": "bf16", "tokens": t,
                                             "threads": th, "ms": ms})
                    print(f"[peer] transformers {impl:10} T={t:<5} {th}t  {ms:9.3f} ms", flush=True)


def summary_table(results):
    """Markdown: per (shape, format, T) our best thread count vs roofs and each peer's best."""
    best = {}
    for r in results["rows"]:
        key = (r["shape"], r["format"], r["tokens"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    peer_best = {}
    for p in results["peers"]:
        key = (p["peer"], p["tokens"])
        if key not in peer_best or p["ms"] < peer_best[key]["ms"]:
            peer_best[key] = p
    peer_names = sorted({p["peer"] for p in results["peers"]})
    header = ["shape", "format", "T", "threads", "ms", "weight GB/s", "% read roof", "GFLOP/s",
              "% bf16 matmul roof"] + [f"{n} (x faster)" for n in peer_names]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for (shape, fmt, t), r in sorted(best.items(), key=lambda kv: (list(SHAPES).index(kv[0][0]),
                                                                   FORMATS.index(kv[0][1]), kv[0][2])):
        cells = []
        for n in peer_names:
            p = peer_best.get((n, t))
            applies = shape == "ref" and p and (p["format"] == fmt)
            cells.append(f"{p['ms']:.2f} ms ({p['ms'] / r['ms']:.2f}x)" if applies else "")
        mm = f"{100 * r['matmul_roof_frac']:.0f}%" if r["matmul_roof_frac"] else ""
        row = [shape, fmt, t, r["threads"], f"{r['ms']:.3f}", f"{r['weight_GBps']:.1f}",
               f"{100 * r['read_roof_frac']:.0f}%", f"{r['GFLOPs']:.0f}", mm] + cells
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="MoE layer forward benchmark (see module docstring)")
    ap.add_argument("--shapes", default="ref,e64,e16big")
    ap.add_argument("--formats", default="bf16,int8,int4")
    ap.add_argument("--tokens", default="1,4,32,512,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--budget", type=float, default=4.0, help="seconds per point after 3 repetitions")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--quick", action="store_true", help="reference shape, T in {1, 512}")
    ap.add_argument("--out", default="benchmarks/results/bench_moe.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.shapes, args.tokens = "ref", "1,512"
    args.shapes = args.shapes.split(",")
    args.formats = args.formats.split(",")
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.threads = [int(t) for t in args.threads.split(",")]
    print(f"torch_ktmoe {torch_ktmoe.__version__}, ISA {torch_ktmoe.active_isa()}, torch {torch.__version__}")
    peers, avail = load_peers(not args.no_peers)
    results = {"isa": torch_ktmoe.active_isa(), "rows": [], "peers": [], "roofs": {}}
    for name in args.shapes:
        bench_shape(name, args, peers, avail, results)
    table = summary_table(results)
    print("\n" + table)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
