"""T=1 decode of the packed directory with transformers' Qwen3MoeForCausalLM: the torch_ktmoe side of
benchmarks/bench_scale.py. Run as a child process (under a memory cgroup or not):

    python -m benchmarks.scale.decode_ours PACKED_DIR ROUTING THREADS TOKENS [--anon-pack N]

hf.from_pretrained(PACKED_DIR) maps every layer's experts from their files (nothing is packed, nothing
is read up front); attention and the KV cache are transformers' own (DynamicCache). Tokens are fed
one at a time; every step's logits are argmax'ed (the greedy choice) but the fed token is the given
seeded sequence, as in the llama.cpp harness, so the router sees the same kind of inputs in both.
The non-expert weights run in KTMOE_SCALE_DTYPE (default bfloat16, the safetensors' dtype). ROUTING "zipf" sets the embedding's popularity channel (common.D0) to ZIPF_C, "uniform" leaves it 0.
Prints JSON lines: loaded, one per token (dt, cumulative major/minor faults), and the routing counts.

KTMOE_SCALE_ADVICE (an experiment on the mapping's advice, from Python, library unchanged):
  "library" (default): the arena's own MADV_RANDOM (+ MADV_HUGEPAGE): a fault reads one page;
  "normal":   madvise(MADV_NORMAL) over every packed tensor after loading: faults read around;
  "willneed": as "library", plus a pre-hook on every experts block that issues MADV_WILLNEED over the
              routed experts' byte ranges (all 8 at once) before the op runs: the kernel reads each
              range with large asynchronous requests instead of one page per fault.

--anon-pack N instead packs N random layers of experts into anonymous memory (no mmap_experts_dir),
printing a line per layer: the anonymous-mode failure demonstration under a memory cgroup.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time


def faults():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_majflt, r.ru_minflt


def emit(**kw):
    print(json.dumps(kw), flush=True)


def anon_pack(n_layers: int, threads: int):
    import torch

    from benchmarks.scale import common as C
    from benchmarks.scale.gen_packed import dense_layer
    from torch_ktmoe import KTMoE

    torch.set_num_threads(threads)
    keep = []
    t0 = time.time()
    for layer in range(n_layers):
        gate_up, down = dense_layer(layer)
        ktm = KTMoE(C.E, C.TOPK, C.H, C.I, weight_format="int8", layer_idx=layer)  # anonymous memory
        ktm.load_weights(gate_up, down)
        del gate_up, down
        keep.append(ktm)
        emit(event="anon_layer", layer=layer, packed_bytes=sum(k.packed_bytes for k in keep), t=time.time(),
             elapsed=time.time() - t0)
    emit(event="anon_done")


MADV_NORMAL, MADV_WILLNEED = 0, 3
PAGE = os.sysconf("SC_PAGE_SIZE")


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _advise(libc, addr: int, nbytes: int, advice: int):
    lo = addr & ~(PAGE - 1)
    hi = (addr + nbytes + PAGE - 1) & ~(PAGE - 1)
    if libc.madvise(lo, hi - lo, advice) != 0:
        import ctypes

        raise OSError(ctypes.get_errno(), f"madvise({advice})")


def apply_advice(model, advice: str):
    from torch_ktmoe.integrations.transformers_experts import KTMoEExperts

    libc = _libc()
    adapters = [m for m in model.modules() if isinstance(m, KTMoEExperts)]
    for a in adapters:
        for w13, w2 in a.ktmoe.packed_tensors():
            if advice == "normal":
                for t in (w13, w2):
                    _advise(libc, t.data_ptr(), t.numel() * t.element_size(), MADV_NORMAL)
    if advice != "willneed":
        return

    def pre_hook(mod, args):
        ids = args[1].reshape(-1).unique().tolist()
        for w13, w2 in mod.ktmoe.packed_tensors():
            for t in (w13, w2):
                per = t.numel() * t.element_size() // t.shape[0]
                for e in ids:
                    _advise(libc, t.data_ptr() + e * per, per, MADV_WILLNEED)

    for a in adapters:
        a.register_forward_pre_hook(pre_hook)


def main():
    path, routing, threads, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if path == "--anon-pack":
        return anon_pack(int(routing), threads)
    import torch

    torch.set_num_threads(threads)
    from benchmarks.scale import common as C
    from torch_ktmoe import hf

    t0 = time.time()
    dtype = getattr(torch, os.environ.get("KTMOE_SCALE_DTYPE", "bfloat16"))
    model = hf.from_pretrained(path, dtype=dtype)
    model.eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, C.D0] = C.ZIPF_C if routing == "zipf" else 0.0
    counts = torch.zeros(C.LAYERS, C.E, dtype=torch.int64)
    layers = model.model.layers

    def hook(layer):
        def f(mod, args, out):
            counts[layer].index_add_(0, out[2].reshape(-1), torch.ones(out[2].numel(), dtype=torch.int64))
        return f

    for i, l in enumerate(layers):
        l.mlp.gate.register_forward_hook(hook(i))
    expert_s = [0.0]  # time inside the experts blocks (the op, and any advice pre-hook)

    def t_pre(mod, args):
        mod._t0 = time.perf_counter()

    def t_post(mod, args, out):
        expert_s[0] += time.perf_counter() - mod._t0

    for l in layers:
        l.mlp.experts.register_forward_pre_hook(t_pre, prepend=True)
        l.mlp.experts.register_forward_hook(t_post)
    advice = os.environ.get("KTMOE_SCALE_ADVICE", "library")
    if advice != "library":
        apply_advice(model, advice)
    maj, mnr = faults()
    emit(event="loaded", advice=advice, load_s=time.time() - t0, majflt=maj, minflt=mnr, t=time.time())
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = [int(x) for x in tokens.split(",")]
    with torch.inference_mode():
        for i, tok in enumerate(ids):
            t1 = time.time()
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            best = int(out.logits[0, -1].argmax())
            t2 = time.time()
            maj, mnr = faults()
            emit(i=i, dt=t2 - t1, majflt=maj, minflt=mnr, argmax=best, t=t2, experts_s=expert_s[0])
            expert_s[0] = 0.0
    emit(event="routing", counts=counts.tolist())


if __name__ == "__main__":
    main()
