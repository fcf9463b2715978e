"""Peak and steady anonymous RSS of the ways into a Hugging Face model, on the demo checkpoint.

``python -m benchmarks.memory.bench_hf_paths [--format bf16] [--layers 8 ...]`` builds the demo's random
Qwen3-MoE checkpoint (``ktmoe_harness.checkpoint``, bf16 safetensors), then loads it in one
child process per path and reports, per path: peak anonymous RSS (``RssAnon`` of
/proc/self/status sampled every 2 ms from load to the end of generation), steady anonymous RSS (after
generating, ``gc`` + ``malloc_trim``), file-backed RSS, time to ready (load + first forward) and
whether the greedy tokens equal the dense model's:

* ``dense``: ``AutoModelForCausalLM.from_pretrained`` (unpatched, the baseline);
* ``experts_implementation``: the same with ``experts_implementation="ktmoe"`` (packs each layer on
  its first forward, then releases the dense experts);
* ``experts_implementation, keep_dense``: ``KTMOE_KEEP_DENSE=1`` (the old behaviour: both copies);
* ``patch_model``: ``from_pretrained`` then ``torch_ktmoe.hf.patch_model``;
* ``hf.from_pretrained``: ``torch_ktmoe.hf.from_pretrained`` (streams the experts, never dense).

By default the packed experts are anonymous, so they count in RssAnon; ``--file-backed`` gives every
KTMoE path its own fresh ``mmap_experts_dir`` (``KTMOE_MMAP_EXPERTS_DIR`` for the experts
implementation) under the work directory.
"""
import argparse
import json
import os
import shutil
import sys
import threading
import time

from ktmoe_harness.checkpoint import checkpoint_for, make_workdir
from ktmoe_harness.child import run_child
from ktmoe_harness.options import add_model_arguments, add_run_arguments

MiB = 1 << 20
PATHS = ["dense", "experts_implementation", "experts_implementation, keep_dense", "patch_model",
         "hf.from_pretrained"]


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class PeakSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self._done = 0, threading.Event()

    def run(self):
        while not self._done.is_set():
            self.peak = max(self.peak, _rss_kib("RssAnon"))
            time.sleep(0.002)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return max(self.peak, _rss_kib("RssAnon")) * 1024


def run_mode(args) -> None:
    """Child process: load by one path, generate, write a JSON result."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    import torch_ktmoe.hf as hf
    from torch_ktmoe.memory import release_free_heap

    torch.set_num_threads(args.threads or torch.get_num_threads())
    if args.mode == "experts_implementation, keep_dense":
        os.environ["KTMOE_KEEP_DENSE"] = "1"
    os.environ["KTMOE_WEIGHT_FORMAT"] = args.format
    experts_dir = None
    if args.file_backed:
        experts_dir = os.path.join(args.mmap_dir, "experts_" + args.mode.replace(", ", "_").replace(".", "_"))
        os.environ["KTMOE_MMAP_EXPERTS_DIR"] = experts_dir
    prompt = torch.randint(0, 1000, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    base_anon = _rss_kib("RssAnon") * 1024
    sampler = PeakSampler()
    sampler.start()
    t0 = time.perf_counter()
    kw = dict(dtype=torch.bfloat16)
    if args.mode == "dense":
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, **kw)
    elif args.mode.startswith("experts_implementation"):
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, experts_implementation="ktmoe", **kw)
    elif args.mode == "patch_model":
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, **kw)
        hf.patch_model(model, weight_format=args.format, mmap_experts_dir=experts_dir)
    else:
        model = hf.from_pretrained(args.checkpoint, weight_format=args.format, progress=False,
                                   mmap_experts_dir=experts_dir, **kw)
    with torch.no_grad():
        model(prompt)
    ready = time.perf_counter() - t0
    with torch.no_grad():
        seq = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.tokens,
                             do_sample=False)
    peak = sampler.stop()
    gc.collect()
    release_free_heap()
    out = dict(path=args.mode, base_anon=base_anon, peak_anon=peak, steady_anon=_rss_kib("RssAnon") * 1024,
               file_rss=_rss_kib("RssFile") * 1024, ready_s=ready, tokens=seq[0, args.prompt_tokens:].tolist())
    with open(args.result, "w") as f:
        json.dump(out, f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    add_run_arguments(ap, modes=PATHS)
    ap.add_argument("--file-backed", action="store_true", help="packed experts in MAP_SHARED files (fresh dir per path)")
    args = ap.parse_args(argv)
    if args.mode is not None:  # child: one path
        run_mode(args)
        return 0
    work = make_workdir(args, "ktmoe_hf_paths_")
    try:
        ckpt = checkpoint_for(args, work)
        rows = []
        for path in PATHS:
            rows.append(run_child("benchmarks.memory.bench_hf_paths", path, ckpt, work, args,
                                  extra=["--file-backed"] if args.file_backed else []))
            if rows[-1] is None:
                print(f"{path}: child failed", file=sys.stderr)
                return 1
        ckpt_bytes = sum(os.path.getsize(os.path.join(ckpt, n)) for n in os.listdir(ckpt) if n.endswith(".safetensors"))
        print(f"\ncheckpoint {ckpt_bytes / MiB:.0f} MiB of bf16 safetensors, weight format {args.format}, "
              f"{'file-backed' if args.file_backed else 'anonymous'} packed experts, "
              f"{args.prompt_tokens}-token prompt, {args.tokens} new tokens; RSS above the process's "
              "start (imports included)\n")
        print("| path | peak anon RSS | steady anon RSS | file RSS | ready (load + 1st forward) | same tokens as dense |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        ref = rows[0]["tokens"]
        for r in rows:
            print(f"| {r['path']} | {(r['peak_anon'] - r['base_anon']) / MiB:.0f} MiB | "
                  f"{(r['steady_anon'] - r['base_anon']) / MiB:.0f} MiB | {r['file_rss'] / MiB:.0f} MiB | "
                  f"{r['ready_s']:.2f} s | {r['tokens'] == ref} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
