"""``python -m torch_ktmoe demo`` (``make demo``): a Qwen3-MoE-shaped model, anonymous vs file-backed experts.

Builds a random Qwen3-MoE model offline from a config (or takes a local
checkpoint), saves it as safetensors, then in one child process per mode streams
it with ``torch_ktmoe.hf.from_pretrained`` — experts packed into anonymous
memory, or into ``MAP_SHARED`` files under a temporary directory — and generates
greedily. Prints tok/s, packed bytes and ``memory_report()`` side by side, checks
that both modes produce the same tokens and bit-identical logits, and removes
its files. Each mode runs in its own process (``python -m ktmoe_harness.demo
--mode ...``) so its memory figures are its own.
"""
import argparse
import json
import shutil
import sys
import tempfile

from ktmoe_harness.checkpoint import checkpoint_for, make_workdir
from ktmoe_harness.child import run_child
from ktmoe_harness.generate import generate, load_timed, seeded_prompt
from ktmoe_harness.options import add_model_arguments, add_run_arguments

GiB, MiB = 1 << 30, 1 << 20
MODES = ("anonymous", "file")


def run_mode(args) -> int:
    """Child process: load one mode, generate, write a JSON result."""
    import torch

    import torch_ktmoe
    from torch_ktmoe.threads import spinning_waits

    if args.threads:
        torch.set_num_threads(args.threads)
    experts_dir = tempfile.mkdtemp(prefix="experts-", dir=args.mmap_dir) if args.mode == "file" else None
    try:
        model, load_s = load_timed(args.checkpoint, experts_dir, args.format, progress=True)
        model.eval()
        mem_load = torch_ktmoe.memory_report()
        prompt = seeded_prompt(model.config.vocab_size, args.prompt_tokens)
        generate(model, prompt, min(4, args.tokens), progress=False)  # warm-up
        tokens, logits, prefill_s, decode_s = generate(model, prompt, args.tokens)
        mem = torch_ktmoe.memory_report()
        report = model.ktmoe_report
        result = {
            "mode": args.mode, "load_s": load_s, "prefill_s": prefill_s,
            "decode_tok_s": (args.tokens - 1) / decode_s if args.tokens > 1 else None,
            "packed_bytes": report.packed_bytes, "file_backed_bytes": report.file_backed_bytes,
            "layers": report.num_layers, "anon_rss_after_load": mem_load["anon_rss_bytes"],
            "anon_rss": mem["anon_rss_bytes"], "file_rss": mem["file_rss_bytes"],
            "swap": mem["swap_bytes"], "arena_fallbacks": mem["arena_fallbacks"],
            "tokens": tokens, "logits": logits.flatten().tolist(), "isa": torch_ktmoe.active_isa(),
            "threads": torch.get_num_threads(), "spinning_waits": spinning_waits(),
        }
        with open(args.result, "w") as f:
            json.dump(result, f)
    finally:
        if experts_dir:
            shutil.rmtree(experts_dir, ignore_errors=True)
    return 0


def _fmt_bytes(n):
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def print_comparison(args, a, f) -> bool:
    """The side-by-side table of the anonymous (a) and file-backed (f) results; True when they agree exactly."""
    rows = [
        ("expert layers patched", a["layers"], f["layers"]),
        ("packed expert bytes", _fmt_bytes(a["packed_bytes"]), _fmt_bytes(f["packed_bytes"])),
        ("  of which file-backed", _fmt_bytes(a["file_backed_bytes"]), _fmt_bytes(f["file_backed_bytes"])),
        ("load time (stream + pack)", f"{a['load_s']:.1f} s", f"{f['load_s']:.1f} s"),
        ("prefill", f"{a['prefill_s'] * 1e3:.0f} ms", f"{f['prefill_s'] * 1e3:.0f} ms"),
        ("decode", f"{a['decode_tok_s']:.1f} tok/s", f"{f['decode_tok_s']:.1f} tok/s"),
        ("anonymous RSS", _fmt_bytes(a["anon_rss"]), _fmt_bytes(f["anon_rss"])),
        ("file-backed RSS", _fmt_bytes(a["file_rss"]), _fmt_bytes(f["file_rss"])),
        ("swap", _fmt_bytes(a["swap"]), _fmt_bytes(f["swap"])),
        ("arena fallbacks", a["arena_fallbacks"], f["arena_fallbacks"]),
    ]
    print(f"\nweight format {args.format}, ISA {a['isa']}, {a['threads']} threads, "
          f"{args.prompt_tokens}-token prompt, {args.tokens} new tokens\n")
    print(f"| {'':28} | {'anonymous':>14} | {'file-backed':>14} |")
    print(f"| {'-' * 28} | {'-' * 14}:| {'-' * 14}:|")
    for name, x, y in rows:
        print(f"| {name:28} | {x!s:>14} | {y!s:>14} |")
    same_tokens = a["tokens"] == f["tokens"]
    same_logits = a["logits"] == f["logits"]
    print(f"\nsame tokens: {same_tokens}; bit-identical last logits: {same_logits}; "
          f"decode speed file/anon: {f['decode_tok_s'] / a['decode_tok_s']:.2f}; "
          f"anonymous RSS saved: {_fmt_bytes(a['anon_rss'] - f['anon_rss'])}")
    print(f"tokens: {f['tokens'][:16]}{' ...' if len(f['tokens']) > 16 else ''}")
    if a["spinning_waits"] or f["spinning_waits"]:
        print("note: torch's OpenMP threads spin-waited (OMP_WAIT_POLICY is set, not PASSIVE): on shared cores "
              "decode slows far below its share (docs/threads.md)")
    return same_tokens and same_logits


def run_demo(args) -> int:
    """Parent: build (or take) the checkpoint, run each mode in a child, compare."""
    work = make_workdir(args, "ktmoe-demo-")
    try:
        checkpoint = checkpoint_for(args, work)
        results = {}
        for mode in MODES:
            print(f"\n[{mode}] loading (experts streamed into "
                  f"{'anonymous memory' if mode == 'anonymous' else 'files under ' + work}) "
                  f"and generating {args.tokens} tokens ...", flush=True)
            results[mode] = run_child("ktmoe_harness.demo", mode, checkpoint, work, args)
            if results[mode] is None:
                print(f"demo: the {mode} run failed", file=sys.stderr)
                return 1
        return 0 if print_comparison(args, results["anonymous"], results["file"]) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_ktmoe demo", description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    add_run_arguments(ap, modes=MODES)
    args = ap.parse_args(argv)
    return run_mode(args) if args.mode else run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
