"""T=1 decode of the packed directory with transformers' Qwen3MoeForCausalLM: the torch_ktmoe side of
benchmarks/model/bench_scale.py. Run as a child process (under a memory cgroup or not):

    python -m benchmarks.model.scale.decode_ours PACKED_DIR|FILE.gguf ROUTING THREADS TOKENS [--anon-pack N]

hf.from_pretrained(PACKED_DIR, pack_linears=False, decode_attention=False) maps every layer's experts from
their files (nothing is packed, nothing is read up front); a FILE.gguf instead loads through
hf.from_pretrained(dir, gguf_file=FILE.gguf, ...): the config from its metadata, the non-expert weights
dequantized into KTMOE_SCALE_DTYPE, every layer's experts the file's GGML blocks where they lie (mapped).
The dense layers, attention and the KV cache are transformers' own (DynamicCache) unless the variables below
say otherwise. Tokens are fed one at a time; every step's logits are argmax'ed (the greedy choice) but the fed token is the given
seeded sequence, as in the llama.cpp harness, so the router sees the same kind of inputs in both.
The non-expert weights run in KTMOE_SCALE_DTYPE (default bfloat16, the safetensors' dtype). ROUTING "zipf" sets the embedding's popularity channel (common.D0) to ZIPF_C, "uniform" leaves it 0.
Prints JSON lines: loaded (load_s: from before from_pretrained until the model can compute its first token;
start_s: from the parent's spawn until then: the interpreter, torch, torch_ktmoe.hf and transformers imported),
one per token (dt, cumulative major/minor faults, cumulative disk figures ``io``: read_bytes, residency hits /
misses / bytes and seconds waited, the next-layer predictor's routed / found; ``disk_ms``: the model's disk's
cumulative busy milliseconds, io_ticks), and the routing counts.

KTMOE_SCALE_PACK_LINEARS=1: hf.pack_linears(model) after loading (the dense layers outside the experts
through ktmoe's bf16 gemm; bench_e2e --pack-linears sets it). KTMOE_SCALE_DECODE_ATTENTION=1:
hf.use_decode_attention(model) (single-token decode attention as grouped matmuls; bench_e2e --decode-attention).

KTMOE_SCALE_PREFETCH: "auto" (default; KTMoE's prefetch="auto", which reads the routed experts ahead
with MADV_WILLNEED when the file-backed experts do not fit in RAM or the cgroup: here always) or "off"
(prefetch=False: a fault reads one page, the arena's mappings are MADV_RANDOM). KTMOE_SCALE_NEXT_LAYER: "off"
(default) or "auto" (next_layer_prefetch="auto": each MoE layer predicts the next one's experts from its hidden
state and queues their reads to the reader pool while the experts do not fit); KTMOE_SCALE_K_PRIME=N > 0: it
predicts N experts per token instead of k; KTMOE_SCALE_NEXT_SOURCE=layer: from the decoder layer's input (one attention
earlier) instead of the experts' input; KTMOE_SCALE_READER_THREADS=N >= 0: the reader pool's threads (0: the
next-layer reads become MADV_WILLNEED from the compute thread).

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


def io_counters(model) -> dict:
    """Cumulative disk figures: the process's read_bytes (/proc/self/io) and the residency report's totals
    (hits / misses, bytes read and seconds while the layers waited, the next-layer predictor's routed / found)."""
    from torch_ktmoe import residency_report
    from torch_ktmoe.residency.counters import process_read_bytes

    r = residency_report(model)
    return dict(read_bytes=process_read_bytes(), hits=r["hits"], misses=r["misses"], wait_bytes=r["read_bytes"],
                wait_s=r["read_seconds"], routed=r["predicted_routed"], found=r["predicted_found"])


def emit(**kw):
    print(json.dumps(kw), flush=True)


def anon_pack(n_layers: int, threads: int):
    import torch

    from benchmarks.model.scale import common as C
    from benchmarks.model.scale.gen_packed import dense_layer
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


def load_model(path: str, routing: str):
    """The packed directory as transformers' Qwen3MoeForCausalLM, experts mapped from their files
    (KTMoE's defaults: warm="auto", and prefetch="auto" unless KTMOE_SCALE_PREFETCH=off; next_layer_prefetch="auto"
    where KTMOE_SCALE_NEXT_LAYER=auto), the non-expert
    weights in KTMOE_SCALE_DTYPE, `routing` set in the embedding's popularity channel (common.py)."""
    import torch

    from benchmarks.model.scale import common as C
    from torch_ktmoe import hf

    dtype = getattr(torch, os.environ.get("KTMOE_SCALE_DTYPE", "bfloat16"))
    prefetch = os.environ.get("KTMOE_SCALE_PREFETCH", "auto")
    next_layer = os.environ.get("KTMOE_SCALE_NEXT_LAYER", "off")
    reader_threads = int(os.environ.get("KTMOE_SCALE_READER_THREADS", "-1"))
    if reader_threads >= 0:  # 0: next-layer reads become MADV_WILLNEED from the compute thread
        from torch_ktmoe.residency import reads as expert_reads

        expert_reads.set_reader_threads(reader_threads)
    kwargs = {}
    if path.endswith(".gguf"):  # the GGUF's experts in place
        path, kwargs = os.path.dirname(os.path.abspath(path)), {"gguf_file": path, "progress": False}
    model = hf.from_pretrained(path, dtype=dtype, ktmoe_kwargs={"prefetch": "auto" if prefetch == "auto" else False,
                                                               "next_layer_prefetch": "auto" if next_layer == "auto" else False},
                               pack_linears=False, decode_attention=False, **kwargs)
    k_prime = int(os.environ.get("KTMOE_SCALE_K_PRIME", "0"))
    source = os.environ.get("KTMOE_SCALE_NEXT_SOURCE", "experts")
    if next_layer == "auto" and (k_prime > 0 or source != "experts"):
        hf.attach_next_layer_prefetch(model, k_prime=k_prime or None, source=source)
    if os.environ.get("KTMOE_SCALE_PACK_LINEARS") == "1":
        hf.pack_linears(model)
    if os.environ.get("KTMOE_SCALE_DECODE_ATTENTION") == "1":
        hf.use_decode_attention(model)
    model.eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, C.D0] = C.ZIPF_C if routing == "zipf" else 0.0
    return model


def main():
    path, routing, threads, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if path == "--anon-pack":
        return anon_pack(int(routing), threads)
    import torch

    torch.set_num_threads(threads)
    from benchmarks.model.scale import common as C

    stat_path = C.disk_stat_path(path)
    from torch_ktmoe import hf  # noqa: F401 - imported before the clock starts: load_s is the load alone

    t0 = time.time()
    prefetch = os.environ.get("KTMOE_SCALE_PREFETCH", "auto")
    model = load_model(path, routing)
    prefetching = all(m.prefetching for m in model.modules() if hasattr(m, "prefetching"))
    counts = torch.zeros(C.LAYERS, C.E, dtype=torch.int64)
    layers = model.model.layers

    def hook(layer):
        def f(mod, args, out):
            counts[layer].index_add_(0, out[2].reshape(-1), torch.ones(out[2].numel(), dtype=torch.int64))
        return f

    for i, l in enumerate(layers):
        l.mlp.gate.register_forward_hook(hook(i))
    expert_s = [0.0]  # time inside the experts blocks

    def t_pre(mod, args):
        mod._t0 = time.perf_counter()

    def t_post(mod, args, out):
        expert_s[0] += time.perf_counter() - mod._t0

    for l in layers:
        l.mlp.experts.register_forward_pre_hook(t_pre, prepend=True)
        l.mlp.experts.register_forward_hook(t_post)
    maj, mnr = faults()
    spawn = float(os.environ.get("KTMOE_T_SPAWN", "nan"))  # set by the parent (common.run_limited)
    emit(event="loaded", prefetch=prefetch, prefetching=prefetching, load_s=time.time() - t0, majflt=maj, minflt=mnr,
         t=time.time(), io=io_counters(model), disk_ms=C.disk_busy_ms(stat_path), start_s=t0 - spawn)
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
            emit(i=i, dt=t2 - t1, majflt=maj, minflt=mnr, argmax=best, t=t2, experts_s=expert_s[0],
                 io=io_counters(model), disk_ms=C.disk_busy_ms(stat_path))
            expert_s[0] = 0.0
    emit(event="routing", counts=counts.tolist())


if __name__ == "__main__":
    main()
