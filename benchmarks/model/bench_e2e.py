"""A whole model end to end: greedy decoding eager against hf.compile_decode, tokens/s and time to first token.

``python -m benchmarks.model.bench_e2e --model scale16 [...]`` runs the 30B-class model (16 layers) instead:
ours eager, ours compiled and llama.cpp, each from a dropped page cache, cold and steady, both
routings (benchmarks/model/scale/e2e.py, which documents its options). What follows is the default,
``--model tiny``:

``python -m benchmarks.model.bench_e2e [--format int8] [--checkpoint PATH] [--prompt-tokens 32 --tokens 32]``
loads a checkpoint with ``torch_ktmoe.hf.from_pretrained`` in bf16 (by default the demo's random
Qwen3-MoE, ``ktmoe_harness.checkpoint``: 8 layers, hidden 1024, 32 experts) and times
``model.generate`` (greedy) twice in one process:

* ``eager``: transformers' default (a dynamic KV cache, no compilation);
* ``compiled``: after ``hf.compile_decode(model, max_cache_len=prompt + tokens)`` (static cache,
  decode step compiled with ``fullgraph=True``; ``--backend``, default inductor).

The model loads with ``hf.from_pretrained(..., pack_linears=False, decode_attention=False)``: torch's linears and
SDPA, whatever the library's defaults. ``--pack-linears`` (both modes; off by default) first runs the model's
dense layers outside the experts (attention projections, lm_head) through ktmoe's bf16 gemm:
``hf.pack_linears(model)`` after loading (for
scaleN, in each of ours' child processes: ``KTMOE_SCALE_PACK_LINEARS=1``, read by
benchmarks/model/scale/decode_ours.py). ``--decode-attention`` (scaleN) also switches ours' eager runs to
``hf.use_decode_attention(model)`` (``KTMOE_SCALE_DECODE_ATTENTION=1``): the attention ``compile_decode``
gives the compiled runs, and the tiny mode's eager rows after it.

Each runs once to warm up (for ``compiled`` that run compiles: its time is printed), then
``--repeats`` rounds run one of each in turn, so that other processes' load falls on both alike.
Reported: time to first token (the eager prefill and the first token; best of the rounds), the
median time per later token over all rounds, decode tokens/s, and whether the greedy tokens equal
eager's (in bf16 a rounding-level tie may flip one: eager's top-2 margin there is printed). Times
come from a streamer that clocks each token as ``generate`` emits it.
"""
import argparse
import os
import shutil
import statistics
import time

from ktmoe_harness.checkpoint import checkpoint_for, make_workdir
from ktmoe_harness.generate import TokenClock, load_timed, seeded_prompt
from ktmoe_harness.options import add_model_arguments, add_run_arguments


def timed_generate(model, prompt, new_tokens, options):
    """One greedy generate with `options` (generate keywords): (its output: sequences [1, P + N] and per-step
    logits, seconds to the first new token, [seconds between consecutive later tokens])."""
    import torch

    clock = TokenClock()
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             **options, do_sample=False, streamer=clock, output_logits=True,
                             return_dict_in_generate=True)
    times = clock.times[1:]  # clock.times[0]: the prompt, emitted before the prefill
    return out, times[0] - t0, [b - a for a, b in zip(times, times[1:])]


def interleaved(model, prompt, new_tokens, rows, repeats):
    """{name: (output, warm-up s, best first-token s, median per-token s)}: one warm-up generate per row
    (the compiled one compiles there), then `repeats` rounds taking each row in turn, so that load from
    other processes falls on every row alike; the median over all tokens of all rounds shrugs off spikes."""
    runs = {}
    for name, options in rows.items():
        t0 = time.perf_counter()
        out = timed_generate(model, prompt, new_tokens, options)[0]
        runs[name] = (out, time.perf_counter() - t0, [], [])
    for _ in range(repeats):
        for name, options in rows.items():
            _, first, gaps = timed_generate(model, prompt, new_tokens, options)
            runs[name][2].append(first)
            runs[name][3].extend(gaps)
    return {name: (out, warmup, min(firsts), statistics.median(gaps))
            for name, (out, warmup, firsts, gaps) in runs.items()}


def main(argv=None):
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--model", default="tiny")
    pick.add_argument("--pack-linears", action="store_true")
    pick.add_argument("--decode-attention", action="store_true")
    picked, rest = pick.parse_known_args(argv)
    if picked.model != "tiny":  # the 30B-class model against llama.cpp: its own options
        # read by benchmarks/model/scale/decode_ours.load_model in ours' children
        if picked.pack_linears:
            os.environ["KTMOE_SCALE_PACK_LINEARS"] = "1"
        if picked.decode_attention:
            os.environ["KTMOE_SCALE_DECODE_ATTENTION"] = "1"
        from benchmarks.model.scale import e2e

        try:
            layers = e2e.layers_of(picked.model)
        except ValueError as exc:
            pick.error(str(exc))
        return e2e.main(rest, layers)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny (this mode; the options below) or scaleN: the 30B-class "
                    "model with N layers against llama.cpp, cold and steady (benchmarks/model/scale/e2e.py; "
                    "--model scale16 --help)")
    add_model_arguments(ap)
    add_run_arguments(ap)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled run")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up of each row)")
    ap.add_argument("--pack-linears", action="store_true", help="hf.pack_linears(model) after loading: the dense "
                    "layers outside the experts through ktmoe's bf16 gemm")
    args = ap.parse_args(rest)
    args.pack_linears = picked.pack_linears

    import torch

    from torch_ktmoe import hf

    if args.threads:
        torch.set_num_threads(args.threads)
    work = make_workdir(args, "ktmoe-bench-e2e-")
    try:
        model, load_s = load_timed(checkpoint_for(args, work), None, args.format, pack_linears=False,
                                   decode_attention=False)
        if args.pack_linears:
            packed = hf.pack_linears(model)
            print(f"pack_linears: {packed.replaced} layers, {packed.packed_bytes / 2**20:.1f} MiB packed", flush=True)
        prompt = seeded_prompt(model.config.vocab_size, args.prompt_tokens)
        print(f"loaded in {load_s:.1f} s; {args.format} experts, bf16 model, {torch.get_num_threads()} threads, "
              f"prompt {args.prompt_tokens} tokens, {args.tokens} new tokens, {args.repeats} rounds", flush=True)
        compiled = hf.compile_decode(model, max_cache_len=args.prompt_tokens + args.tokens, backend=args.backend)
        # eager: transformers' default, a dynamic cache and no compilation (keywords override the model's config)
        rows = {"eager": dict(cache_implementation="dynamic", disable_compile=True), "compiled": {}}
        rows = interleaved(model, prompt, args.tokens, rows, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    eager, eager_per_token = rows["eager"][0], rows["eager"][3]
    print(f"\n{'':<10} {'warm-up s':>10} {'first token ms':>15} {'ms/token':>9} {'tok/s':>7} {'speedup':>8}  "
          f"same greedy tokens as eager")
    for name, (out, warmup, first, per_token) in rows.items():
        print(f"{name:<10} {warmup:>10.1f} {first * 1e3:>15.1f} {per_token * 1e3:>9.2f} {1 / per_token:>7.1f} "
              f"{eager_per_token / per_token:>7.2f}x  {same_tokens(out, eager, args.prompt_tokens)}")
    print(f"\ncompiled: {compiled.graphs} graph(s) ({compiled.backend_name}) for "
          f"{1 + args.repeats} generate calls of {args.tokens} tokens; first token: best of {args.repeats}, "
          f"ms/token: median over every later token of every round")


def same_tokens(out, eager, prompt_tokens) -> str:
    """"yes", or the first new token that differs and eager's top-1/top-2 logit margin there (a tie at the
    rounding level, a few ulps of the logit's dtype, flips under any change of summation order)."""
    differ = (out.sequences != eager.sequences).nonzero()
    if not len(differ):
        return "yes"
    step = int(differ[0, 1]) - prompt_tokens
    top2 = eager.logits[step][0].topk(2).values
    return f"from new token {step}: eager's top-2 margin there {float(top2[0] - top2[1]):.3g} of {float(top2[0]):.3g}"


if __name__ == "__main__":
    main()
