"""Decode that waits on the disk, against the disk's roof measured in the same run: a stack of file-backed layers.

Run (root, cgroup v1): python -m benchmarks.memory.bench_disk_bound [--layers 24] [--limit-mib 1024] [--tokens 16]

A stack of ``--layers`` int8 KTMoE layers (``--experts`` 32, top ``--top-k`` 8, H=2048, I=512: ~120 MB packed a
layer, 2.9 GB in all), packed once into kept cache files, each with a random router ``[E, H]``; "zipf" adds a
per-layer popularity bias to the logits (expert e's: 2 log 1/(e+1)), "uniform" none. A token's hidden state
goes through the layers: its router's top-k, the layer, ``x = rmsnorm(x + moe(x))``; before each layer runs,
the next layer's router predicts its experts from ``x`` (:class:`torch_ktmoe.residency.predictor.NextLayerPredictor`,
k' = ``--k-prime``, default k) and reads them ahead through the reader pool (``--reader-threads``;
``--next-layer off``: no predictor, only ``moe_forward``'s own read-ahead of the routed experts;
``--next-layer on,off`` alternates the two per routing, ``--rounds`` times). Per routing and mode, one child process
inside a fresh ``--limit-mib`` memory cgroup (page cache charged there too), the files' pages dropped first
(``POSIX_FADV_DONTNEED``), maps the files (``prefetch="auto"``, and ``next_layer_prefetch="auto"`` where on: both on,
the experts do not fit), decodes ``--warmup`` then ``--tokens`` tokens (T=1) and reports, over the
measured tokens: tok/s, the disk rate while the layers waited on it (``residency_report``: read_bytes / the
forwards-with-misses' time) and over the whole decode (``/proc/self/io`` read_bytes / decode time), each as %
of the best rate of :mod:`benchmarks.baselines.disk_roof` over the same files, as % of its ``runs_8`` (the same
bytes as runs of one expert's packed rows in random order: what a decode, which reads whichever experts are
routed, can get at best) and as % of the best rate under the same memory limit (``disk_roof.limited_rate``: 8
buffered streams in a full cgroup of ``--limit-mib``, where each page read first reclaims one), the share of the
decode with the disk busy (``disk_roof.disk_busy_ms``: the device's, so the host must be otherwise idle), the
process's CPU time over the decode (% of one core: near 100 x ``--threads``, the compute sets the pace, not the
disk), bytes read and major faults per token, the routed experts' hit rate, the predictor's recall and the layer
forwards whose predictions were not read because their recall made them a loss
(:mod:`torch_ktmoe.residency.prediction_gate`).

``--prefill T``: instead of decoding, each child runs one forward of T tokens through the stack from the cold
page cache (the prefill of a long prompt: T·k >> E touches every expert of every layer) and reports its time,
bytes read and disk rate (% of the best); a first row runs the same forward with the stack in the page cache
and no memory limit (one untimed forward first): the compute alone. With reads and compute fully overlapped the
cold forward would take max(compute, bytes / best rate).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from benchmarks.baselines.disk_roof import disk_busy_ms, disk_rates, disk_roof, limited_rate, roof_line
from ktmoe_harness.memcg import run_in_memory_cgroup

MiB = 1 << 20
ROUTINGS = ("uniform", "zipf")

CHILD = r"""
import sys
from benchmarks.memory.bench_disk_bound import decode
decode(*sys.argv[1:])
"""


def shape(args) -> dict:
    return dict(num_experts=args.experts, top_k=args.top_k, hidden_size=args.hidden,
                intermediate_size=args.intermediate)


def fingerprint(layer: int) -> str:
    return f"bench_disk_bound layer {layer}"


def pack(directory: str, layers: int, dims: dict, threads: int) -> list:
    """Packs the stack (int8, kept cache files) and its routers; returns the experts files."""
    import torch

    from torch_ktmoe import KTMoE

    torch.set_num_threads(threads)
    E, H, I = dims["num_experts"], dims["hidden_size"], dims["intermediate_size"]
    gen = torch.Generator().manual_seed(0)
    routers = []
    for layer in range(layers):
        ktm = KTMoE(**dims, weight_format="int8", mmap_experts_dir=directory, layer_idx=layer, numa_parts=1,
                    warm="none")
        if not ktm.try_load_cached(fingerprint(layer)):
            gate_up = (torch.randn(E, 2 * I, H, generator=gen) * H ** -0.5).bfloat16()
            down = (torch.randn(E, H, I, generator=gen) * I ** -0.5).bfloat16()
            ktm.load_weights(gate_up, down, fingerprint=fingerprint(layer))
            del gate_up, down
        routers.append(torch.randn(E, H, generator=gen) * H ** -0.5)  # logits ~N(0, 1) on a unit-rms state
        del ktm
    torch.save(torch.stack(routers), os.path.join(directory, "routers.pt"))
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".ktmoe"))


def decode(directory: str, dims_json: str, routing: str, warmup: str, tokens: str, threads: str, k_prime: str,
           reader_threads: str, out: str, prefill: str = "0") -> None:
    """The child: maps the stack, decodes (or, ``prefill`` > 0, runs one forward of that many tokens from a
    cold page cache), writes its figures to ``out`` (see the module)."""
    import resource
    import time

    import torch
    from torch import nn

    import torch_ktmoe
    from torch_ktmoe import KTMoE
    from torch_ktmoe.residency.predictor import NextLayerPredictor
    from torch_ktmoe.residency.counters import process_read_bytes

    torch.set_num_threads(int(threads))
    if int(reader_threads) >= 0:
        from torch_ktmoe.residency import reads as expert_reads

        expert_reads.set_reader_threads(int(reader_threads))
    dims = json.loads(dims_json)
    routers = torch.load(os.path.join(directory, "routers.pt"))
    layers = []
    for layer in range(routers.shape[0]):
        ktm = KTMoE(**dims, weight_format="int8", mmap_experts_dir=directory, layer_idx=layer, numa_parts=1,
                    cache="map", residency=True, next_layer_prefetch="auto" if int(k_prime) >= 0 else False)
        if not ktm.try_load_cached(fingerprint(layer)):
            raise SystemExit(f"layer {layer}: no valid cache file in {directory}: {ktm.cache_events}")
        layers.append(ktm)
    E, k = dims["num_experts"], dims["top_k"]
    bias = -torch.log(torch.arange(1, E + 1, dtype=torch.float32)) * 2.0 if routing == "zipf" else torch.zeros(E)
    gates = []
    for w in routers:
        gate = nn.Module()
        gate.weight = nn.Parameter(w, requires_grad=False)
        gate.bias = nn.Parameter(bias.clone(), requires_grad=False)
        gates.append(gate)
    predictors = [None] * len(layers)  # k_prime < 0: next-layer prefetch off
    if int(k_prime) >= 0:
        predictors = [NextLayerPredictor(gates[i + 1], layers[i + 1], int(k_prime) or None)
                      for i in range(len(layers) - 1)] + [None]
    model = nn.ModuleList(layers)
    gen = torch.Generator().manual_seed(1)

    @torch.no_grad()
    def token(rows=1):
        x = torch.randn(rows, dims["hidden_size"], generator=gen)
        for ktm, gate, predict in zip(layers, gates, predictors):
            logits = torch.nn.functional.linear(x, gate.weight, gate.bias)
            w, ids = torch.topk(torch.softmax(logits, -1), k, -1)
            if predict is not None:
                predict(x)  # the next layer's experts, read ahead while this one computes
            x = x + ktm(x, ids, w)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    if int(prefill) > 0:  # one cold forward of `prefill` tokens (warmup > 0: after that many, the compute alone)
        for _ in range(int(warmup)):
            token(int(prefill))
        read0, t0 = process_read_bytes(), time.perf_counter()
        token(int(prefill))
        seconds = time.perf_counter() - t0
        json.dump(dict(prefill_s=seconds, read_bytes=process_read_bytes() - read0,
                       next_layer_prefetching=all(m.next_layer_prefetching for m in layers)), open(out, "w"))
        return
    for _ in range(int(warmup)):
        token()
    torch_ktmoe.residency_report(model, reset=True)
    busy0, cpu0 = disk_busy_ms(directory), time.process_time()
    read0, faults0, t0 = process_read_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt, time.perf_counter()
    n = int(tokens)
    for _ in range(n):
        token()
    seconds = time.perf_counter() - t0
    busy1, cpu_pct = disk_busy_ms(directory), 100 * (time.process_time() - cpu0) / seconds
    r = torch_ktmoe.residency_report(model)
    json.dump(dict(tok_s=n / seconds, decode_s=seconds, read_bytes=process_read_bytes() - read0,
                   disk_busy_pct=None if busy0 is None else (busy1 - busy0) / 10 / seconds, cpu_pct=cpu_pct,
                   major_faults_per_token=(resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults0) / n,
                   residency={k: v for k, v in r.items() if k != "per_layer"},
                   prefetching=all(m.prefetching for m in layers),
                   next_layer_prefetching=all(m.next_layer_prefetching for m in layers),
                   recall_per_layer=[s["recall"] for s in r["per_layer"].values()]), open(out, "w"))


def rate_cell(rate: dict) -> str:
    """GB/s (% of the best rate, of the random runs' rate, of the best under the limit)."""
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    return (f"{fmt(rate['GBps'], '.2f')} ({fmt(rate['pct_of_roof'], '.0f')} %, {fmt(rate['pct_of_runs'], '.0f')} %, "
            f"{fmt(rate['pct_of_limited'], '.0f')} %)")


def prefill_row(routing: str, res: dict, roof: dict, load: float) -> str:
    if "prefill_s" not in res:
        return f"| {routing} | {res['mode']} | failed (rc {res.get('returncode')}) | | | | {load:.1f} |"
    disk = "-" if not res["read_bytes"] else rate_cell(disk_rates(res["read_bytes"], res["prefill_s"], roof))
    return (f"| {routing} | {res['mode']} | {res['prefill_s']:.2f} | {res['read_bytes'] / 1e9:.2f} | {disk} | "
            f"{res['next_layer_prefetching']} | {load:.1f} |")


def row(routing: str, res: dict, roof: dict, tokens: int, load: float) -> str:
    if "tok_s" not in res:
        return (f"| {routing} | {res['mode']} | failed (rc {res.get('returncode')}) | | | | | | | | | | | "
                f"{load:.1f} |")
    r = res["residency"]
    waiting = disk_rates(r["read_bytes"], r["read_seconds"], roof)
    overall = disk_rates(res["read_bytes"], res["decode_s"], roof)
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    return (f"| {routing} | {res['mode']} | {res['tok_s']:.2f} | {rate_cell(waiting)} | {rate_cell(overall)} | "
            f"{fmt(res.get('disk_busy_pct'), '.0f')} | {res['cpu_pct']:.0f} | "
            f"{res['read_bytes'] / tokens / 1e6:.0f} | {res['major_faults_per_token']:.1f} | "
            f"{fmt(r['hit_rate'], '.2f')} | {fmt(r['recall'], '.2f')} | {r.get('prediction_off_forwards', '-')} | "
            f"{res['prefetching']}/"
            f"{res['next_layer_prefetching']} | {load:.1f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--limit-mib", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--routings", default=",".join(ROUTINGS))
    ap.add_argument("--k-prime", type=int, default=0, help="experts the next-layer predictor names per token "
                    "(0: the predictor's default, k)")
    ap.add_argument("--next-layer", default="on", help="on, off or on,off (alternated): next-layer prefetch")
    ap.add_argument("--reader-threads", type=int, default=-1, help="the reader pool's threads (-1: its default; "
                    "0: next-layer reads become MADV_WILLNEED from the compute thread)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each (routing, mode), alternated")
    ap.add_argument("--prefill", type=int, default=0, help="instead of decoding, one forward of this many tokens "
                    "from a cold page cache (its time, bytes read and disk rate)")
    ap.add_argument("--roof-gib", type=float, default=2.0, help="bytes the disk roof reads per pattern")
    ap.add_argument("--workdir", default=None, help="where the packed stack goes (default: a temporary directory "
                    "under /var/tmp: a real disk, not tmpfs); kept if given")
    args = ap.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="ktmoe-disk-bound-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    dims = shape(args)
    try:
        files = pack(work, args.layers, dims, args.threads)
        packed = sum(os.path.getsize(f) for f in files)
        run_bytes = packed // (args.layers * args.experts * 2)  # an expert's packed rows: gate/up or down
        roof = disk_roof(files, int(args.roof_gib * (1 << 30)), run_bytes=run_bytes)
        roof.update(limit_bytes=args.limit_mib * MiB,
                    limited=limited_rate(files, args.limit_mib * MiB, int(args.roof_gib * (1 << 30))))
        from benchmarks.baselines.disk_roof import drop_file_pages

        results = []
        modes = [m for m in args.next_layer.split(",") if m]
        if not modes or set(modes) - {"on", "off"}:
            ap.error(f"--next-layer takes on, off or on,off, not {args.next_layer!r}")
        routings = [r for r in args.routings.split(",") if r]
        if args.prefill:  # the compute alone: the same forward with every expert in the page cache, no limit
            from ktmoe_harness.child import run_python

            for routing in routings:
                out = os.path.join(work, f"{routing}-warm.json")
                res = run_python(CHILD, [work, json.dumps(dims), routing, 1, 0, args.threads, -1,
                                         args.reader_threads, out, args.prefill], timeout=1800)
                result = json.load(open(out)) if res.returncode == 0 else {"returncode": res.returncode}
                results.append((routing, dict(result, mode="warm, no limit", load=os.getloadavg()[0])))
        for routing in routings:
            for _ in range(args.rounds):
                for mode in modes:
                    out = os.path.join(work, f"{routing}-{mode}.json")
                    print(f"[{routing}, next-layer {mode}] ...", file=sys.stderr, flush=True)
                    drop_file_pages(files)  # cold: every expert comes from the disk at first
                    res = run_in_memory_cgroup(f"ktmoe_bench_disk_bound_{routing}", args.limit_mib * MiB, CHILD,
                                               [work, json.dumps(dims), routing, args.warmup, args.tokens,
                                                args.threads, args.k_prime if mode == "on" else -1,
                                                args.reader_threads, out, args.prefill],
                                               timeout=1800)
                    load = os.getloadavg()[0]
                    if res.returncode == 0:
                        with open(out) as f:
                            result = json.load(f)
                    else:
                        result = {"returncode": res.returncode, "stderr": res.stderr[-800:]}
                        print(res.stderr[-800:], file=sys.stderr)
                    results.append((routing, dict(result, mode=mode, load=load)))
        if args.prefill:
            print(f"\n{args.layers} int8 layers x {args.experts} experts (top-{args.top_k}, H={args.hidden}, "
                  f"I={args.intermediate}): {packed / 1e9:.2f} GB packed, file-backed, under a {args.limit_mib} MiB "
                  f"memory cgroup, page cache dropped first; one forward of {args.prefill} tokens, {args.threads} "
                  "threads")
            print(roof_line(roof) + f"; the stack's bytes at the best rate: {packed / roof['best'] / 1e9:.2f} s\n")
            print("| routing | next-layer | prefill s | GB read | disk GB/s over the forward (% of best, of random "
                  "runs, of best under the limit) | "
                  "next-layer on | load avg |")
            print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
            for routing, res in results:
                print(prefill_row(routing, res, roof, res["load"]))
            return 0
        print(f"\n{args.layers} int8 layers x {args.experts} experts (top-{args.top_k}, H={args.hidden}, "
              f"I={args.intermediate}): {packed / 1e9:.2f} GB packed, file-backed, under a {args.limit_mib} MiB "
              f"memory cgroup, page cache dropped first; {args.tokens} tokens after {args.warmup}, "
              f"{args.threads} threads")
        print(roof_line(roof) + "\n")
        print("| routing | next-layer | tok/s | disk GB/s while waiting (% of best, of random runs, of best under the "
              "limit) | disk GB/s over decode (same) | disk busy, % of decode | process CPU, % of a core | "
              f"MB read / token | major faults / token | hit rate | recall (k' = {args.k_prime or args.top_k}) | "
              "layer forwards with predictions off (recall < 1/2) | prefetch / next-layer | "
              "load avg |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
        for routing, res in results:
            print(row(routing, res, roof, args.tokens, res["load"]))
        return 0
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
