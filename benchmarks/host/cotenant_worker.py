"""One subject of the co-tenant benchmark, held in its own process (benchmarks/host/bench_cotenant.py).

Run as a script with ``PYTHONPATH`` set to the tree under test (a checkout of another commit works, so a
"before" tree can be timed in the same session), it loads one subject once and answers ``run N`` on stdin
with ``result VALUE`` on stdout:

* ``layer``: the reference layer (E=128, top-8, H=2048, I=768, bf16), T=1; VALUE = ms per forward, the
  mean of N forwards over routings drawn in advance;
* ``demo``: the demo's random Qwen3-MoE (``--checkpoint``), greedy decoding; VALUE = decode tok/s of N
  new tokens (ktmoe_harness.generate).

``--experts-dir DIR`` puts the experts in files under DIR (file-backed mode); without it they are anonymous.
"""
import argparse
import sys
import time


def layer_subject(experts_dir):
    import torch

    from torch_ktmoe import KTMoE

    E, k, H, I = 128, 8, 2048, 768
    g = torch.Generator().manual_seed(0)
    gate_up = torch.randn(E, 2 * I, H, generator=g, dtype=torch.bfloat16) / H ** 0.5
    down = torch.randn(E, H, I, generator=g, dtype=torch.bfloat16) / I ** 0.5
    layer = KTMoE(E, k, H, I, weight_format="bf16", mmap_experts_dir=experts_dir)
    layer.load_weights(gate_up, down)
    del gate_up, down
    x = torch.randn(1, H, generator=g, dtype=torch.bfloat16)
    routes = []
    for _ in range(64):
        ids = torch.randperm(E, generator=g)[:k].view(1, k)
        w = torch.rand(1, k, generator=g) + 0.1
        routes.append((ids, (w / w.sum()).contiguous()))

    def run(n):
        with torch.inference_mode():
            for ids, w in routes[:4]:
                layer(x, ids, w)
            t0 = time.perf_counter()
            for i in range(n):
                ids, w = routes[i % len(routes)]
                layer(x, ids, w)
            return (time.perf_counter() - t0) * 1e3 / n

    return run


def demo_subject(checkpoint, experts_dir):
    from ktmoe_harness.generate import generate, load_timed, seeded_prompt

    model, _ = load_timed(checkpoint, experts_dir, "bf16")
    model.eval()
    prompt = seeded_prompt(model.config.vocab_size, 32)
    generate(model, prompt, 4, progress=False)  # warm-up

    def run(n):
        _, _, _, decode_s = generate(model, prompt, n + 1, progress=False)
        return n / decode_s

    return run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("subject", choices=("layer", "demo"))
    ap.add_argument("--checkpoint")
    ap.add_argument("--experts-dir")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    run = layer_subject(args.experts_dir) if args.subject == "layer" else demo_subject(args.checkpoint,
                                                                                         args.experts_dir)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "run":
            print(f"result {run(int(cmd[1])):.6f}", flush=True)
        elif cmd and cmd[0] == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
