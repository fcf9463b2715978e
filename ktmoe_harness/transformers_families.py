"""Every ``*Experts`` class of the installed transformers, built on the meta device from a tiny config of its family.

Shared by tests/test_hf_families.py (supported or refused, each family generating like its unpatched model) and
docs/gen_models.py (docs/models.md). Tiny configs: TINY's keys that a config class has go to its constructor (so
derived fields follow), per-layer lists keep one layer of each of their first kinds, OVERRIDES adds what a family
needs.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib
import os
import re

import torch
import torch.nn as nn
import transformers

MODELS = os.path.join(os.path.dirname(transformers.__file__), "models")


def experts_classes() -> dict[str, str]:
    """class name -> module name, for every ``class *Experts`` of transformers.models."""
    out = {}
    for path in sorted(glob.glob(os.path.join(MODELS, "*", "modeling_*.py"))):
        with open(path) as f:
            names = re.findall(r"^class (\w+Experts)\b", f.read(), re.M)
        module = f"transformers.models.{os.path.basename(os.path.dirname(path))}.{os.path.basename(path)[:-3]}"
        out.update({n: module for n in names})
    return out


def meta_instance(cls_name: str, module_name: str) -> nn.Module | None:
    """The class built on the meta device from a config of its family, or None if none builds it.

    Tried in order: the tiny configs (below) of the model types whose config class is in the family's
    configuration module, then their default configs, each followed by its nested configs (text_config, ...)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    cls = getattr(importlib.import_module(module_name), cls_name)
    configs = importlib.import_module(module_name.replace(".modeling_", ".configuration_"))
    types = [t for t, config_name in CONFIG_MAPPING_NAMES.items() if hasattr(configs, config_name)]
    candidates = [lambda t=t: tiny_config(t) for t in types]
    candidates += [getattr(configs, CONFIG_MAPPING_NAMES[t]) for t in types]
    while candidates:
        try:
            config = candidates.pop(0)()
            nested = [c for c in vars(config).values() if isinstance(c, transformers.PreTrainedConfig)]
            candidates += [lambda c=c: c for c in nested]
            with torch.device("meta"):
                return cls(config)
        except Exception:  # a config of another part of the model, extra constructor arguments, ...
            continue
    return None


# tiny random configs of the families added after the first five (the shapes of tests/helpers/hf_models.py): the keys
# each config class has are passed to its constructor, so derived fields (head_dim, layer_types, ...) follow
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_local_experts=8,
            n_routed_experts=8, moe_num_experts=8, num_experts_per_tok=2, moe_k=2,
            shared_expert_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1, pad_token_id=0,
            bos_token_id=None, eos_token_id=None, max_position_embeddings=256, kv_lora_rank=16, q_lora_rank=None,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1, moe_layer_freq=1,
            decoder_sparse_step=1, mlp_only_layers=[], expert_layer_period=1, expert_layer_offset=0,
            attn_layer_period=1, attn_layer_offset=0, num_shared_experts=1,
            moe_shared_expert_intermediate_size=48, linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=2,
            shared_intermediate_size=48, first_dense_layers=1, tie_word_embeddings=False, linear_num_heads=4,
            linear_head_dim=16, mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=16, hc_lowrank=16)

MLA_INDEXER = dict(num_key_value_heads=4, index_n_heads=2, index_head_dim=16, index_topk=4)  # DeepSeek sparse attention
OVERRIDES = {  # model_type -> what its tiny config needs besides TINY (keys it has no field for are set afterwards)
    "axk2": MLA_INDEXER, "deepseek_v32": MLA_INDEXER, "glm_moe_dsa": MLA_INDEXER,
    "dots3_note_text": dict(MLA_INDEXER, q_lora_rank=16, layer_types=["indexed_attention"] * 2),
    "mistral_large4_text": dict(num_key_value_heads=4), "unlimited_ocr_text": dict(num_key_value_heads=4),
    "deepseek_ocr2_text": dict(mlp_layer_types=["dense", "sparse"]),
    "glm4v_moe_text": dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5,
                                                mrope_section=[2, 1, 1])),
    "ernie4_5_vl_moe_text": dict(moe_intermediate_size=[32, 16],  # [text experts, vision experts]
                                 rope_parameters=dict(rope_type="default", rope_theta=1e4, mrope_section=[3, 3, 2])),
    "granitemoehybrid": dict(layer_types=["linear_attention", "attention"]),
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
                           indexer_compress_ratio=2),
    # transformers 5.24's talker config class has no such field, yet its MoE block reads it
    "qwen3_omni_moe_talker_text": dict(shared_expert_intermediate_size=48),
    "zaya": dict(num_experts_per_tok=1),  # ZAYA allows top-1 only (plus its skip expert)
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=0),
    "kolibri1_1": dict(index_num_heads=2),  # at most the query heads of one key head
    # gated activations with limits / softcaps: small ones, so that the clamps and caps bite in a tiny model
    # (its gate / up pre-activations are ~N(0, 1)); per-layer lists: layer 0 without a limit, layer 1 with one
    "deepseek_v4": dict(swiglu_limit=1.0), "glm5_next_text": dict(swiglu_limit=1.0, num_key_value_heads=4, qk_rope_head_dim=0, head_dim=0,
                                                                 q_lora_rank=16, index_topk=16, index_kpool=4,
                                                                 index_head_dim=16, index_n_heads=2),
    "hy_v4": dict(swiglu_limit=1.0),
    "hy_v4_vl_text": dict(swiglu_limit=1.0, rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                                                 mrope_section=[2, 1, 1])),
    "minimax_m3_vl_text": dict(swiglu_limit=1.0, swiglu_alpha=1.702),
    "bailing_hybrid": dict(swiglu_limits=[0.0, 1.0]),
    "step3p7_text": dict(swiglu_limits=[0.0, 1.0], sliding_window=8),
    "inkling2_text": dict(mlp_gate_softcap=1.5, mlp_up_softcap=2.0, unpadded_vocab_size=128),
    "inkling2_loop_text": dict(mlp_gate_softcap=1.5, mlp_up_softcap=2.0, unpadded_vocab_size=128),
    # its own names for the sizes, rope over qk_rope_head_dim, one identity ("zero") expert: the router has E + 1 rows
    "longcat_flash": dict(num_layers=2, ffn_hidden_size=64, expert_ffn_hidden_size=32, moe_topk=2, head_dim=8,
                          q_lora_rank=16, zero_expert_num=1),
}

# families whose text config's model_type names another family's config ("step3p5"): (module, class) instead
CONFIG_CLASSES = {"step3p7_text": ("transformers.models.step3p7.configuration_step3p7", "Step3p7TextConfig")}


def tiny_config(model_type: str):
    from transformers import CONFIG_MAPPING

    if model_type in CONFIG_CLASSES:
        module, name = CONFIG_CLASSES[model_type]
        cls = getattr(importlib.import_module(module), name)
    else:
        cls = CONFIG_MAPPING[model_type]
    fields = {f.name for f in dataclasses.fields(cls)}
    default = cls().to_dict()
    overrides = OVERRIDES.get(model_type, {})
    kwargs = {k: v for k, v in TINY.items() if k in fields}
    for key in fields - overrides.keys():  # per-layer lists: one layer of each of the first kinds
        value = default.get(key)
        if isinstance(value, list) and len(value) == default["num_hidden_layers"]:
            kwargs[key] = (list(dict.fromkeys(value)) + value)[: TINY["num_hidden_layers"]]
    kwargs.update((k, v) for k, v in overrides.items() if k in fields)
    while True:
        try:
            config = cls(**kwargs)
            break
        except Exception as e:  # a strict field TINY gives a value it does not accept (e.g. q_lora_rank=None)
            field = re.search(r"for field '(\w+)'", str(e))
            if field is None or field.group(1) not in kwargs or field.group(1) in overrides:
                raise
            del kwargs[field.group(1)]
    for key, value in overrides.items():
        if key not in fields:
            setattr(config, key, value)
    return config
