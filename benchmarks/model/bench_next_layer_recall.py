"""The next-layer predictor's recall on tiny random models of several families, and its cost per layer at decode.

Run: python -m benchmarks.model.bench_next_layer_recall [--layers 6] [--prompt 64] [--decode 16]

Per family: a tiny random model (ktmoe_harness.transformers_families, ``--layers`` decoder layers), patched with
``next_layer_prefetch=True``; a prompt of ``--prompt`` random tokens, then ``--decode`` greedy tokens; recall =
|predicted ∩ routed| / |routed| (``residency_report``: the mean over the predicted layers, and the lowest layer),
for k' = k and 2k and for the two hidden states the predictor can start from (``source``: the state entering
layer L's experts, or layer L's input). Random weights route close to chance (k'/E): a trained model's residual
stream carries its routing from layer to layer, these do not, so the figures are a floor, not a forecast.

Cost: one predictor call and the recall count at T = 1 for a router of ``--cost-experts`` x ``--cost-hidden``
(Qwen3-30B-A3B's 128 x 2048 by default), with the router's weight packed (``pack_linears``) and in fp32.
"""
import argparse
import statistics
import sys
import time

import torch

DEFAULT_FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "deepseek_v4", "gpt_oss")


def tiny_model(family: str, layers: int):
    from ktmoe_harness import transformers_families as tf
    from tests.helpers.hf_families import tiny_model as build

    saved = tf.TINY
    tf.TINY = dict(saved, num_hidden_layers=layers)
    try:
        return build(family)
    finally:
        tf.TINY = saved


@torch.no_grad()
def recall_rows(family: str, layers: int, prompt_len: int, decode: int) -> list:
    import torch_ktmoe
    from torch_ktmoe import KTMoE, hf

    model = tiny_model(family, layers)
    report = hf.patch_model(model, next_layer_prefetch=True, pack_linears=False, decode_attention=False)
    top_k = next(m for m in model.modules() if isinstance(m, KTMoE)).top_k
    experts = next(m for m in model.modules() if isinstance(m, KTMoE)).num_experts
    torch.manual_seed(0)
    prompt = torch.randint(1, model.config.vocab_size, (1, prompt_len))
    rows = []
    for source in ("experts", "layer"):
        for k_prime in (top_k, 2 * top_k):
            predicted, left = hf.attach_next_layer_prefetch(model, k_prime=k_prime, source=source)
            torch_ktmoe.residency_report(model, reset=True)
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=decode, do_sample=False)
            r = torch_ktmoe.residency_report(model)
            per_layer = [s["recall"] for s in r["per_layer"].values() if s["recall"] is not None]
            rows.append(dict(family=family, source=source, k=top_k, k_prime=k_prime, experts=experts,
                             moe_layers=len(report.layers_patched), predicted=len(predicted), left=left,
                             recall=r["recall"], lowest=min(per_layer, default=None)))
    return rows


def cost_us(experts: int, hidden: int, top_k: int, packed: bool, reps: int = 2000) -> float:
    """Microseconds of one predictor call plus the recall count, T = 1."""
    from torch import nn

    from torch_ktmoe import KTMoE, ops
    from torch_ktmoe.residency.predictor import NextLayerPredictor

    target = KTMoE(experts, top_k, hidden, 64, numa_parts=1, next_layer_prefetch=True, warm="none")
    target.w13_0 = torch.zeros(1, dtype=torch.uint8)  # only the packed tensors are read: no experts needed
    target.reads.packed = target.packed_tensors()
    router = nn.Module()
    router.weight = nn.Parameter(torch.randn(experts, hidden) * 0.02, requires_grad=False)
    if packed:
        router.weight.data = router.weight.data.bfloat16()
        router.register_buffer("ktmoe_w_packed", ops.pack_linear(router.weight.detach()))
    predictor = NextLayerPredictor(router, target)
    x = torch.randn(1, hidden, dtype=torch.bfloat16 if packed else torch.float32)
    routed = torch.arange(top_k).reshape(1, -1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        predictor(x)
        target.next_layer_recall.observe(routed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="*", default=list(DEFAULT_FAMILIES))
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--cost-experts", type=int, default=128)
    ap.add_argument("--cost-hidden", type=int, default=2048)
    ap.add_argument("--cost-top-k", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| family | E | k | source | k' | MoE layers (predicted) | recall (mean / lowest layer) | chance k'/E |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for family in args.families:
        for r in recall_rows(family, args.layers, args.prompt, args.decode):
            reasons = sorted(set(r["left"].values()))
            left = f"; {len(r['left'])} left: {'; '.join(reasons)}" if reasons else ""
            recall = "-" if r["recall"] is None else f"{r['recall']:.2f} / {r['lowest']:.2f}"
            print(f"| {family} | {r['experts']} | {r['k']} | {r['source']} | {r['k_prime']} | "
                  f"{r['moe_layers']} ({r['predicted']}{left}) | {recall} | {r['k_prime'] / r['experts']:.2f} |",
                  flush=True)
    print(f"\ncost at T = 1, router {args.cost_experts} x {args.cost_hidden}, k = {args.cost_top_k}, k' = k (the default), "
          f"{args.threads} threads (predictor + recall count; an anonymous target: no reads):")
    for packed in (True, False):
        us = cost_us(args.cost_experts, args.cost_hidden, args.cost_top_k, packed)
        print(f"  {'packed bf16 router' if packed else 'fp32 router (F.linear)'}: {us:.0f} us per layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
