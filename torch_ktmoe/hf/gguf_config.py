"""The transformers config of a GGUF model, read from its metadata as llama.cpp runs it.

transformers 5.25 reads a GGUF's config with a key table that drops what a MoE needs: it ignores a
``qwen3moe`` file's ``expert_feed_forward_length`` and a ``qwen2moe`` file's shared-expert width (taking its
config class's defaults), leaves Qwen3-MoE's top-k weights unnormalized (llama.cpp normalizes them), reads a
Mixtral file (``llama`` with experts) as a dense Llama, and loads no gpt-oss expert, bias or sink. Here each architecture is one row of
:data:`ARCHITECTURES`: its transformers config class and the fields llama.cpp's graph for it implies, every width
from the metadata (or, where the metadata lacks it, the tensor's shape).
"""
from __future__ import annotations

from typing import Callable, Dict

from ..checkpoint.gguf import GGUFError, GGUFModel


def _int(model: GGUFModel, key: str, default=None, *, required: bool = False):
    value = model.arch_value(key, default)
    if required and value is None:
        raise GGUFError(f"GGUF file {model.files[0].path!r} has no {model.architecture}.{key}, which its "
                        f"{model.architecture} config needs")
    if isinstance(value, list):  # a per-layer value (e.g. head_count_kv): one for every layer here
        if len(set(value)) != 1:
            raise GGUFError(f"GGUF file {model.files[0].path!r}: {model.architecture}.{key} varies by layer "
                            f"({value}); torch_ktmoe reads models whose layers agree")
        value = value[0]
    return value


def _rows(model: GGUFModel, name: str, axis: int):
    t = model.tensors.get(name)
    return None if t is None else t.shape[axis]


def _common(model: GGUFModel) -> Dict[str, object]:
    """The fields every decoder reads: widths, heads, rope, norms, vocabulary, tied embeddings, special tokens."""
    hidden = _int(model, "embedding_length", required=True)
    heads = _int(model, "attention.head_count", required=True)
    vocab = _int(model, "vocab_size") or _rows(model, "token_embd.weight", 0)
    if vocab is None:
        raise GGUFError(f"GGUF file {model.files[0].path!r} has neither a vocab_size nor token_embd.weight")
    fields = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": _int(model, "block_count", required=True),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(model, "attention.head_count_kv", heads),
        "head_dim": _int(model, "attention.key_length", hidden // heads),
        "max_position_embeddings": _int(model, "context_length", 4096),
        "rms_norm_eps": model.arch_value("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": float(model.arch_value("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in model.tensors,
    }
    for key, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("padding_token_id", "pad_token_id")):
        value = model.metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int):
            fields[field] = value
    return fields


def _expert_width(model: GGUFModel) -> int:
    width = _int(model, "expert_feed_forward_length") or _rows(model, "blk.0.ffn_gate_exps.weight", 1)
    if width is None:
        raise GGUFError(f"GGUF file {model.files[0].path!r} has no expert_feed_forward_length and no "
                        "blk.0.ffn_gate_exps.weight to read the experts' width from")
    return width


def _dense_layers(model: GGUFModel):
    """The layers without routed experts (a MoE model's leading dense layers)."""
    return [n for n in range(_int(model, "block_count", required=True))
            if f"blk.{n}.ffn_gate_exps.weight" not in model.tensors]


def _qwen3moe(model: GGUFModel):
    from transformers import Qwen3MoeConfig

    expert = _expert_width(model)
    return Qwen3MoeConfig(**_common(model), intermediate_size=_int(model, "feed_forward_length", expert),
                          moe_intermediate_size=expert, num_experts=_int(model, "expert_count", required=True),
                          num_experts_per_tok=_int(model, "expert_used_count", required=True),
                          norm_topk_prob=bool(model.arch_value("expert_weights_norm", True)),
                          mlp_only_layers=_dense_layers(model), decoder_sparse_step=1)


def _qwen2moe(model: GGUFModel):
    from transformers import Qwen2MoeConfig

    expert = _expert_width(model)
    shared = _int(model, "expert_shared_feed_forward_length") or _rows(model, "blk.0.ffn_up_shexp.weight", 1) or 0
    return Qwen2MoeConfig(**_common(model), intermediate_size=_int(model, "feed_forward_length", expert),
                          moe_intermediate_size=expert, shared_expert_intermediate_size=shared,
                          num_experts=_int(model, "expert_count", required=True),
                          num_experts_per_tok=_int(model, "expert_used_count", required=True),
                          norm_topk_prob=bool(model.arch_value("expert_weights_norm", False)),
                          mlp_only_layers=_dense_layers(model), decoder_sparse_step=1,
                          qkv_bias="blk.0.attn_q.bias" in model.tensors)


def _mixtral(model: GGUFModel):
    from transformers import MixtralConfig

    if not _int(model, "expert_count"):
        raise GGUFError(f"GGUF file {model.files[0].path!r} is a dense llama model (no llama.expert_count): "
                        "torch_ktmoe.hf.from_pretrained runs Mixture-of-Experts models; load it with transformers")
    if _dense_layers(model):
        raise GGUFError(f"GGUF file {model.files[0].path!r}: layers {_dense_layers(model)} have no routed experts; "
                        "a Mixtral model has them in every layer")
    return MixtralConfig(**_common(model), intermediate_size=_expert_width(model),
                         num_local_experts=_int(model, "expert_count"),
                         num_experts_per_tok=_int(model, "expert_used_count", required=True))


def _gpt_oss(model: GGUFModel):
    """gpt-oss: every other layer sliding-window attention (llama.cpp's swa pattern 2: the even layers), YaRN rope
    as the file's rope.scaling keys say (the fields llama.cpp does not store, gpt-oss's own), expert and attention
    biases, sinks, the clamped SwiGLU with its fixed constants."""
    from transformers import GptOssConfig

    fields = _common(model)
    theta = fields.pop("rope_theta")
    rope = {"rope_type": "default", "rope_theta": theta}
    if model.arch_value("rope.scaling.type") == "yarn":
        rope = {"rope_type": "yarn", "rope_theta": theta, "factor": float(model.arch_value("rope.scaling.factor", 1.0)),
                "original_max_position_embeddings": _int(model, "rope.scaling.original_context_length", 4096),
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    layers = fields["num_hidden_layers"]
    return GptOssConfig(**fields, intermediate_size=_expert_width(model),
                        num_local_experts=_int(model, "expert_count", required=True),
                        num_experts_per_tok=_int(model, "expert_used_count", required=True),
                        sliding_window=_int(model, "attention.sliding_window", 128), rope_parameters=rope,
                        layer_types=["sliding_attention" if n % 2 == 0 else "full_attention" for n in range(layers)])


def _shared_and_grouped(model: GGUFModel) -> Dict[str, object]:
    """The fields of DeepSeek's MoE kind (DeepSeek-V2 / V3, GLM-4.5): widths, routed and shared experts, leading
    dense layers, the routed weights' scale and normalization, grouped routing."""
    return dict(intermediate_size=_int(model, "feed_forward_length", _expert_width(model)),
                moe_intermediate_size=_expert_width(model),
                n_routed_experts=_int(model, "expert_count", required=True),
                num_experts_per_tok=_int(model, "expert_used_count", required=True),
                n_shared_experts=_int(model, "expert_shared_count", 0),
                first_k_dense_replace=_int(model, "leading_dense_block_count", 0),
                routed_scaling_factor=float(model.arch_value("expert_weights_scale", 1.0)),
                norm_topk_prob=bool(model.arch_value("expert_weights_norm", False)),
                n_group=_int(model, "expert_group_count", 1), topk_group=_int(model, "expert_group_used_count", 1))


def _deepseek2(model: GGUFModel):
    """DeepSeek-V2 / V3 / R1 / Kimi-K2 (``deepseek2``): MLA attention (llama.cpp stores it for its absorbed form:
    ``head_count_kv`` 1, ``key_length`` / ``value_length`` the latent's; the heads' widths are the ``_mla`` keys,
    or in older files ``key_length`` / ``value_length`` themselves), shared experts, leading dense layers, grouped
    routing. A sigmoid gate (``expert_gating_func`` 2, with ``exp_probs_b``) is DeepSeek-V3's config, a softmax
    one DeepSeek-V2's."""
    from transformers import DeepseekV2Config, DeepseekV3Config

    fields = _common(model)
    theta = fields.pop("rope_theta")
    rope_dim = _int(model, "rope.dimension_count", required=True)
    key = _int(model, "attention.key_length_mla") or _int(model, "attention.key_length", required=True)
    value = _int(model, "attention.value_length_mla") or _int(model, "attention.value_length", required=True)
    rope = {"rope_type": "default", "rope_theta": theta}
    if model.arch_value("rope.scaling.type") == "yarn":
        mscale = float(model.arch_value("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        rope = {"rope_type": "yarn", "rope_theta": theta, "factor": float(model.arch_value("rope.scaling.factor", 1.0)),
                "original_max_position_embeddings": _int(model, "rope.scaling.original_context_length", 4096),
                "beta_fast": float(model.arch_value("rope.scaling.yarn_beta_fast", 32.0)),
                "beta_slow": float(model.arch_value("rope.scaling.yarn_beta_slow", 1.0)),
                "mscale": mscale, "mscale_all_dim": mscale}
    sigmoid = model.arch_value("expert_gating_func") == 2 or "blk.%d.exp_probs_b.bias" % _first_moe_layer(model) in \
        model.tensors
    heads = fields["num_attention_heads"]
    fields.update(num_key_value_heads=heads, head_dim=rope_dim)
    config = dict(fields, **_shared_and_grouped(model), q_lora_rank=_int(model, "attention.q_lora_rank") or None,
                  kv_lora_rank=_int(model, "attention.kv_lora_rank", required=True), qk_rope_head_dim=rope_dim,
                  qk_nope_head_dim=key - rope_dim, v_head_dim=value, rope_parameters=rope)
    if sigmoid:
        return DeepseekV3Config(**config, rope_interleave=True)
    return DeepseekV2Config(**config, topk_method="group_limited_greedy" if config["n_group"] > 1 else "greedy")


def _glm4moe(model: GGUFModel):
    """GLM-4.5 / 4.6 (``glm4moe``): partial rotary (``rope.dimension_count`` of ``key_length``), shared experts,
    leading dense layers, sigmoid gating with ``exp_probs_b``; the multi-token-prediction layers llama.cpp appends
    (``nextn_predict_layers``, counted in ``block_count``) are not the model's."""
    from transformers import Glm4MoeConfig

    fields = _common(model)
    theta = fields.pop("rope_theta")
    mtp = _int(model, "nextn_predict_layers", 0)
    fields["num_hidden_layers"] -= mtp
    rope_dim = _int(model, "rope.dimension_count", fields["head_dim"])
    return Glm4MoeConfig(**fields, **_shared_and_grouped(model), attention_bias="blk.0.attn_q.bias" in model.tensors,
                         use_qk_norm="blk.0.attn_q_norm.weight" in model.tensors,
                         rope_parameters={"rope_type": "default", "rope_theta": theta,
                                          "partial_rotary_factor": rope_dim / fields["head_dim"]})


def _minimax_m2(model: GGUFModel):
    """MiniMax-M2 (``minimax-m2``): partial rotary (``rope.dimension_count``), q / k norms over all heads, sigmoid
    gating with ``exp_probs_b``, normalized top-k weights."""
    from transformers import MiniMaxM2Config

    fields = _common(model)
    theta = fields.pop("rope_theta")
    rope_dim = _int(model, "rope.dimension_count", fields["head_dim"])
    return MiniMaxM2Config(**fields, intermediate_size=_expert_width(model),
                           num_local_experts=_int(model, "expert_count", required=True),
                           num_experts_per_tok=_int(model, "expert_used_count", required=True),
                           rope_parameters={"rope_type": "default", "rope_theta": theta,
                                            "partial_rotary_factor": rope_dim / fields["head_dim"]})


def _first_moe_layer(model: GGUFModel) -> int:
    dense = set(_dense_layers(model))
    return next((n for n in range(_int(model, "block_count", required=True)) if n not in dense), 0)


# GGUF architecture -> its transformers config (the model class follows from it).
ARCHITECTURES: Dict[str, Callable[[GGUFModel], object]] = {
    "qwen3moe": _qwen3moe,
    "qwen2moe": _qwen2moe,
    "llama": _mixtral,
    "gpt-oss": _gpt_oss,
    "deepseek2": _deepseek2,
    "glm4moe": _glm4moe,
    "minimax-m2": _minimax_m2,
}


def gguf_config(model: GGUFModel):
    """The transformers config of ``model``'s architecture (a row of :data:`ARCHITECTURES`); GGUFError naming
    the architecture when there is none."""
    arch = model.architecture
    build = ARCHITECTURES.get(arch)
    if build is None:
        raise GGUFError(f"GGUF file {model.files[0].path!r} is a {arch!r} model; torch_ktmoe.hf.from_pretrained "
                        f"reads {sorted(ARCHITECTURES)} GGUF files")
    return build(model)
