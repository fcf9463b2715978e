"""GGUF experts on AMX tiles against the AVX-512 code kernels, per rows an expert gets: where the tiles start to win.

    python -m benchmarks.micro.bench_ggml_rows --mixes gguf-q4_K,gguf-q6_K,gguf-q8_0 --rows 4,6,8,10,12,16

Reference shape (E=128, top-8, H=2048, I=768), GGUF blocks in place (random sane blocks of the mix's types,
ktmoe_harness.ggml_rows), T = 16 r tokens routed so that every expert gets exactly r rows (token t's j-th
expert (8 t + j) mod 128). Per (mix, r): ms of the layer on avx512 and on amx, alternated call by call over
``--rounds`` rounds (the first dropped), median; avx512 / amx. An AMX host only. Sets the amx table's threshold
(csrc/kernels/amx/prefill_rows.h, kGgmlPrefillMinRows).
"""
import argparse
import statistics
import time

import torch

import torch_ktmoe
from ktmoe_harness.ggml_rows import GGUF_MIXES, ggml_experts
from torch_ktmoe import ops

SHAPE = (128, 8, 2048, 768)  # E, k, H, I


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mixes", default="gguf-q4_K,gguf-q6_K,gguf-q8_0")
    p.add_argument("--rows", default="4,6,8,10,12,16")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    if "amx" not in torch_ktmoe.available_isas():
        raise SystemExit(f"bench_ggml_rows: this CPU has no AMX (available: {torch_ktmoe.available_isas()})")
    E, k, H, I = SHAPE
    print(f"torch_ktmoe {torch_ktmoe.__version__}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    for mix in args.mixes.split(","):
        experts = ggml_experts(GGUF_MIXES[mix], E, H, I)
        for r in (int(v) for v in args.rows.split(",")):
            T = E * r // k
            ids = (torch.arange(T * k) % E).view(T, k).to(torch.int32)
            weights = torch.full((T, k), 1.0 / k)
            x = torch.randn(T, H).to(torch.bfloat16)
            times = {"avx512": [], "amx": []}
            for _ in range(args.rounds):
                for isa, t in times.items():
                    with torch_ktmoe.isa_scope(isa):
                        t0 = time.perf_counter()
                        ops.moe_forward_ggml(x, ids, weights, *experts, GGUF_MIXES[mix])
                        t.append((time.perf_counter() - t0) * 1e3)
            a, b = (statistics.median(times[isa][1:]) for isa in ("avx512", "amx"))
            print(f"{mix} rows/expert {r:3d}: avx512 {a:7.1f} ms  amx {b:7.1f} ms  avx512/amx {a / b:.2f}", flush=True)


if __name__ == "__main__":
    main()
