"""Writes the 30B-class model (see common.py) as a llama.cpp GGUF (arch qwen3moe), layer by layer.

    python -m benchmarks.model.scale.gen_gguf OUT.gguf [--layers 48]

The non-expert weights are the packed directory's (common.nonexpert_tensors, bf16; norms and the
router in f32, as llama.cpp's converter writes them); the experts are q8_0 blocks written directly
(random int8 quants, one fp16 scale per 32 weights giving std W_STD; down's row D0 zero), one tensor at
a time: the writer gets every tensor's size first, then the data in order, so memory holds at most
one expert tensor (~214 MB). A llama (SPM) vocabulary of VOCAB tokens: <unk> <s> </s>, the 256 byte
tokens, then t<i>.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from benchmarks.model.scale import common as C

Q8 = 34  # bytes per q8_0 block of 32


def bf16_bytes(t: torch.Tensor) -> np.ndarray:
    a = t.contiguous().view(torch.int16).numpy().view(np.uint8)
    return a.reshape(*t.shape[:-1], t.shape[-1] * 2)


def f32(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()


GG_NAMES = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
            "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
            "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
            "self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight": "attn_k_norm",
            "mlp.gate.weight": "ffn_gate_inp"}


def convert(hf_name: str, t: torch.Tensor):
    """(gguf name, numpy data, raw dtype or None)."""
    import gguf

    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight", bf16_bytes(t), gguf.GGMLQuantizationType.BF16
    if hf_name == "model.norm.weight":
        return "output_norm.weight", f32(t), None
    if hf_name == "lm_head.weight":
        return "output.weight", bf16_bytes(t), gguf.GGMLQuantizationType.BF16
    layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
    name = f"blk.{layer}.{GG_NAMES[rest]}.weight"
    if t.dim() == 1 or rest == "mlp.gate.weight":
        return name, f32(t), None
    return name, bf16_bytes(t), gguf.GGMLQuantizationType.BF16


def expert_q8(layer: int, which: str) -> np.ndarray:
    rows, cols = (C.H, C.I) if which == "down" else (C.I, C.H)
    rng = np.random.default_rng([C.SEED, layer, ["gate", "up", "down"].index(which)])
    a = np.frombuffer(bytearray(rng.bytes(C.E * rows * cols // 32 * Q8)), dtype=np.uint8).reshape(C.E, rows, cols // 32, Q8)
    a[..., 0:2] = np.frombuffer(np.float16(C.W_STD / 73.9).tobytes(), dtype=np.uint8)
    if which == "down":
        a[:, C.D0, :, 2:] = 0
    return a.reshape(C.E, rows, cols // 32 * Q8)


def main(argv=None):
    import gguf

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=C.LAYERS)
    args = ap.parse_args(argv)
    t0 = time.time()
    w = gguf.GGUFWriter(args.out, "qwen3moe")
    w.add_name("bench_scale qwen3moe 30B-A3B shape (random)")
    w.add_context_length(4096)
    w.add_embedding_length(C.H)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(6144)
    w.add_head_count(C.HEADS)
    w.add_head_count_kv(C.KV_HEADS)
    w.add_key_length(C.HEAD_DIM)
    w.add_value_length(C.HEAD_DIM)
    w.add_rope_freq_base(C.ROPE_THETA)
    w.add_layer_norm_rms_eps(C.RMS_EPS)
    w.add_expert_count(C.E)
    w.add_expert_used_count(C.TOPK)
    w.add_expert_feed_forward_length(C.I)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(C.VOCAB - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (C.VOCAB - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * C.VOCAB)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    # pass 1: every tensor's info (name, shape, type, size), in writing order
    def plan():
        for hf_name, t in C.nonexpert_tensors(None):
            yield ("ne", None, hf_name, t)
        for layer in range(args.layers):
            for hf_name, t in C.nonexpert_tensors(layer):
                yield ("ne", layer, hf_name, t)
            for which in ("gate", "up", "down"):
                yield ("x", layer, which, None)

    shapes = {}
    for kind, layer, name, t in plan():
        if kind == "ne":
            gname, data, raw = convert(name, t)
            w.add_tensor_info(gname, data.shape, data.dtype, data.nbytes, raw_dtype=raw)
        else:
            rows, cols = (C.H, C.I) if name == "down" else (C.I, C.H)
            shape = (C.E, rows, cols // 32 * Q8)
            w.add_tensor_info(f"blk.{layer}.ffn_{name}_exps.weight", shape, np.dtype(np.uint8),
                              int(np.prod(shape)), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    written = 0
    bar = C.progress(range(args.layers), args.layers, "gguf")
    it = plan()
    for kind, layer, name, t in it:  # globals first
        if layer is not None:
            break
        w.write_tensor_data(convert(name, t)[1])
    pending = (kind, layer, name, t)
    for target in bar:
        while pending is not None and pending[1] == target:
            kind, layer, name, t = pending
            data = convert(name, t)[1] if kind == "ne" else expert_q8(layer, name)
            w.write_tensor_data(data)
            written += data.nbytes
            pending = next(it, None)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(GB=f"{written / 1e9:.1f}", MBps=f"{written / 1e6 / (time.time() - t0):.0f}")
    w.close()
    os.sync()
    dt = time.time() - t0
    total = os.path.getsize(args.out)
    print(json.dumps(dict(file=args.out, layers=args.layers, total_bytes=total, seconds=round(dt, 1),
                          MBps=round(total / 1e6 / dt, 1))))


def set_routing(path: str, routing: str) -> None:
    """Rewrites token_embd's column D0 in place: 0 (uniform) or ZIPF_C (zipf)."""
    import gguf

    r = gguf.GGUFReader(path, "r")
    ti = next(t for t in r.tensors if t.name == "token_embd.weight")
    if ti.tensor_type != gguf.GGMLQuantizationType.BF16:
        raise ValueError(f"{path}: token_embd.weight is {ti.tensor_type.name}, set_routing writes BF16 values "
                         "(llama-quantize --token-embedding-type bf16 keeps it so)")
    off = ti.data_offset
    value = 0.0 if routing == "uniform" else C.ZIPF_C
    b = torch.tensor([value], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    fd = os.open(path, os.O_RDWR)
    try:
        for v in range(C.VOCAB):
            os.pwrite(fd, b, off + (v * C.H + C.D0) * 2)
        os.fsync(fd)
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
