"""Decode of the packed directory through ``model.generate``, eager or with ``hf.compile_decode``: the
torch_ktmoe side of ``bench_e2e --model scaleN`` (benchmarks/model/scale/e2e.py). Run as a child process:

    python -m benchmarks.model.scale.decode_generate PACKED_DIR ROUTING TOKENS --mode MODE [--threads 2]
        [--prompt 1] [--profile 8] [--cache-len N] [--backend inductor]

* MODE ``eager``: transformers' default (a dynamic KV cache, nothing compiled); ``compiled``:
  ``hf.compile_decode(model, max_cache_len=N)`` (static cache, default len(TOKENS) positions; each
  decode step compiled with ``fullgraph=True``); the first decode step compiles (from the inductor's
  on-disk cache when an earlier process compiled the same graph: same N, same model).
* The model is decode_ours.load_model's (experts mapped from their files with KTMoE's defaults,
  warm="auto": prefaulted in the background from load on while they fit in memory).
* The first --prompt of TOKENS (comma separated) are the prompt; every new token is forced to the next of TOKENS by a
  logits processor (which records the greedy argmax first), so the model decodes the same seeded
  sequence as llama.cpp's harness and the router sees the same kind of inputs.
* Then --profile more tokens (from a 1-token prompt) under ``torch.profiler``: the time inside the
  ``ktmoe::moe_forward`` op per forward, i.e. the experts' share of a token (the profiler's own cost
  falls on the rest, which the parent takes from the unprofiled tokens instead).

Prints JSON lines: ``loaded``; one per new token: ``i``, ``dt`` (seconds since the previous token; token
0: since generate emitted the prompt), ``t`` (wall clock), cumulative major faults, bytes the background
warm has read so far, ``argmax``; ``profile``; ``compile`` (compiled mode: graphs compiled over both
generate calls, graph breaks); ``warm`` (the warm's final progress, experts' resident bytes).
"""
from __future__ import annotations

import argparse
import time

from benchmarks.model.scale.decode_ours import emit, faults, load_model

MODES = ("eager", "compiled")
EXPERTS_OP = "ktmoe::moe_forward"


def forced_tokens(forced):
    """A transformers LogitsProcessor making generate's k-th new token forced[k]; `.argmax` records the greedy
    choice before forcing."""
    import torch
    from transformers import LogitsProcessor

    class ForcedTokens(LogitsProcessor):
        def __init__(self):
            self.argmax = []

        def __call__(self, input_ids, scores):
            k = len(self.argmax)
            self.argmax.append(int(scores[0].argmax()))
            out = torch.full_like(scores, float("-inf"))
            out[:, forced[k]] = 0.0
            return out

    return ForcedTokens()


def model_warm(model):
    """The model's background warm (KTMoE.model_warm), or None (anonymous experts, warm="none")."""
    return next((m.model_warm for m in model.modules() if getattr(m, "model_warm", None) is not None), None)


def run_generate(model, tokens, prompt, clock=None):
    """model.generate over `tokens` (the first `prompt` as the prompt, then each new token forced to the next);
    returns the forcing processor (its greedy argmax per step)."""
    import torch
    from transformers import LogitsProcessorList

    forcing = forced_tokens(tokens[prompt:])
    ids = torch.tensor([tokens[:prompt]])
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(tokens) - prompt,
                       do_sample=False, logits_processor=LogitsProcessorList([forcing]), streamer=clock)
    return forcing


def profiled_experts_s(model, tokens, n: int) -> dict:
    """Seconds per forward inside the experts op over `n` forwards (1-token prompt + n - 1 decode steps)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        run_generate(model, tokens[:n + 1], 1)
        wall = time.perf_counter() - t0
    calls = [e for e in prof.events() if e.name == EXPERTS_OP]
    return dict(forwards=n, op_calls=len(calls), experts_s=sum(e.cpu_time_total for e in calls) * 1e-6 / n,
                profiled_s=wall / n)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="the packed model directory")
    ap.add_argument("routing", choices=("uniform", "zipf"))
    ap.add_argument("tokens", type=lambda s: [int(x) for x in s.split(",")], help="comma-separated token ids")
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=1, help="how many of the tokens are the prompt")
    ap.add_argument("--profile", type=int, default=8, help="forwards profiled after the timed ones (0: none)")
    ap.add_argument("--cache-len", type=int, default=None, help="compiled: static cache positions (default: tokens)")
    ap.add_argument("--backend", default="inductor", help="compiled: torch.compile backend")
    args = ap.parse_args(argv)
    if not 1 <= args.prompt < len(args.tokens):
        ap.error(f"--prompt must leave at least one token to generate: {args.prompt} of {len(args.tokens)}")
    if not 0 <= args.profile < len(args.tokens):
        ap.error(f"--profile must be 0..{len(args.tokens) - 1} (it decodes that many of the tokens), got {args.profile}")
    args.cache_len = args.cache_len or len(args.tokens)
    if args.cache_len < len(args.tokens):
        ap.error(f"--cache-len {args.cache_len} cannot hold the {len(args.tokens)} tokens")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch

    from ktmoe_harness.generate import TokenClock
    from torch_ktmoe import hf

    torch.set_num_threads(args.threads)
    t0 = time.time()
    model = load_model(args.path, args.routing)
    warm = model_warm(model)
    maj, mnr = faults()
    emit(event="loaded", mode=args.mode, load_s=time.time() - t0, majflt=maj, minflt=mnr, t=time.time(),
         warm_running=bool(warm and warm.running))
    compiled = None
    if args.mode == "compiled":
        compiled = hf.compile_decode(model, max_cache_len=args.cache_len, backend=args.backend)
    wall_offset = time.time() - time.perf_counter()
    clock = TokenClock(probe=lambda: (faults()[0], warm.warmed_bytes if warm else 0))
    forcing = run_generate(model, args.tokens, args.prompt, clock)
    times = clock.times  # [0]: the prompt, emitted before the prefill
    for i in range(1, len(times)):
        maj, warmed = clock.probes[i]
        emit(i=i - 1, dt=times[i] - times[i - 1], t=times[i] + wall_offset, majflt=maj, warmed_bytes=warmed,
             argmax=forcing.argmax[i - 1])
    graphs_main = compiled.graphs if compiled else 0
    if args.profile > 0:
        emit(event="profile", **profiled_experts_s(model, args.tokens, args.profile))
    if compiled is not None:
        counters = torch._dynamo.utils.counters
        emit(event="compile", backend=compiled.backend_name, graphs_after_first_generate=graphs_main,
             graphs=compiled.graphs, graph_breaks=sum(counters["graph_break"].values()),
             unique_graphs=counters["stats"]["unique_graphs"])
    if warm is not None:
        emit(event="warm", **{k: v for k, v in warm.progress().items() if k != "directory"})


if __name__ == "__main__":
    main()
