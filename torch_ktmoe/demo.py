"""``python -m torch_ktmoe demo``: a Qwen3-MoE-shaped model, anonymous vs file-backed experts.

Builds a random Qwen3-MoE model offline from a config (or takes a local
checkpoint), saves it as safetensors, then in one child process per mode streams
it with ``torch_ktmoe.hf.from_pretrained`` — experts packed into anonymous
memory, or into ``MAP_SHARED`` files under a temporary directory — and generates
greedily. Prints tok/s, packed bytes and ``memory_report()`` side by side, checks
that both modes produce the same tokens and bit-identical logits, and removes
its files. Each mode runs in its own process so its memory figures are its own.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

GiB, MiB = 1 << 30, 1 << 20


def add_demo_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--checkpoint", help="a local transformers MoE checkpoint directory (default: build one)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=512, help="per-expert intermediate size")
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--format", default="bf16", choices=["bf16", "int8", "int4"], help="packed weight format")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32, help="new tokens to generate")
    ap.add_argument("--mmap-dir", default=None,
                    help="parent of the temporary experts directory (default: /var/tmp, which is disk, not tmpfs)")
    ap.add_argument("--mode", choices=["anonymous", "file", "cached"], help=argparse.SUPPRESS)  # child process
    ap.add_argument("--result", help=argparse.SUPPRESS)


def build_checkpoint(args, path: str) -> None:
    """A random Qwen3-MoE model of the requested size, saved as safetensors (bf16)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 128), num_key_value_heads=max(1, args.hidden // 512),
        head_dim=128, intermediate_size=4 * args.hidden, moe_intermediate_size=args.intermediate,
        num_experts=args.experts, num_experts_per_tok=args.top_k, decoder_sparse_step=1,
        max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)


def make_workdir(args, prefix: str) -> str:
    """A temporary directory on disk (not tmpfs) under --mmap-dir, default /var/tmp."""
    parent = args.mmap_dir or ("/var/tmp" if os.access("/var/tmp", os.W_OK) else os.getcwd())
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


def checkpoint_for(args, work: str) -> str:
    """--checkpoint, or a random Qwen3-MoE of the requested size built into work."""
    if args.checkpoint is not None:
        return args.checkpoint
    checkpoint = os.path.join(work, "checkpoint")
    print(f"building a random Qwen3-MoE model: {args.layers} layers, hidden {args.hidden}, "
          f"{args.experts} experts (top-{args.top_k}) of intermediate {args.intermediate}, "
          f"vocab {args.vocab} ...", flush=True)
    build_checkpoint(args, checkpoint)
    return checkpoint


def child_command(module: str, mode: str, result: str, checkpoint: str, work: str, args) -> list:
    """Command line re-running `module` for one mode in its own process."""
    cmd = [sys.executable, "-m", module, "--mode", mode, "--result", result, "--checkpoint", checkpoint,
           "--format", args.format, "--tokens", str(args.tokens), "--prompt-tokens", str(args.prompt_tokens),
           "--mmap-dir", work]
    return cmd + (["--threads", str(args.threads)] if args.threads else [])


def generate(model, prompt, new_tokens, progress=True):
    """Greedy decoding with a KV cache; returns (tokens, last logits, prefill s, decode s)."""
    import torch
    from tqdm.auto import tqdm

    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        prefill = time.perf_counter() - t0
        past, logits = out.cache, out.logits[:, -1]
        tokens = [int(logits.argmax(-1))]
        t0 = time.perf_counter()
        for _ in tqdm(range(new_tokens - 1), desc="  decoding", unit="tok", disable=not progress, leave=False):
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=past, use_cache=True)
            past, logits = out.cache, out.logits[:, -1]
            tokens.append(int(logits.argmax(-1)))
        decode = time.perf_counter() - t0
    return tokens, logits.float(), prefill, decode


def run_mode(args) -> int:
    """Child process: load one mode, generate, write a JSON result."""
    import torch

    import torch_ktmoe
    from torch_ktmoe import hf

    if args.threads:
        torch.set_num_threads(args.threads)
    experts_dir = None
    if args.mode == "file":
        experts_dir = tempfile.mkdtemp(prefix="experts-", dir=args.mmap_dir)
    try:
        t0 = time.perf_counter()
        model = hf.from_pretrained(args.checkpoint, mmap_experts_dir=experts_dir, weight_format=args.format,
                                   dtype=torch.bfloat16, progress=True)
        load_s = time.perf_counter() - t0
        model.eval()
        mem_load = torch_ktmoe.memory_report()
        prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_tokens),
                               generator=torch.Generator().manual_seed(1))
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
            "threads": torch.get_num_threads(),
        }
        with open(args.result, "w") as f:
            json.dump(result, f)
    finally:
        if experts_dir:
            shutil.rmtree(experts_dir, ignore_errors=True)
    return 0


def _fmt_bytes(n):
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def run_demo(args) -> int:
    if args.mode:
        return run_mode(args)
    work = make_workdir(args, "ktmoe-demo-")
    try:
        checkpoint = checkpoint_for(args, work)
        results = {}
        for mode in ("anonymous", "file"):
            print(f"\n[{mode}] loading (experts streamed into "
                  f"{'anonymous memory' if mode == 'anonymous' else 'files under ' + work}) "
                  f"and generating {args.tokens} tokens ...", flush=True)
            out = os.path.join(work, f"{mode}.json")
            cmd = child_command("torch_ktmoe", mode, out, checkpoint, work, args)
            cmd.insert(3, "demo")
            if subprocess.run(cmd).returncode != 0:
                print(f"demo: the {mode} run failed", file=sys.stderr)
                return 1
            with open(out) as f:
                results[mode] = json.load(f)
        a, f = results["anonymous"], results["file"]
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
        return 0 if same_tokens and same_logits else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
