"""Tiny transformers MoE models written as GGUF files the way llama.cpp's converter writes them (its tensor
names, its metadata keys, a llama file's q / k rows permuted for its rope), with the `gguf` package's writer.

:func:`write_model_gguf` returns what the file holds as values under the model's parameter names (each tensor
dequantized by `gguf.quants.dequantize`, the permutation undone here, independently of the loader under test):
a reference model loaded with them must compute what a model loaded from the file computes.
"""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np
import torch

import gguf
from gguf import GGMLQuantizationType as Q

from ktmoe_harness.ggml_rows import random_rows

# transformers model_type -> (GGUF architecture, gguf's MODEL_ARCH)
ARCHS = {"qwen3_moe": ("qwen3moe", gguf.MODEL_ARCH.QWEN3MOE), "qwen2_moe": ("qwen2moe", gguf.MODEL_ARCH.QWEN2MOE),
         "mixtral": ("llama", gguf.MODEL_ARCH.LLAMA), "gpt_oss": ("gpt-oss", gguf.MODEL_ARCH.GPT_OSS),
         "deepseek_v3": ("deepseek2", gguf.MODEL_ARCH.DEEPSEEK2), "deepseek_v2": ("deepseek2", gguf.MODEL_ARCH.DEEPSEEK2),
         "glm4_moe": ("glm4moe", gguf.MODEL_ARCH.GLM4_MOE), "minimax_m2": ("minimax-m2", gguf.MODEL_ARCH.MINIMAXM2)}
QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)  # gguf.quants.quantize writes these


def tiny_config(model_type: str, **overrides):
    """A small config of `model_type` (layers, experts and widths that every GGML block size divides)."""
    from transformers import (DeepseekV2Config, DeepseekV3Config, Glm4MoeConfig, GptOssConfig, MiniMaxM2Config,
                              MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig)

    common = dict(vocab_size=96, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0)
    if model_type == "qwen3_moe":
        cfg = dict(common, head_dim=64, intermediate_size=512, moe_intermediate_size=256, num_experts=8,
                   num_experts_per_tok=2, norm_topk_prob=True)
        return Qwen3MoeConfig(**{**cfg, **overrides})
    if model_type == "qwen2_moe":
        cfg = dict(common, intermediate_size=512, moe_intermediate_size=256, shared_expert_intermediate_size=512,
                   num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, qkv_bias=True)
        return Qwen2MoeConfig(**{**cfg, **overrides})
    if model_type == "mixtral":
        cfg = dict(common, intermediate_size=256, num_local_experts=4, num_experts_per_tok=2)
        return MixtralConfig(**{**cfg, **overrides})
    if model_type == "gpt_oss":
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
        cfg = dict(common, head_dim=64, intermediate_size=256, num_local_experts=4, num_experts_per_tok=2,
                   sliding_window=4, layer_types=["sliding_attention", "full_attention"], rope_parameters=rope,
                   max_position_embeddings=131072)  # (the YaRN factor's: no warning)
        cfg.pop("rope_theta")
        return GptOssConfig(**{**cfg, **overrides})
    if model_type in ("deepseek_v3", "deepseek_v2"):  # MLA, a leading dense layer, shared experts, grouped routing
        cfg = dict(common, num_hidden_layers=3, num_key_value_heads=4, intermediate_size=512, moe_intermediate_size=256,
                   kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=8,
                   num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                   routed_scaling_factor=2.5, norm_topk_prob=True)
        if model_type == "deepseek_v3":
            return DeepseekV3Config(**{**cfg, "q_lora_rank": 64, "rope_interleave": True, **overrides})
        return DeepseekV2Config(**{**cfg, "q_lora_rank": None, "topk_method": "group_limited_greedy", **overrides})
    if model_type == "glm4_moe":  # partial rotary, qkv biases, q / k norms, a leading dense layer, shared experts
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        cfg = dict(common, num_hidden_layers=3, head_dim=64, intermediate_size=512, moe_intermediate_size=256,
                   n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                   routed_scaling_factor=1.5, norm_topk_prob=True, attention_bias=True, use_qk_norm=True,
                   rope_parameters=rope)
        cfg.pop("rope_theta")
        return Glm4MoeConfig(**{**cfg, **overrides})
    if model_type == "minimax_m2":  # partial rotary, q / k norms over all heads, sigmoid gating with a bias
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        cfg = dict(common, head_dim=64, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2,
                   rope_parameters=rope, bos_token_id=1, eos_token_id=2)
        cfg.pop("rope_theta")
        return MiniMaxM2Config(**{**cfg, **overrides})
    raise ValueError(model_type)


def tiny_model(model_type: str, seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides), dtype=torch.float32).eval()
    with torch.no_grad():  # sizes that make every layer matter (init_std 0.02 leaves the outputs near uniform)
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.05)
    return model


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's permutation of a llama q / k weight (LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(values: np.ndarray, qtype: Q, seed: int):
    """(the data to write, its raw type or None, what it holds as fp32). Types gguf cannot quantize (k-quants,
    i-quants, mxfp4) hold random sane blocks of their type instead of the values."""
    if qtype == Q.F32:
        return values.astype(np.float32), None, values.astype(np.float32)
    if qtype in QUANTIZABLE:
        data = gguf.quants.quantize(values.astype(np.float32), qtype)
    else:
        data = random_rows(qtype, values.shape, seed, sane=True)
    return data, qtype, gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(values.shape)


def _write_experts(w, layer: int, suffix: str, values: np.ndarray, types, gpt_oss: bool, seed: int) -> np.ndarray:
    """Write one experts parameter of a layer as llama.cpp's ffn_{gate,up,down}_exps (weights [E, rows, cols],
    biases [E, rows]); return what the file holds in the parameter's own layout."""
    if suffix.endswith("_bias"):  # F32, exact
        if suffix == "down_proj_bias":
            w.add_tensor(f"blk.{layer}.ffn_down_exps.bias", values)
        else:
            gate, up = (values[:, 0::2], values[:, 1::2]) if gpt_oss else np.split(values, 2, 1)
            w.add_tensor(f"blk.{layer}.ffn_gate_exps.bias", np.ascontiguousarray(gate))
            w.add_tensor(f"blk.{layer}.ffn_up_exps.bias", np.ascontiguousarray(up))
        return values
    if gpt_oss:  # to llama.cpp's [E, rows, cols] and back
        values = values.transpose(0, 2, 1)
    if suffix == "down_proj":
        data, raw, held = _encode(np.ascontiguousarray(values), types[2], seed)
        w.add_tensor(f"blk.{layer}.ffn_down_exps.weight", data, raw_dtype=raw)
    else:
        inter = values.shape[1] // 2
        gate, up = (values[:, 0::2], values[:, 1::2]) if gpt_oss else (values[:, :inter], values[:, inter:])
        halves = []
        for role, half, qtype in (("gate", gate, types[0]), ("up", up, types[1])):
            data, raw, as_held = _encode(np.ascontiguousarray(half), qtype, seed + len(halves))
            w.add_tensor(f"blk.{layer}.ffn_{role}_exps.weight", data, raw_dtype=raw)
            halves.append(as_held)
        held = np.stack(halves, 2).reshape(values.shape) if gpt_oss else np.concatenate(halves, 1)
    return np.ascontiguousarray(held.transpose(0, 2, 1)) if gpt_oss else held


def _write_kv_b(w, gguf_name: str, values: np.ndarray, cfg) -> np.ndarray:
    """kv_b_proj [heads * (nope + v), kv_lora] as attn_k_b [heads, kv_lora, nope] and attn_v_b [heads, v, kv_lora]."""
    heads, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim
    kv = values.reshape(heads, nope + cfg.v_head_dim, values.shape[-1])
    w.add_tensor(gguf_name.replace("attn_kv_b", "attn_k_b") + ".weight",
                 np.ascontiguousarray(kv[:, :nope].transpose(0, 2, 1)))
    w.add_tensor(gguf_name.replace("attn_kv_b", "attn_v_b") + ".weight", np.ascontiguousarray(kv[:, nope:]))
    return values


def _glm_metadata(w, cfg) -> None:
    """What llama.cpp's Glm4MoeModel converter writes beyond the common keys (no MTP layer here)."""
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(cfg.norm_topk_prob)


def _deepseek_metadata(w, cfg) -> None:
    """What llama.cpp's DeepseekV2Model converter writes of a DeepSeek config (MLA widths for its absorbed form)."""
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    if cfg.q_lora_rank:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    w.add_value_length(cfg.kv_lora_rank)
    w.add_key_length_mla(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    if cfg.norm_topk_prob:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)
    w.add_expert_group_count(cfg.n_group)
    w.add_expert_group_used_count(cfg.topk_group)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg.model_type == "deepseek_v3"
                             else gguf.ExpertGatingFuncType.SOFTMAX)


def write_model_gguf(model, path, *, expert_types=(Q.Q4_K, Q.Q4_K, Q.Q6_K), dense_type: Q = Q.F32,
                     layer_expert_types: Optional[Dict[int, tuple]] = None, split_max_tensors: int = 0,
                     metadata: bool = True, mtp_layers: int = 0) -> Dict[str, torch.Tensor]:
    """Write `model` (tiny_model) as a GGUF at `path`: experts in `expert_types` (gate, up, down; per layer
    `layer_expert_types`), the 2-D dense weights in `dense_type`, norms and biases in F32; `mtp_layers` appended
    multi-token-prediction layers (experts and an ``nextn.eh_proj``, counted in ``block_count``, as llama.cpp's
    GLM converter writes them). Returns the values the file holds, by parameter name (fp32)."""
    cfg = model.config
    arch, arch_id = ARCHS[cfg.model_type]
    names = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(os.fspath(path), arch=arch, split_max_tensors=split_max_tensors)
    deepseek = cfg.model_type.startswith("deepseek")
    glm = cfg.model_type == "glm4_moe"
    experts_n = getattr(cfg, "num_experts", None) or getattr(cfg, "n_routed_experts", None) or cfg.num_local_experts
    expert_width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    w.add_block_count(cfg.num_hidden_layers + mtp_layers)
    if mtp_layers:
        w.add_nextn_predict_layers(mtp_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(1 if deepseek else cfg.num_key_value_heads)  # (MLA, absorbed: one latent "head")
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if cfg.rope_parameters.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(cfg.rope_parameters["factor"])
        w.add_rope_scaling_orig_ctx_len(cfg.rope_parameters["original_max_position_embeddings"])
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    for token, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if isinstance(getattr(cfg, token, None), int):  # (the converter's special vocabulary)
            add(getattr(cfg, token))
    w.add_expert_count(experts_n)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if metadata:  # (without: the loader reads the widths from the tensors)
        w.add_vocab_size(cfg.vocab_size)
        if cfg.model_type != "mixtral":
            w.add_expert_feed_forward_length(expert_width)
        if cfg.model_type in ("qwen3_moe", "gpt_oss"):
            w.add_key_length(cfg.head_dim)
            w.add_value_length(cfg.head_dim)
        if cfg.model_type == "qwen2_moe":
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if deepseek:
        _deepseek_metadata(w, cfg)
    if glm:
        _glm_metadata(w, cfg)
    if cfg.model_type == "minimax_m2":
        w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    held: Dict[str, torch.Tensor] = {}
    gpt_oss = cfg.model_type == "gpt_oss"  # experts [E, H, 2I] / [E, I, H], gate / up interleaved, biased
    seed = 100
    for hf_name, p in model.state_dict().items():
        values = p.detach().float().numpy()
        base, _, suffix = hf_name.rpartition(".")
        if base.endswith("mlp.experts"):
            layer = int(hf_name.split(".layers.")[1].split(".")[0])
            types = (layer_expert_types or {}).get(layer, expert_types)
            seed += 1
            held[hf_name] = torch.from_numpy(_write_experts(w, layer, suffix, values, types, gpt_oss, seed))
            continue
        gguf_name = names.get_name(base)
        if hf_name.endswith("_bias") and names.get_name(hf_name[:-len("_bias")]):  # e_score_correction_bias
            gguf_name, suffix = names.get_name(hf_name[:-len("_bias")]), "bias"
        elif gguf_name is None:  # a parameter without a .weight suffix (gpt-oss's sinks): llama.cpp adds one
            gguf_name, suffix = names.get_name(hf_name), "weight"
        assert gguf_name is not None, hf_name
        if gguf_name.endswith("attn_kv_b"):  # split for the absorbed attention, as llama.cpp's converter does
            held[hf_name] = torch.from_numpy(_write_kv_b(w, gguf_name, values, cfg))
            continue
        file_values = values
        permuted = arch == "llama" and gguf_name.endswith(("attn_q", "attn_k")) and suffix == "weight"
        if permuted:
            heads = cfg.num_attention_heads if gguf_name.endswith("attn_q") else cfg.num_key_value_heads
            order = _permute(np.arange(values.shape[0])[:, None], heads)[:, 0]  # file row r is values[order[r]]
            file_values = values[order]
        if gguf_name.endswith("ffn_gate_inp_shexp"):
            file_values = values.reshape(-1)  # [1, H] in transformers, [H] in llama.cpp's files
        qtype = dense_type if file_values.ndim == 2 and suffix == "weight" else Q.F32
        seed += 1
        data, raw, as_held = _encode(file_values, qtype, seed)
        w.add_tensor(f"{gguf_name}.{suffix}", data, raw_dtype=raw)
        if permuted:  # the rows put back where the model has them
            as_held = as_held[np.argsort(order)]
        held[hf_name] = torch.from_numpy(as_held.reshape(values.shape))
    for layer in range(cfg.num_hidden_layers, cfg.num_hidden_layers + mtp_layers):
        rng = np.random.default_rng(layer)
        w.add_tensor(f"blk.{layer}.nextn.eh_proj.weight", rng.standard_normal((cfg.hidden_size, 2 * cfg.hidden_size),
                                                                              dtype=np.float32))
        for role, rows, cols in (("gate", expert_width, cfg.hidden_size), ("up", expert_width, cfg.hidden_size),
                                 ("down", cfg.hidden_size, expert_width)):
            w.add_tensor(f"blk.{layer}.ffn_{role}_exps.weight",
                         rng.standard_normal((experts_n, rows, cols), dtype=np.float32) * 0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def reference_model(model, held: Dict[str, torch.Tensor]):
    """A copy of `model` holding the values a GGUF written from it holds."""
    import copy

    ref = copy.deepcopy(model)
    ref.load_state_dict(held)
    return ref.eval()


def round_like_the_kernel(model):
    """Make `model`'s experts compute as KTMoE's kernels do (fp32 sums over bf16 activations: the expert input
    and the gated activation rounded to bf16), so a model run by torch_ktmoe must match it to fp32's rounding."""
    import types

    import torch.nn.functional as F

    def bf16(t):
        return t.bfloat16().float()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for t in range(hidden_states.shape[0]):
            x = bf16(hidden_states[t])
            for j in range(top_k_index.shape[1]):
                e = int(top_k_index[t, j])
                gate, up = (self.gate_up_proj[e] @ x).chunk(2)
                out[t] += top_k_weights[t, j] * (self.down_proj[e] @ bf16(F.silu(gate) * up))
        return out

    def gpt_oss(original_forward, original_gate):  # its own forward, the input and the gate's output rounded
        def forward(hidden_states, *args):
            return original_forward(bf16(hidden_states), *args)

        return forward, lambda gate_up: bf16(original_gate(gate_up))

    for layer in model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is None:
            continue
        if hasattr(experts, "_apply_gate"):
            experts.forward, experts._apply_gate = gpt_oss(experts.forward, experts._apply_gate)
        else:
            experts.forward = types.MethodType(forward, experts)
    return model
