"""MoE layer forward: torch_ktmoe vs the roofs and the peers, measured in one run.

Run:  make peers && python -m benchmarks.layer.bench_moe              (full grid)
      python -m benchmarks.layer.bench_moe --quick                    (reference shape, T in {1, 512})
      python -m benchmarks.layer.bench_moe --shapes ref --tokens 1,512 --formats bf16,int8 --threads 1,2

Per (shape, format, T, threads): ms of a whole layer (gate+up+down), median and min over
``--rounds`` rounds of ``--reps`` calls; effective weight GB/s (bytes of the distinct routed
experts, packed, / time); GFLOP/s; ratios to the roofs measured in this run on the same threads:
  * read roof: a streaming read of 512 MiB with the widest loads of this CPU (benchmarks/baselines/roofs.py;
    works on AVX-512 and AVX2 hosts alike);
  * compute roof: the peak rate of the bf16 gemm's multiply instruction (vdpbf16ps on AVX-512
    BF16, 256-bit fp32 FMA on AVX2), 12 independent chains per thread;
  * matmul: dense bf16 torch.matmul [T*k, H] x [H, 3I] (the layer's FLOP count), what torch reaches.
Every call takes the next of 16 routings, so the experts read are cold, as in serving.

llama.cpp (``make peers`` builds its ggml CPU backend and benchmarks/baselines/llama/) runs the same
layer as one ggml graph (mul_mat_id up, gate, swiglu, mul_mat_id down, weights, sum over k) with
cold weights, in ggml's nearest type (llama_layer.GGML_TYPE: q8_0 for int8 and fp8, q4_0 for int4,
q4_K for int4_affine; ``KTMOE_LLAMA_TYPES="int4=q4_K"`` changes one). The ``gguf-*`` formats are GGUF experts
where they lie (``ops.moe_forward_ggml`` over random blocks of a type mix, ktmoe_harness.ggml_rows.GGUF_MIXES:
``gguf-q4_K_M`` is gate / up q4_K, down q6_K), llama.cpp on the same type where its harness has it. It is *alternated*
with ours round by round (A B A B ...), so both see the same machine state; the ratio column is
llama.cpp ms / ours ms (> 1: ours faster), from the medians.
kt-kernel 0.7.2 and transformers 5.x experts (benchmarks/baselines/experts.py) are timed after, if installed.
Writes benchmarks/results/bench_moe.json (--out) and .md beside it, and prints markdown tables.
"""
import argparse
import os
import statistics
import time

import torch

import torch_ktmoe
from benchmarks.baselines import llama_layer
from benchmarks.baselines.roofs import (compute_roof_gflops, compute_roof_instruction, matmul_roof_gflops,
                                        read_roof_gbps, read_roof_isa)
from benchmarks.cli import add_out_argument, write_result
from ktmoe_harness.ggml_rows import GGUF_MIXES, ggml_experts
from ktmoe_harness.moe_inputs import routings
from torch_ktmoe import ops

SHAPES = {  # name: (E, k, H, I)
    "ref": (128, 8, 2048, 768),       # one Qwen3-30B-A3B MoE layer
    "e64": (64, 6, 2048, 1408),       # Qwen1.5/2-MoE-like
    "e16big": (16, 8, 7168, 2048),    # few, large experts (DeepSeek-V3 expert size)
}
FORMATS = ops.WEIGHT_FORMATS + tuple(GGUF_MIXES)  # packed formats, then GGUF experts in place (gguf-*)
ROUTINGS = 16  # distinct routings cycled through per (shape, T)


def time_calls(fn, routes, reps, start):
    """ms of ``reps`` calls fn(ids, w), call i on routes[(start + i) % len(routes)]."""
    times = []
    for i in range(reps):
        ids, w = routes[(start + i) % len(routes)]
        t0 = time.perf_counter()
        fn(ids, w)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def threads_for(tokens, args):
    """The thread counts of a point: --threads-big above T=32 when given, else --threads."""
    return args.threads_big if tokens > 32 and args.threads_big else args.threads


def reps_per_round(tokens, args):
    return args.reps if tokens <= 32 else max(2, args.reps // 5)


def distinct_experts(routes):
    return statistics.mean(int(ids.unique().numel()) for ids, _ in routes)


def bench_shape(name, args, llama_ok, results):
    experts, top_k, hidden, inter = SHAPES[name]
    g = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(torch.bfloat16)
    down = (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(torch.bfloat16)
    roofs = {}
    for th in sorted({th for t in args.tokens for th in threads_for(t, args)}):
        torch.set_num_threads(th)
        roofs[th] = {"read_GBps": read_roof_gbps(th), "compute_GFLOPs": compute_roof_gflops(th),
                     "matmul_GFLOPs": {t: matmul_roof_gflops(t, top_k, hidden, inter, args.reps)
                                       for t in args.tokens if t >= 32 and th in threads_for(t, args)}}
        print(f"[{name}] {th} thread(s): read roof {roofs[th]['read_GBps']:.1f} GB/s (measured again in every "
              f"round of every point), compute roof {roofs[th]['compute_GFLOPs']:.0f} GFLOP/s, bf16 torch.matmul "
              + ", ".join(f"T={t}: {v:.0f} GFLOP/s" for t, v in roofs[th]["matmul_GFLOPs"].items()), flush=True)
    routes = {t: routings(t, experts, top_k, ROUTINGS, seed=t) for t in args.tokens}
    for fmt in args.formats:
        if fmt in GGUF_MIXES:  # random blocks of the mix's types (speed does not depend on the values)
            types = GGUF_MIXES[fmt]
            gguf_rows = ggml_experts(types, experts, hidden, inter)
            per_expert = sum(r[0].numel() for r in gguf_rows)
            forward = lambda x, ids, w: ops.moe_forward_ggml(x, ids, w, *gguf_rows, types)  # noqa: E731
        else:
            w13, w2 = ops.pack_experts(gate_up, down, fmt)
            per_expert = w13.shape[1] + w2.shape[1]
            forward = lambda x, ids, w: torch.ops.ktmoe.moe_forward(x, ids, w, w13, w2)  # noqa: E731
        peer_type = llama_ok and fmt in llama_layer.GGML_TYPE
        llama = llama_layer.GgmlMoeLayer(fmt, experts, top_k, hidden, inter) if peer_type else None
        try:
            for t in args.tokens:
                x = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
                ours_fn = lambda ids, w: forward(x, ids, w)  # noqa: E731
                distinct = distinct_experts(routes[t])
                for th in threads_for(t, args):
                    torch.set_num_threads(th)
                    row = bench_point(name, fmt, t, th, args, ours_fn, routes[t], llama)
                    row.update(weight_GBps=distinct * per_expert / row["ms"] / 1e6,
                               GFLOPs=6 * t * top_k * hidden * inter / row["ms"] / 1e6)
                    row["read_roof_frac"] = row["weight_GBps"] / row["read_GBps"]
                    mm = roofs[th]["matmul_GFLOPs"].get(t)
                    row["matmul_roof_frac"] = row["GFLOPs"] / mm if mm else None
                    row["compute_roof_frac"] = row["GFLOPs"] / roofs[th]["compute_GFLOPs"] if t >= 32 else None
                    if llama is not None:
                        row["llama_read_roof_frac"] = (distinct * llama.expert_bytes / row["llama_ms"] / 1e6
                                                       / row["read_GBps"])
                        row["llama_over_ours"] = row["llama_ms"] / row["ms"]
                    results["rows"].append(row)
                    print(point_line(row), flush=True)
        finally:
            if llama is not None:
                llama.close()
        del forward
    results["roofs"][name] = roofs
    if args.peers and name == "ref":
        bench_other_peers(name, args, gate_up, down, routes, results)


def bench_point(name, fmt, tokens, threads, args, ours_fn, routes, llama):
    """Read roof, llama.cpp and ours, alternated round by round; median and min of each."""
    reps = reps_per_round(tokens, args)
    ours, theirs, roof = [], [], []
    time_calls(ours_fn, routes, 1, 0)  # warm-up (scratch, code pages)
    if llama is not None:
        llama.run(tokens, threads, 1)
    for r in range(args.rounds):
        roof.append(read_roof_gbps(threads, repeats=2))
        if llama is not None:
            theirs += llama.run(tokens, threads, reps)
        ours += time_calls(ours_fn, routes, reps, r * reps)
    row = {"shape": name, "format": fmt, "tokens": tokens, "threads": threads, "read_GBps": statistics.median(roof),
           "ms": statistics.median(ours), "ms_min": min(ours), "samples": len(ours)}
    if llama is not None:
        row.update(llama_type=llama.type, llama_ms=statistics.median(theirs), llama_ms_min=min(theirs))
    return row


def point_line(row):
    s = (f"[{row['shape']}] {row['format']:4} T={row['tokens']:<5} {row['threads']}t  {row['ms']:9.3f} ms "
         f"(min {row['ms_min']:.3f})  {row['weight_GBps']:6.1f} GB/s ({100 * row['read_roof_frac']:5.1f}% read roof)"
         f"  {row['GFLOPs']:7.1f} GFLOP/s")
    if row["compute_roof_frac"]:
        s += f" ({100 * row['compute_roof_frac']:.0f}% compute roof, {100 * row['matmul_roof_frac']:.0f}% of torch.matmul)"
    if "llama_ms" in row:
        s += (f" | llama.cpp {row['llama_type']} {row['llama_ms']:.3f} ms (min {row['llama_ms_min']:.3f}, "
              f"{100 * row['llama_read_roof_frac']:.0f}% read roof) -> ours {row['llama_over_ours']:.2f}x")
    return s


def bench_other_peers(name, args, gate_up, down, routes, results):
    """kt-kernel 0.7.2 and transformers experts, when installed (benchmarks/baselines/experts.py)."""
    try:
        from benchmarks.baselines import experts as peers
    except ImportError as exc:  # pragma: no cover
        print(f"peers unavailable: {exc}")
        return
    avail = peers.available_peers()
    for peer, (ok, detail) in avail.items():
        print(f"  peer {peer}: {'yes' if ok else 'no'} ({detail})")
    experts, top_k, hidden, inter = SHAPES[name]
    gate, up = gate_up[:, :inter].contiguous(), gate_up[:, inter:].contiguous()

    def record(peer, fmt, t, th, fn):
        x = torch.randn(t, hidden).to(torch.bfloat16)
        times = time_calls(lambda ids, w: fn(x, ids, w), routes[t], 1 + reps_per_round(t, args) * args.rounds, 0)[1:]
        results["peers"].append({"peer": peer, "format": fmt, "tokens": t, "threads": th,
                                 "ms": statistics.median(times), "ms_min": min(times)})
        print(f"[peer] {peer:24} T={t:<5} {th}t  {statistics.median(times):9.3f} ms", flush=True)

    for fmt in args.formats:
        if not avail.get(f"kt-kernel {fmt}", (False,))[0]:
            continue
        for th in args.threads:
            torch.set_num_threads(1)  # kt-kernel uses its own pool
            moe = peers.make_ktkernel_moe(fmt, experts, top_k, hidden, inter, th, gate, up, down,
                                          max_len=max(args.tokens))
            try:
                for t in args.tokens:
                    record(f"kt-kernel {fmt}", fmt, t, th, moe)
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
                    record(f"transformers {impl}", "bf16", t, th, fwd)


def summary_table(results):
    """Markdown: one row per (shape, format, T, threads), llama.cpp alongside; other peers' best."""
    has_llama = any("llama_ms" in r for r in results["rows"])
    peer_best = {}
    for p in results["peers"]:
        key = (p["peer"], p["tokens"], p["threads"])
        if key not in peer_best or p["ms"] < peer_best[key]["ms"]:
            peer_best[key] = p
    peer_names = sorted({p["peer"] for p in results["peers"]})
    header = ["shape", "format", "T", "threads", "ms (median / min)", "weight GB/s", "% read roof", "GFLOP/s",
              "% compute roof", "% of torch bf16 matmul"]
    if has_llama:
        header += ["llama.cpp", "llama.cpp ms (median / min)", "llama.cpp % read roof", "llama.cpp / ours"]
    header += [f"{n} ms (ours x faster)" for n in peer_names]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    order = lambda r: (list(SHAPES).index(r["shape"]), FORMATS.index(r["format"]), r["tokens"], r["threads"])  # noqa
    for r in sorted(results["rows"], key=order):
        pct = lambda v: f"{100 * v:.0f}%" if v else ""  # noqa: E731
        cells = [r["shape"], r["format"], r["tokens"], r["threads"], f"{r['ms']:.3f} / {r['ms_min']:.3f}",
                 f"{r['weight_GBps']:.1f}", pct(r["read_roof_frac"]), f"{r['GFLOPs']:.0f}",
                 pct(r["compute_roof_frac"]), pct(r["matmul_roof_frac"])]
        if has_llama:
            cells += ([r["llama_type"], f"{r['llama_ms']:.3f} / {r['llama_ms_min']:.3f}",
                       f"{100 * r['llama_read_roof_frac']:.0f}%", f"{r['llama_over_ours']:.2f}x"]
                      if "llama_ms" in r else [""] * 4)
        for n in peer_names:
            p = peer_best.get((n, r["tokens"], r["threads"]))
            applies = r["shape"] == "ref" and p and p["format"] == r["format"]
            cells.append(f"{p['ms']:.2f} ({p['ms'] / r['ms']:.2f}x)" if applies else "")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="MoE layer forward benchmark (see module docstring)")
    ap.add_argument("--shapes", default="ref,e64,e16big")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--tokens", default="1,4,32,512,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--threads-big", default="", help="thread counts for T > 32 (default: --threads)")
    ap.add_argument("--reps", type=int, default=20, help="calls per round at T <= 32 (a fifth above)")
    ap.add_argument("--rounds", type=int, default=5, help="alternation rounds (ours, llama.cpp) per point")
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="skip kt-kernel and transformers")
    ap.add_argument("--no-llama", dest="llama", action="store_false", help="skip llama.cpp")
    ap.add_argument("--quick", action="store_true", help="reference shape, T in {1, 512}")
    add_out_argument(ap, "bench_moe")
    args = ap.parse_args(argv)
    if args.quick:
        args.shapes, args.tokens = "ref", "1,512"
    args.shapes = args.shapes.split(",")
    args.formats = args.formats.split(",")
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.threads = [int(t) for t in args.threads.split(",")]
    args.threads_big = [int(t) for t in args.threads_big.split(",") if t]
    llama_ok, llama_detail = llama_layer.available() if args.llama else (False, "skipped (--no-llama)")
    load = os.getloadavg()
    print(f"torch_ktmoe {torch_ktmoe.__version__}, ISA {torch_ktmoe.active_isa()}, torch {torch.__version__}, "
          f"read roof probe {read_roof_isa()}, compute roof probe {compute_roof_instruction()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"  peer llama.cpp: {'yes' if llama_ok else 'no'} ({llama_detail})")
    results = {"isa": torch_ktmoe.active_isa(), "loadavg_start": load, "rows": [], "peers": [], "roofs": {}}
    for name in args.shapes:
        bench_shape(name, args, llama_ok, results)
    results["loadavg_end"] = os.getloadavg()
    table = summary_table(results)
    print("\n" + table)
    print(f"load average at the end: {results['loadavg_end'][0]:.2f}")
    write_result(args.out, results)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
