"""Loading a GGUF model: torch_ktmoe (experts in place) against transformers' own GGUF load, in memory and time.

``python -m benchmarks.memory.bench_gguf_load [--layers 8 --hidden 1024 --experts 32 --intermediate 768]
[--mix q4_K_M] [--rounds 2]`` writes a random Qwen3-MoE of that shape as a GGUF the way llama.cpp's converter
does (``ktmoe_harness.gguf_models``: dense weights q8_0, experts in the mix's types as random sane blocks),
reads the whole file once (the page cache warm: the state every figure below is taken in; the host's reclaim
daemon drops unmapped cache pages idle for a minute, so the file is read again before each run), then loads it
in one child process per system and round, alternating, and reports per system:

* ``ready_s``: ``from_pretrained`` plus a first forward of 16 tokens;
* ``peak_anon_mib`` / ``steady_anon_mib``: anonymous RSS growth over the child's state before the load (sampled
  every 2 ms; steady: after the forward, ``gc`` and ``malloc_trim``), against the experts' bytes in the file;
* ``file_mib``: file-backed RSS after the forward (the libraries' pages too);
* ``dense_mib``: the model's parameters outside the routed experts (fp32), which every system holds; the
  growth beyond them is the experts' cost (ktmoe's target: < 5 % of the experts' bytes).

Systems: ``ktmoe`` (``torch_ktmoe.hf.from_pretrained(gguf_file=)``, fp32 dense weights) and ``transformers``
(``AutoModelForCausalLM.from_pretrained(gguf_file=)``: every tensor dequantized at load, fp32).
"""
import argparse
import json
import os
import statistics
import tempfile

from benchmarks.cli import add_out_argument, write_result
from ktmoe_harness.child import run_python

MiB = 1 << 20
MIXES = {"q4_K_M": ("Q4_K", "Q4_K", "Q6_K"), "q8_0": ("Q8_0", "Q8_0", "Q8_0")}
CHILD = r"""
import ctypes, gc, json, sys, time
from benchmarks.memory.bench_hf_paths import PeakSampler, _rss_kib
system, directory = sys.argv[1], sys.argv[2]
import torch
from transformers import AutoModelForCausalLM
import torch_ktmoe.hf as kh
before = _rss_kib("RssAnon") * 1024
sampler = PeakSampler(); sampler.start()
t0 = time.perf_counter()
if system == "ktmoe":
    model = kh.from_pretrained(directory, gguf_file="model.gguf", progress=False)
else:
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file="model.gguf", dtype=torch.float32)
with torch.no_grad():
    model(torch.arange(16).view(1, 16))
ready = time.perf_counter() - t0
peak = sampler.stop()
gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
dense = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." not in n)
print(json.dumps({"ready_s": ready, "peak_anon": peak - before, "steady_anon": _rss_kib("RssAnon") * 1024 - before,
                  "file": _rss_kib("RssFile") * 1024, "dense": dense}))
"""


def write_model(args, directory: str) -> int:
    """The GGUF of a random Qwen3-MoE of args' shape; returns its experts' bytes."""
    import gguf

    from ktmoe_harness.gguf_models import tiny_model, write_model_gguf
    from torch_ktmoe.checkpoint.gguf import expert_layers, open_gguf

    model = tiny_model("qwen3_moe", num_hidden_layers=args.layers, hidden_size=args.hidden,
                       num_attention_heads=max(1, args.hidden // 128), num_key_value_heads=max(1, args.hidden // 512),
                       head_dim=128, intermediate_size=4 * args.hidden, moe_intermediate_size=args.intermediate,
                       num_experts=args.experts, vocab_size=args.vocab)
    types = tuple(getattr(gguf.GGMLQuantizationType, t) for t in MIXES[args.mix])
    path = os.path.join(directory, "model.gguf")
    write_model_gguf(model, path, expert_types=types, dense_type=gguf.GGMLQuantizationType.Q8_0)
    return sum(layer.nbytes for layer in expert_layers(open_gguf(path)))


def read_whole(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 * MiB):
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--mix", choices=sorted(MIXES), default="q4_K_M")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--systems", default="ktmoe,transformers")
    add_out_argument(ap, "gguf_load")
    args = ap.parse_args(argv)
    systems = args.systems.split(",")
    with tempfile.TemporaryDirectory(dir=os.environ.get("KTMOE_BENCH_DIR", "/var/tmp")) as directory:
        experts = write_model(args, directory)
        size = os.path.getsize(os.path.join(directory, "model.gguf"))
        print(f"GGUF: {size / MiB:.0f} MiB, experts {experts / MiB:.0f} MiB ({args.mix}); page cache warm")
        runs = {s: [] for s in systems}
        for _ in range(args.rounds):
            for system in systems:  # alternated
                read_whole(os.path.join(directory, "model.gguf"))
                out = run_python(CHILD, [system, directory], timeout=1800)
                if out.returncode:
                    raise SystemExit(f"{system}: {out.stderr[-2000:]}")
                runs[system].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = {}
    print(f"{'system':<13} {'ready s (median/min)':>21} {'peak anon MiB':>14} {'steady anon MiB':>16} {'file MiB':>9} "
          f"{'dense MiB':>10}")
    for system, rs in runs.items():
        ready = [r["ready_s"] for r in rs]
        row = {"ready_s_median": statistics.median(ready), "ready_s_min": min(ready),
               "peak_anon_mib": max(r["peak_anon"] for r in rs) / MiB,
               "steady_anon_mib": max(r["steady_anon"] for r in rs) / MiB, "file_mib": rs[-1]["file"] / MiB,
               "dense_mib": rs[-1]["dense"] / MiB}
        rows[system] = row
        print(f"{system:<13} {row['ready_s_median']:>12.2f} / {row['ready_s_min']:<6.2f} {row['peak_anon_mib']:>14.0f} "
              f"{row['steady_anon_mib']:>16.0f} {row['file_mib']:>9.0f} {row['dense_mib']:>10.0f}")
    if "ktmoe" in rows:
        beyond = rows["ktmoe"]["steady_anon_mib"] - rows["ktmoe"]["dense_mib"]
        print(f"ktmoe's steady anonymous growth beyond the dense weights: {beyond:.0f} MiB, "
              f"{100 * beyond * MiB / experts:.1f} % of the experts' bytes")
    write_result(args.out, {"args": vars(args), "gguf_bytes": size, "experts_bytes": experts, "systems": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
