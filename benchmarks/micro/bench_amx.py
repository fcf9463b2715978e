"""AMX tile kernels against the AVX-512 ones on the same packed experts, alternated call by call, per T.

Run (an AMX host, e.g. Sapphire Rapids; benchmarks/micro/device_amx.sh does it on the device machine):

    python -m benchmarks.micro.bench_amx --tokens 1,16,32,64,128,256,512 --formats bf16,int8,int4
    python -m benchmarks.micro.bench_amx --formats gguf-q4_K,gguf-q4_K_M     # GGUF experts in place

Reference shape (E=128, top-8, H=2048, I=768), bf16 activations, all threads of torch's pool. Per (format, T):
ms of the whole layer on avx512 and on amx, median and min over ``--rounds`` rounds, each round one call of each
ISA in turn (A B A B ...) on the next of 16 routings (cold experts, as in serving); the speed-up avx512 / amx;
GFLOP/s against dense bf16 ``torch.matmul`` of the same FLOP count, timed in the same run; and the relative
difference of the two outputs (the AMX gemms sum in another order: ~1e-6 for int8 / int4, whose dots are exact
int32, more for bf16). Writes benchmarks/results/bench_amx.json.
"""
import argparse
import statistics
import time

import torch

import torch_ktmoe
from benchmarks.cli import add_out_argument, write_result
from ktmoe_harness.ggml_rows import GGUF_MIXES, ggml_experts
from ktmoe_harness.moe_inputs import random_experts, routings
from torch_ktmoe import ops

SHAPE = (128, 8, 2048, 768)  # E, k, H, I
BASE, TILES = "avx512", "amx"  # the ISA measured against, the one measured


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def matmul_ms(tokens: int, rounds: int) -> float:
    """Median ms of dense bf16 matmuls with the layer's FLOP count: [T*k, H] x [H, 2I], then [T*k, I] x [I, H]."""
    E, k, H, I = SHAPE
    a = torch.randn(tokens * k, H, dtype=torch.bfloat16)
    w1 = torch.randn(H, 2 * I, dtype=torch.bfloat16)
    h = torch.randn(tokens * k, I, dtype=torch.bfloat16)
    w2 = torch.randn(I, H, dtype=torch.bfloat16)
    run = lambda: (a @ w1, h @ w2)  # noqa: E731
    run()
    return statistics.median(timed(run) for _ in range(rounds))


def bench_format(spec: str, tokens_list, rounds: int) -> list[dict]:
    """spec: a format, FORMAT:GROUP (int8:0, per output channel), or a GGUF mix (gguf-q4_K: GGUF blocks in place)."""
    E, k, H, I = SHAPE
    fmt, _, group = spec.partition(":")
    if spec in GGUF_MIXES:  # random blocks of the mix's types (speed does not depend on the values)
        gguf_rows = ggml_experts(GGUF_MIXES[spec], E, H, I)
        forward = lambda x, ids, w: ops.moe_forward_ggml(x, ids, w, *gguf_rows, GGUF_MIXES[spec])  # noqa: E731
    else:
        gate_up, down = random_experts(E, H, I, dtype=torch.bfloat16)
        w13, w2 = ops.pack_experts(gate_up, down, fmt, group_size=int(group) if group else None)
        forward = lambda x, ids, w: ops.moe_forward(x, ids, w, w13, w2)  # noqa: E731
    fmt = spec
    rows = []
    for tokens in tokens_list:
        x = torch.randn(tokens, H).to(torch.bfloat16)
        routes = routings(tokens, E, k, 16, seed=tokens)
        isas = (BASE, TILES)
        outs, times = {}, {isa: [] for isa in isas}
        for isa in isas:  # warm-up, and the outputs compared
            with torch_ktmoe.isa_scope(isa):
                outs[isa] = forward(x, *routes[0]).float()
        for r in range(rounds):
            ids, w = routes[(r + 1) % len(routes)]
            for isa in isas:
                with torch_ktmoe.isa_scope(isa):
                    times[isa].append(timed(lambda: forward(x, ids, w)))
        flop = 2 * tokens * k * H * 3 * I
        med = {isa: statistics.median(times[isa]) for isa in isas}
        mm = matmul_ms(tokens, rounds)
        diff = ((outs[TILES] - outs[BASE]).abs().mean() / outs[BASE].abs().mean()).item()
        row = dict(format=fmt, tokens=tokens, threads=torch.get_num_threads(), matmul_ms=mm, rel_diff=diff,
                   speedup=med[BASE] / med[TILES])
        for isa in isas:
            row[f"{isa}_ms"], row[f"{isa}_ms_min"] = med[isa], min(times[isa])
            row[f"{isa}_gflops"] = flop / med[isa] / 1e6
        rows.append(row)
        print(f"| {fmt} | {tokens} | {row['threads']} | {med[BASE]:.3f} / {min(times[BASE]):.3f} | "
              f"{med[TILES]:.3f} / {min(times[TILES]):.3f} | {row['speedup']:.2f} | "
              f"{row[TILES + '_gflops']:.0f} | {flop / mm / 1e6:.0f} | {diff:.1e} |", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", default="1,16,32,64,128,256,512")
    p.add_argument("--formats", default="bf16,int8,int8:0,int4", help="formats, FORMAT:GROUP for a group size")
    p.add_argument("--rounds", type=int, default=7)
    add_out_argument(p, "bench_amx")
    args = p.parse_args(argv)
    if "amx" not in torch_ktmoe.available_isas():
        raise SystemExit(f"bench_amx: this CPU has no AMX (available: {torch_ktmoe.available_isas()})")
    tokens = [int(t) for t in args.tokens.split(",")]
    print(f"torch_ktmoe {torch_ktmoe.__version__}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"shape E,k,H,I = {SHAPE}\n")
    print("| format | T | threads | avx512 ms (median / min) | amx ms (median / min) | avx512 / amx | amx GFLOP/s "
          "| bf16 matmul GFLOP/s | rel. diff |\n|---|---|---|---|---|---|---|---|---|")
    rows = [row for fmt in args.formats.split(",") for row in bench_format(fmt, tokens, args.rounds)]
    write_result(args.out, dict(shape=SHAPE, rows=rows))


if __name__ == "__main__":
    main()
