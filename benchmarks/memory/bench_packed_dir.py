"""Time to ready: a packed model directory (hf.save_packed) against streaming + packing the checkpoint.

``python -m benchmarks.memory.bench_packed_dir [--format bf16] [--reps 3] [--layers 8 ...]`` builds the demo's random
Qwen3-MoE checkpoint, packs it once into a packed directory (``hf.save_packed``), then alternates, each
run in a fresh child process: ``hf.from_pretrained(checkpoint)`` (stream + pack into anonymous memory,
what a serving host without the directory does) and ``hf.from_pretrained(packed_dir)`` (maps the
experts). Load = ``from_pretrained``; ready = load + one forward (32 tokens), which also faults the
mapped experts in; the model class import is done before the clock starts in both. Prints median and
min of each and their ratios, and checks the logits are
bit-identical. Page cache is warm (the checkpoint and the directory were just written).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

from ktmoe_harness.checkpoint import checkpoint_for, make_workdir
from ktmoe_harness.child import run_child
from ktmoe_harness.options import add_model_arguments, add_run_arguments

TARGETS = ("checkpoint", "packed")  # what a child loads: the checkpoint (stream + pack) or the packed directory


def run_mode(args) -> None:
    """Child process: from_pretrained of one target, one forward; load/ready seconds and the logits."""
    import torch
    import transformers.models.qwen3_moe.modeling_qwen3_moe  # noqa: F401  (import excluded from the clock)

    import torch_ktmoe.hf as hf

    prompt = torch.arange(1, 33)[None]
    t0 = time.perf_counter()
    kw = {} if args.mode == "packed" else dict(weight_format=args.format)
    model = hf.from_pretrained(args.checkpoint, dtype=torch.bfloat16, progress=False, **kw)
    loaded = time.perf_counter() - t0
    with torch.no_grad():
        out = model(prompt).logits
    ready = time.perf_counter() - t0
    torch.save(out, args.result + ".pt")
    with open(args.result, "w") as f:
        json.dump(dict(load_s=loaded, ready_s=ready, logits=args.result + ".pt"), f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    add_run_arguments(ap, modes=TARGETS)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    if args.mode is not None:  # child: one target
        run_mode(args)
        return 0
    import torch

    import torch_ktmoe.hf as hf

    work = make_workdir(args, "ktmoe_packed_dir_")
    try:
        ckpt, packed = checkpoint_for(args, work), os.path.join(work, "packed")
        t0 = time.perf_counter()
        hf.save_packed(hf.from_pretrained(ckpt, dtype=torch.bfloat16, weight_format=args.format, progress=False), packed)
        print(f"hf.save_packed: {time.perf_counter() - t0:.2f} s (stream + pack + write)")
        times = {(t, m): [] for t in ("checkpoint", "packed") for m in ("load_s", "ready_s")}
        outs = {}
        for _ in range(args.reps):
            for target, path in zip(TARGETS, (ckpt, packed)):
                r = run_child("benchmarks.memory.bench_packed_dir", target, path, work, args, quiet=True)
                if r is None:
                    print(f"{target}: child failed", file=sys.stderr)
                    return 1
                for m in ("load_s", "ready_s"):
                    times[(target, m)].append(r[m])
                outs[target] = torch.load(r["logits"])
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        print(f"\nweight format {args.format}, {args.reps} alternating runs each, fresh process per run\n")
        print("| from_pretrained of | load, median / min | load + 1st forward, median / min |")
        print("| --- | ---: | ---: |")
        for target, label in (("checkpoint", "the checkpoint: stream + pack"), ("packed", "the packed dir: map")):
            print(f"| {label} | {med[(target, 'load_s')]:.2f} / {low[(target, 'load_s')]:.2f} s | "
                  f"{med[(target, 'ready_s')]:.2f} / {low[(target, 'ready_s')]:.2f} s |")
        for m, label in (("load_s", "load"), ("ready_s", "load + 1st forward")):
            print(f"ratio checkpoint / packed dir, {label}: median {med[('checkpoint', m)] / med[('packed', m)]:.1f}x, "
                  f"min {low[('checkpoint', m)] / low[('packed', m)]:.1f}x (target >= 10x)")
        print(f"bit-identical logits: {torch.equal(outs['checkpoint'], outs['packed'])}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
