"""Shared pieces of the 30B-class scale benchmark (benchmarks/model/bench_scale.py).

The model: Qwen3-30B-A3B's shape (48 layers, 128 experts, top-8, H=2048, I=768, 32 query heads and
4 KV heads of head_dim 128), with a small vocabulary (4096 instead of 151936: the embedding and the
LM head are then 16 MiB each instead of 594 MiB; the decode cost that matters here is the experts').

Random seeded weights. The non-expert weights (embedding, attention, norms, router, LM head) are
generated here, tensor by tensor from a seed derived from the tensor's name, so the packed directory
(ours) and the GGUF (llama.cpp) hold *the same* non-expert weights; the experts are random in both
(int8 quantized by the library from random bf16 on our side, random q8_0 blocks on llama.cpp's).

Routing is decided by the model's own router in both systems, so both see the same popularity:
  * every router row is random (logit noise of std ~1 per expert);
  * hidden dimension D0 is a "popularity channel": no layer writes to it (o_proj's and every expert's
    down_proj row D0 are zero), so the residual stream's D0 is the embedding's D0 in every layer;
  * the router's column D0 holds ZIPF_A * log(p_e) / x_D0, p_e = Zipf(s=1) over a per-layer random
    permutation of the experts.
  * routing "uniform": the embedding's column D0 is 0 -> the bias term vanishes, the top-8 of random
    logits of random tokens (uniform popularity); routing "zipf": the embedding's column D0 is
    ZIPF_C -> logits = ZIPF_A * log p_e + N(0, 1), whose top-8 inclusion rates match sampling 8 of 128
    without replacement with p ~ 1/rank (Gumbel top-k; ZIPF_A = 0.52 fitted by simulation).
Only the embedding's column D0 differs between the two routings: the benchmark sets it at load time
(ours) or rewrites it in place in the GGUF (llama.cpp).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from benchmarks import ROOT

LAYERS, E, TOPK, H, I = 48, 128, 8, 2048, 768
HEADS, KV_HEADS, HEAD_DIM = 32, 4, 128
VOCAB = 4096
ROPE_THETA, RMS_EPS = 1_000_000.0, 1e-6
D0 = 7                       # the popularity channel
ZIPF_S, ZIPF_A, ZIPF_C = 1.0, 0.52, 8.0
W_STD = 0.005                # attention / expert weights (keeps the residual dominated by the embedding)
SEED = 1234

DATA = os.environ.get("KTMOE_SCALE_DATA", "/work/scale_data")
GIB = 1 << 30


def _gen(name: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(SEED ^ int(hashlib.sha1(name.encode()).hexdigest()[:12], 16))
    return g


def hf_config() -> dict:
    return dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=VOCAB, hidden_size=H,
        intermediate_size=6144, moe_intermediate_size=I, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, num_experts=E, num_experts_per_tok=TOPK,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], hidden_act="silu",
        max_position_embeddings=4096, rope_theta=ROPE_THETA, rope_scaling=None, rms_norm_eps=RMS_EPS,
        attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False, use_cache=True,
        output_router_logits=False, router_aux_loss_coef=0.001, use_sliding_window=False, sliding_window=None,
        max_window_layers=LAYERS, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", dtype="bfloat16",
        initializer_range=0.02)


def zipf_logp(layer: int) -> np.ndarray:
    """log p_e of layer `layer`'s experts: Zipf(s) over a seeded per-layer permutation."""
    rank = np.random.default_rng(SEED + 1000 + layer).permutation(E) + 1
    p = 1.0 / rank.astype(np.float64) ** ZIPF_S
    return np.log(p / p.sum())


def x_d0_estimate() -> float:
    """x[D0] after the post-attention RMSNorm when the embedding's D0 is ZIPF_C (other dims ~N(0,1))."""
    return ZIPF_C / np.sqrt((ZIPF_C ** 2 + (H - 1)) / H)


def nonexpert_tensors(layer: int | None):
    """(hf_name, tensor bf16) of one layer's non-expert weights, or the globals when layer is None."""
    if layer is None:
        emb = torch.randn(VOCAB, H, generator=_gen("embed")).to(torch.bfloat16)
        emb[:, D0] = 0  # routing "uniform"; "zipf" sets ZIPF_C at load time
        yield "model.embed_tokens.weight", emb
        yield "model.norm.weight", torch.ones(H, dtype=torch.bfloat16)
        yield "lm_head.weight", (torch.randn(VOCAB, H, generator=_gen("lm_head")) * 0.02).to(torch.bfloat16)
        return
    p = f"model.layers.{layer}."
    yield p + "input_layernorm.weight", torch.ones(H, dtype=torch.bfloat16)
    yield p + "post_attention_layernorm.weight", torch.ones(H, dtype=torch.bfloat16)
    for n, rows, cols in (("q_proj", HEADS * HEAD_DIM, H), ("k_proj", KV_HEADS * HEAD_DIM, H),
                          ("v_proj", KV_HEADS * HEAD_DIM, H), ("o_proj", H, HEADS * HEAD_DIM)):
        w = torch.randn(rows, cols, generator=_gen(p + n)) * W_STD
        if n == "o_proj":
            w[D0] = 0  # nothing writes into the popularity channel
        yield p + f"self_attn.{n}.weight", w.to(torch.bfloat16)
    yield p + "self_attn.q_norm.weight", torch.ones(HEAD_DIM, dtype=torch.bfloat16)
    yield p + "self_attn.k_norm.weight", torch.ones(HEAD_DIM, dtype=torch.bfloat16)
    router = torch.randn(E, H, generator=_gen(p + "gate")) / np.sqrt(H)   # x ~ unit rms -> logit noise ~N(0,1)
    router[:, D0] = torch.from_numpy(ZIPF_A * zipf_logp(layer) / x_d0_estimate()).float()
    yield p + "mlp.gate.weight", router.to(torch.bfloat16)


def expert_bytes_per_token_int8() -> float:
    return LAYERS * TOPK * 3 * H * I


def nonexpert_read_bytes(layers: int, dtype_bytes: int = 2) -> dict:
    """Bytes of non-expert weights one decode token reads with `layers` layers: per layer the attention
    projections, the router and the norms; once the LM head, the final norm and one embedding row."""
    attention = 2 * (HEADS + KV_HEADS) * HEAD_DIM * H * dtype_bytes
    router = E * H * dtype_bytes
    norms = (2 * H + 2 * HEAD_DIM) * dtype_bytes
    once = (VOCAB * H + 2 * H) * dtype_bytes
    return dict(attention=layers * attention, router=layers * router, norms=layers * norms, lm_head_and_embedding=once,
                total=layers * (attention + router + norms) + once)


# ---------------------------------------------------------------- machine state
def free_disk(path: str) -> int:
    os.makedirs(path, exist_ok=True)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out


def loadavg() -> float:
    return float(open("/proc/loadavg").read().split()[0])


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def progress(it, total, desc):
    try:
        from tqdm.auto import tqdm
        return tqdm(it, total=total, desc=desc, unit="layer")
    except ImportError:
        return it


def disk_stat_path(path: str) -> str:
    """/sys/dev/block/MAJ:MIN/stat of the block device holding `path` (a partition's, where it is on one)."""
    st = os.stat(path)
    return f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"


def disk_busy_ms(stat_path: str) -> int:
    """The device's io_ticks (milliseconds it had I/O in flight; field 10 of its stat file), -1 if unreadable."""
    try:
        with open(stat_path) as f:
            return int(f.read().split()[9])
    except (OSError, IndexError, ValueError):
        return -1


def read_whole(path: str, chunk: int = 16 << 20) -> float:
    """Reads `path` through once (its pages into the page cache); returns the seconds taken."""
    t0 = time.time()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass
    return time.time() - t0


def cached_fraction(path: str) -> float:
    """Share of `path`'s pages in the page cache now (mincore over a read-only mapping)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return float("nan")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return float("nan")
            return float((np.frombuffer(vec, dtype=np.uint8) & 1).sum()) / pages
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def page_cache_state() -> dict:
    mi = meminfo()
    return dict(cached_gb_after_drop=round(mi["Cached"] / 1e9, 2), free_gb=round(mi["MemFree"] / 1e9, 2))


# ---------------------------------------------------------------- child processes
def tokens_for(seed: int, n: int) -> str:
    """`n` seeded token ids (comma separated), none of them special or byte tokens: what both systems decode."""
    rng = np.random.default_rng(seed)
    return ",".join(str(int(t)) for t in rng.integers(3 + 256, VOCAB, size=n))


def child_env(threads: int, omp_wait_policy: str) -> dict:
    """The environment both systems' children run with: the repo on the path, `threads` OpenMP threads,
    OMP_WAIT_POLICY (both are OpenMP programs; '' leaves the default)."""
    env = {"PYTHONPATH": ROOT,
           "OMP_NUM_THREADS": str(threads)}
    if omp_wait_policy:
        env["OMP_WAIT_POLICY"] = omp_wait_policy
    return env


def parse_lines(out: str) -> list:
    """The JSON objects a child printed, one a line (other lines skipped)."""
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def run_limited(argv, limit_bytes, name, timeout, env=None, cwd=None):
    """Runs argv (a new process) inside a fresh v1 memory cgroup of `limit_bytes` (None: no limit).

    Returns (returncode, stdout, stderr, wall_s, cgroup_stats) where cgroup_stats has max_usage and
    failcnt / oom_kill counts (ktmoe_harness.memcg). The child joins the cgroup before exec (python shim)."""
    from ktmoe_harness.memcg import cgroup_stats, join_code, memory_cgroup

    limited = memory_cgroup(f"{name}_{os.getpid()}", limit_bytes) if limit_bytes is not None else None
    with limited or contextlib.nullcontext() as path:
        if path:
            argv = [sys.executable, "-c", join_code(path) + "import sys\nos.execvp(sys.argv[1], sys.argv[1:])\n", *argv]
        t0 = time.time()
        env2 = {**os.environ, "KTMOE_T_SPAWN": repr(t0), **(env or {})}
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env2, cwd=cwd)
        wall = time.time() - t0
        return p.returncode, p.stdout, p.stderr, wall, cgroup_stats(path) if path else {}
