"""Bigger than RAM, proved at small scale: packed experts twice a memory cgroup's limit.

A tiny Qwen3-MoE model (built from a config, saved outside the cgroup) whose packed
bf16 experts are 2x the limit is loaded with torch_ktmoe.hf.from_pretrained in a
child process inside a cgroup-v1 memory limit, and generates a few greedy tokens:
* file-backed (mmap_experts_dir=dir): completes, logits bit-identical to an
  unconstrained anonymous run; every layer reads its routed experts ahead
  (KTMoE's prefetch="auto" sees experts that do not fit);
* anonymous, same limit: OOM-killed (returncode -9), the expected outcome.
Skips with the reason where a memory cgroup cannot be made (not root, cgroup v2 only).

Sizes. The limit cannot be small: importing torch + transformers alone costs the
child ~234 MiB of anonymous memory with the CPU torch wheel (~400 MiB with the CUDA
wheels, torch 2.14 / 2.15), and streaming one layer's dense experts (48 MiB bf16,
stacked once more before packing) adds ~100 MiB at peak. So the limit is 400 MiB, or
the child's import cost + 170 MiB where that is more (measured first, in a child), and
the experts at least 2.04x the limit: 17 x 48 MiB = 816 MiB for 400 MiB. The children
run with MALLOC_MMAP_THRESHOLD_=1 MiB so glibc hands each freed dense staging buffer back
to the kernel at once instead of keeping it in the heap (otherwise ~80 MiB of
freed heap stays charged to the cgroup). Writeback needed no help: pack_experts
starts writeback after each layer and dirty + writeback pages peaked at ~45 MiB.
"""
import pytest
import torch

from ktmoe_harness.checkpoint import build_checkpoint
from ktmoe_harness.child import run_python
from ktmoe_harness.options import ModelShape
from tests.cgroup_utils import needs_memory_cgroup, run_in_memory_cgroup

transformers = pytest.importorskip("transformers")

MiB = 1 << 20
MIN_LIMIT = 400 * MiB
LOAD_HEADROOM = 170 * MiB  # one layer's dense experts streamed, stacked, packed; generation
LAYER_BYTES = 48 * MiB     # 64 experts x (3 x 512 x 256) bf16 packed
IMPORT_COST = """
import torch, transformers, torch_ktmoe
from torch_ktmoe import hf
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon:")) * 1024)
"""


def limit_and_shape():
    """(the cgroup limit, the model): 400 MiB or the child's import cost + LOAD_HEADROOM, and experts >= 2.04x it
    (17 layers of 48 MiB for 400 MiB; the rest of the model ~20 MiB)."""
    res = run_python(IMPORT_COST, env=CHILD_ENV)
    assert res.returncode == 0, res.stderr
    limit = max(MIN_LIMIT, -(-(int(res.stdout) + LOAD_HEADROOM) // (16 * MiB)) * 16 * MiB)
    layers = max(17, -(-int(2.04 * limit) // LAYER_BYTES))
    return limit, ModelShape(layers=layers, hidden=512, intermediate=256, experts=64, top_k=4, vocab=1024)
PROMPT = [3, 17, 42, 8, 99]
NEW_TOKENS = 3
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MiB)}

CHILD = """
import sys, torch
import torch_ktmoe
from torch_ktmoe import hf
from ktmoe_harness.generate import generate
checkpoint, experts_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
torch.set_num_threads(2)
model = hf.from_pretrained(checkpoint, mmap_experts_dir=experts_dir or None, dtype=torch.bfloat16, progress=False)
tokens, logits, _, _ = generate(model, torch.tensor([%r]), %d, progress=False)
r = torch_ktmoe.memory_report()
prefetching = [m.prefetching for m in model.modules() if isinstance(m, torch_ktmoe.KTMoE)]
torch.save({"tokens": tokens, "logits": logits, "report": r, "packed": model.ktmoe_report.packed_bytes,
            "prefetching": prefetching}, out)
print("COMPLETED", r["arena_file_backed_bytes"], r["arena_fallbacks"], r["major_faults"])
""" % (PROMPT, NEW_TOKENS)


@needs_memory_cgroup
def test_file_backed_model_twice_the_limit_generates_anonymous_is_oom_killed(tmp_path):
    limit, shape = limit_and_shape()
    checkpoint = tmp_path / "checkpoint"
    build_checkpoint(shape, checkpoint)  # outside the cgroup: its page cache is not charged to the child
    experts_dir = tmp_path / "experts"
    experts_dir.mkdir()

    ref_out = tmp_path / "ref.pt"
    ref = run_python(CHILD, [checkpoint, "", ref_out], env=CHILD_ENV)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    reference = torch.load(ref_out)
    assert reference["packed"] >= 2 * limit, "the model is too small to prove anything"
    assert reference["prefetching"] and not any(reference["prefetching"])  # anonymous: nothing to read ahead

    file_out = tmp_path / "file.pt"
    res = run_in_memory_cgroup("ktmoe_test_btr_file", limit, CHILD, [checkpoint, experts_dir, file_out],
                               env=CHILD_ENV)
    assert res.returncode == 0, f"file-backed run failed under {limit // MiB} MiB: rc={res.returncode}\n" \
        + res.stdout + res.stderr[-3000:]
    got = torch.load(file_out)
    assert got["report"]["arena_fallbacks"] == 0
    assert got["report"]["arena_file_backed_bytes"] == got["packed"] == reference["packed"]
    assert got["tokens"] == reference["tokens"]
    assert torch.equal(got["logits"], reference["logits"])  # bit-identical
    assert all(got["prefetching"]), "experts 2x the limit: prefetch='auto' should read the routed experts ahead"

    anon_out = tmp_path / "anon.pt"
    res = run_in_memory_cgroup("ktmoe_test_btr_anon", limit, CHILD, [checkpoint, "", anon_out], env=CHILD_ENV)
    assert res.returncode == -9 and "COMPLETED" not in res.stdout, (
        f"the anonymous run was expected to be OOM-killed under {limit // MiB} MiB: rc={res.returncode}\n"
        + res.stdout + res.stderr[-3000:])
