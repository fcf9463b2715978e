"""Int4-group checkpoints written offline from the public definitions of each encoding, with the weights they mean.

* compressed-tensors ``pack-quantized``: the ``compressed-tensors`` package's own quantizer and
  ``PackedQuantizationCompressor`` write ``weight_packed`` / ``weight_scale`` / ``weight_shape``
  (/ ``weight_zero_point``), and its ``decompress`` gives the dequantized weights (with fp32 scales, so
  every product is exact);
* GPTQ v1 (auto-gptq / optimum): ``qweight`` int32 [k/8, n] (input ``8 j + i`` in bits 4i.. of row j),
  ``qzeros`` int32 [G, n/8] storing z - 1, ``scales`` fp16 [G, n], ``g_idx`` int32 [k]; AWQ GEMM: ``qweight``
  [k, n/8] and ``qzeros`` [G, n/8] with the nibble order [0, 2, 4, 6, 1, 3, 5, 7], z as is. Packed here with
  shifts and ors, the way those projects describe it; the dequantized weights are ``s * (q - z)`` from the
  values before packing.
"""
from __future__ import annotations

import json
import os

import torch

CT_GROUP, GPTQ_GROUP = 32, 128
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------ compressed-tensors
def ct_scheme(group: int = CT_GROUP, symmetric: bool = True):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=group)
    return QuantizationScheme(targets=["Linear"], weights=args)


def ct_quantize(w: torch.Tensor, group: int = CT_GROUP, symmetric: bool = True):
    """w [n, k] (k % group == 0) -> ({suffix: tensor} of compressed-tensors' compressor, dequantized fp32 [n, k]
    by compressed-tensors' own decompress with fp32 scales)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = ct_scheme(group, symmetric)
    w = w.to(torch.bfloat16)
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights)
    out = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zero},
                                                scheme)
    return out, ct_dequantize(out, group, symmetric)


def ct_dequantize(tensors: dict, group: int = CT_GROUP, symmetric: bool = True) -> torch.Tensor:
    """compressed-tensors' own decompress of a module's tensors, its scale widened to fp32 first (exact)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    state = {**tensors, "weight_scale": tensors["weight_scale"].float()}
    return PackedQuantizationCompressor.decompress(state, ct_scheme(group, symmetric))["weight"]


def ct_config(group: int = CT_GROUP, symmetric: bool = True) -> dict:
    from compressed_tensors.quantization import QuantizationConfig

    config = QuantizationConfig(config_groups={"group_0": ct_scheme(group, symmetric)}, format="pack-quantized",
                                ignore=["lm_head", "re:.*mlp.gate$"], quantization_status="compressed")
    return config.to_dict()


# ------------------------------------------------------------------ GPTQ / AWQ
def _pack_rows_of_8(codes: torch.Tensor, order=range(8)) -> torch.Tensor:
    """codes [m, 8 * w] (0..15, along the last dim) -> int32 [m, w]: nibble i of word j = element 8 j + order[i]."""
    m, c = codes.shape
    c8 = _cdiv(c, 8) * 8
    padded = torch.zeros(m, c8, dtype=torch.int64)
    padded[:, :c] = codes.long()
    eights = padded.reshape(m, c8 // 8, 8)
    word = torch.zeros(m, c8 // 8, dtype=torch.int64)
    for i, o in enumerate(order):
        word |= eights[:, :, o] << (4 * i)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def gptq_quantize(w: torch.Tensor, group: int = GPTQ_GROUP, *, awq: bool = False, act_order: bool = False,
                  seed: int = 0):
    """w [n, k] -> ({qweight, qzeros, scales[, g_idx]}, dequantized fp32 [n, k]): asymmetric min / max per
    (row, group) with fp16 scales; ``act_order``: the groups are a random permutation's consecutive runs
    (GPTQ's desc_act), so ``g_idx`` is not c // group."""
    n, k = w.shape
    G = _cdiv(k, group)
    if act_order:
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
        g_idx = torch.empty(k, dtype=torch.long)
        g_idx[perm] = torch.arange(k) // group
    else:
        g_idx = torch.arange(k) // group
    w = w.float()
    scale, zero = torch.empty(n, G), torch.empty(n, G, dtype=torch.long)
    for gi in range(G):
        cols = w[:, g_idx == gi]
        lo, hi = cols.amin(1).clamp(max=0), cols.amax(1).clamp(min=0)
        s = ((hi - lo) / 15).half().float()
        s = torch.where(s > 0, s, torch.ones_like(s))
        scale[:, gi] = s
        # z >= 1 (z = 0 would be stored as -1, which a GPTQ v1 reader takes for 16) when not AWQ
        zero[:, gi] = torch.round(-lo / s).clamp(0 if awq else 1, 15).long()
    q = (torch.round(w / scale[:, g_idx]) + zero[:, g_idx]).clamp(0, 15).long()
    deq = scale[:, g_idx] * (q - zero[:, g_idx]).float()
    if awq:
        out = {"qweight": _pack_rows_of_8(q.t(), AWQ_ORDER), "qzeros": _pack_rows_of_8(zero.t(), AWQ_ORDER)}
    else:
        out = {"qweight": _pack_rows_of_8(q).t().contiguous(), "qzeros": _pack_rows_of_8(zero.t() - 1),
               "g_idx": g_idx.to(torch.int32)}
    out["scales"] = scale.t().contiguous().half()
    return out, deq


def gptq_config(group: int = GPTQ_GROUP, *, awq: bool = False, desc_act: bool = False) -> dict:
    if awq:
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": desc_act, "sym": False,
            "checkpoint_format": "gptq"}


def quantize_int4(kind: str, w: torch.Tensor, name: str, seed: int):
    """(tensors, dequantized w) of projection `name`'s weight `w` in `kind`: "ct" / "ct_asym"
    (compressed-tensors, symmetric or not), "gptq", "awq", or "gptq_down_act_order" (act-order on down_proj)."""
    if kind.startswith("ct"):
        return ct_quantize(w, symmetric=kind == "ct")
    return gptq_quantize(w, awq=kind == "awq", act_order=kind.endswith("act_order") and name == "down_proj",
                         seed=seed)


# ------------------------------------------------------------------ whole checkpoints
def _quantized(key: str, t: torch.Tensor) -> bool:
    """The weights an int4 release quantizes: 2-D linear weights, not embeddings, lm_head or the router."""
    return (t.dim() == 2 and key.endswith(".weight") and "embed" not in key and "lm_head" not in key
            and not key.endswith("mlp.gate.weight") and "norm" not in key)


KINDS = ("compressed-tensors", "gptq", "awq")


def int4_checkpoint(src, dst, kind: str, *, down_act_order: bool = False) -> str:
    """Writes ``dst``: the safetensors checkpoint ``src`` (one file) with its linear weights in int4 ``kind``
    (one of :data:`KINDS`) and the config's quantization_config, and ``dst + "-dequantized"``: the same
    model with those weights dequantized (fp32) and no quantization_config, the reference. GPTQ with
    ``down_act_order``: every ``down_proj`` (and the non-expert linears) quantized in act order. Returns dst."""
    from safetensors.torch import load_file, save_file

    dst = os.fspath(dst)
    deq_dir = dst + "-dequantized"
    os.makedirs(dst, exist_ok=True)
    os.makedirs(deq_dir, exist_ok=True)
    tensors, dequantized = {}, {}
    for key, t in load_file(os.path.join(src, "model.safetensors")).items():
        if not _quantized(key, t):
            tensors[key] = dequantized[key] = t
            continue
        module = key[: -len(".weight")]
        if kind == "compressed-tensors":
            parts, deq = ct_quantize(t)
        else:
            act = down_act_order and (key.endswith("down_proj.weight") or ".experts." not in key)
            parts, deq = gptq_quantize(t, awq=kind == "awq", act_order=act, seed=len(tensors))
        for suffix, v in parts.items():
            tensors[f"{module}.{suffix}"] = v
        dequantized[key] = deq.to(t.dtype)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    save_file(dequantized, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(deq_dir, "config.json"), "w") as f:
        json.dump(config, f)
    config["quantization_config"] = ct_config() if kind == "compressed-tensors" else \
        gptq_config(awq=kind == "awq", desc_act=down_act_order)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    gen = os.path.join(src, "generation_config.json")
    if os.path.exists(gen):
        for d in (dst, deq_dir):
            with open(gen) as f, open(os.path.join(d, "generation_config.json"), "w") as g:
                g.write(f.read())
    return dst
