"""The tiny Qwen3-MoE- and DeepSeek-V3-shaped models the quantized-checkpoint tests (FP8, int4) write and
generate with: their config, and greedy generation of a fixed prompt."""
import torch

PROMPT = torch.tensor([[3, 17, 42, 8, 99, 5, 61, 23]])


def tiny_config(kind: str):
    """``"qwen3_moe"``: Qwen3MoeConfig; anything else: DeepseekV3Config (one dense layer first, a shared expert)."""
    from transformers import DeepseekV3Config, Qwen3MoeConfig

    common = dict(vocab_size=128, hidden_size=256, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                  moe_intermediate_size=160, num_experts_per_tok=2)
    if kind == "qwen3_moe":
        return Qwen3MoeConfig(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                              intermediate_size=64, num_hidden_layers=2, num_experts=8)
    return DeepseekV3Config(**common, intermediate_size=192, num_hidden_layers=3, first_k_dense_replace=1,
                            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_group=2, topk_group=1,
                            n_shared_experts=1, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16,
                            qk_nope_head_dim=32, v_head_dim=32)


def greedy(model) -> torch.Tensor:
    """8 greedy tokens after PROMPT."""
    with torch.no_grad():
        return model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=8, do_sample=False)
