"""KTMoE.forward against the bare op at decode: what the module costs on top of the kernel.

Run:  python -m benchmarks.layer.bench_layer_overhead [--formats bf16,int8,int4] [--threads 1,2]

Per format and thread count, on the reference layer (E=128, top-8, H=2048, I=768) at T=1, the
bare ``torch.ops.ktmoe.moe_forward(x, ids, w, w13, w2)`` and ``KTMoE.forward`` on the same
[1, H] input (Hugging Face experts blocks get [T, H]) are alternated call by call over rotating
routings (cold experts). Prints the median and min of each and the overhead of the module in %,
median over median; the target is under 3 %.
"""
import argparse
import statistics
import time

import torch

from ktmoe_harness.moe_inputs import random_experts, routings
from torch_ktmoe import KTMoE
from torch_ktmoe.ops import WEIGHT_FORMATS


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default=",".join(WEIGHT_FORMATS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args(argv)
    E, k, H, I = 128, 8, 2048, 768
    gate_up, down = random_experts(E, H, I, dtype=torch.bfloat16)
    routes = routings(1, E, k, 16, seed=1)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    print("| format | threads | bare op ms (median / min) | KTMoE.forward ms (median / min) | overhead |")
    print("| --- | --- | --- | --- | --- |")
    for fmt in args.formats.split(","):
        layer = KTMoE(E, k, H, I, weight_format=fmt)
        layer.load_weights(gate_up, down)
        w13, w2 = layer.packed_tensors()[0]
        for th in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(th)
            bare, module = [], []
            with torch.inference_mode():
                for i in range(args.calls + 10):
                    ids, w = routes[i % len(routes)]
                    t0 = time.perf_counter()
                    torch.ops.ktmoe.moe_forward(x, ids, w, w13, w2)
                    t1 = time.perf_counter()
                    ids, w = routes[(i + 7) % len(routes)]
                    t2 = time.perf_counter()
                    layer(x, ids, w)
                    t3 = time.perf_counter()
                    if i >= 10:  # warm-up
                        bare.append((t1 - t0) * 1e3)
                        module.append((t3 - t2) * 1e3)
            mb, mm = statistics.median(bare), statistics.median(module)
            print(f"| {fmt} | {th} | {mb:.3f} / {min(bare):.3f} | {mm:.3f} / {min(module):.3f} | "
                  f"{100 * (mm / mb - 1):+.1f}% |", flush=True)
        del layer, w13, w2


if __name__ == "__main__":
    main()
