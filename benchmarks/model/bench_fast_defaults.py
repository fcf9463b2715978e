"""hf.from_pretrained's defaults (packed dense linears, decode attention) against torch's linears and SDPA, and
against the explicit calls, eager greedy decoding, alternated round by round in one process.

    python -m benchmarks.model.bench_fast_defaults [--checkpoint PATH] [--prompt-tokens 32 --tokens 64 --repeats 5]

Three bf16 models from the same checkpoint (by default the demo's random Qwen3-MoE, ktmoe_harness.checkpoint):

* ``before``: ``hf.from_pretrained(..., pack_linears=False, decode_attention=False)``: torch's linears and SDPA;
* ``defaults``: ``hf.from_pretrained(...)``, nothing else;
* ``explicit``: ``before``'s load, then ``hf.pack_linears(model)`` and ``hf.use_decode_attention(model)``.

Each generates once to warm up, then ``--repeats`` rounds run one greedy generate of each in turn. Reported:
decode tokens/s (median and best round), and whether each row's tokens equal ``before``'s.
"""
import argparse
import shutil
import statistics

from ktmoe_harness.checkpoint import checkpoint_for, make_workdir
from ktmoe_harness.generate import generate, load_timed, seeded_prompt
from ktmoe_harness.options import add_model_arguments, add_run_arguments


def load_rows(checkpoint, weight_format):
    from torch_ktmoe import hf

    before, _ = load_timed(checkpoint, None, weight_format, pack_linears=False, decode_attention=False)
    defaults, _ = load_timed(checkpoint, None, weight_format)
    explicit, _ = load_timed(checkpoint, None, weight_format, pack_linears=False, decode_attention=False)
    hf.pack_linears(explicit)
    hf.use_decode_attention(explicit)
    return {"before": before, "defaults": defaults, "explicit": explicit}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_run_arguments(ap)
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (after one warm-up of each row)")
    args = ap.parse_args(argv)
    import torch

    work = make_workdir(args, "ktmoe-defaults-")
    try:
        checkpoint = checkpoint_for(args, work)
        rows = load_rows(checkpoint, args.format)
        prompt = seeded_prompt(rows["before"].config.vocab_size, args.prompt_tokens)
        rates, tokens = {name: [] for name in rows}, {}
        for name, model in rows.items():  # warm-up
            tokens[name] = generate(model, prompt, args.tokens, progress=False)[0]
        for _ in range(args.repeats):
            for name, model in rows.items():
                _, _, _, decode_s = generate(model, prompt, args.tokens, progress=False)
                rates[name].append((args.tokens - 1) / decode_s)
        print(f"\ntorch {torch.__version__}, threads {torch.get_num_threads()}, {args.format} experts, "
              f"{args.prompt_tokens}-token prompt, {args.tokens} new tokens, {args.repeats} rounds\n")
        print("| row | decode tok/s (median / best) | / before | tokens equal before's |\n|---|---|---|---|")
        base = statistics.median(rates["before"])
        for name in rows:
            med = statistics.median(rates[name])
            print(f"| {name} | {med:.1f} / {max(rates[name]):.1f} | {med / base:.2f} | "
                  f"{tokens[name] == tokens['before']} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
