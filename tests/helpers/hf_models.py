"""Tiny random transformers MoE models built from configs (offline), and how tests compare them.

Tolerance. Models are fp32 and KTMoE packs the experts as bf16 (weight_format="bf16"),
so each expert weight is rounded to 8 mantissa bits (relative error <= 2^-9). On these
tiny random models (init std 0.02, logits ~0.5) the measured max |logit difference| is
<= 3.3e-4; :func:`assert_close_logits` asserts max|patched - reference| <= 2e-2 * max|reference|
+ 1e-3, i.e. ~100x headroom for kernels that also round activations to bf16. Greedy generate()
must give the same tokens; :func:`assert_same_greedy` reports the reference's smallest top-1/top-2
logit margin along the generated path if it does not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

SEED = 1  # chosen so the greedy path's smallest top-1/top-2 margin (2.4e-3) is >> the bf16 error (<=3.3e-4)
PROMPT = torch.tensor([[3, 17, 42, 8, 99, 5, 61, 23]])
NEW_TOKENS = 10
COMMON = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
              bos_token_id=None, eos_token_id=None)


def _configs():
    from transformers import (
        DeepseekV3Config,
        MixtralConfig,
        OlmoeConfig,
        Qwen2MoeConfig,
        Qwen3MoeConfig,
    )

    return {
        "mixtral": lambda: MixtralConfig(
            **COMMON, intermediate_size=32, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2
        ),
        "qwen2_moe": lambda: Qwen2MoeConfig(
            **COMMON,
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
        ),
        "qwen3_moe": lambda: Qwen3MoeConfig(
            **COMMON,
            head_dim=16,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
        ),
        "olmoe": lambda: OlmoeConfig(
            **COMMON, intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2
        ),
        # first_k_dense_replace=1: layer 0 is a dense MLP; grouped top-k router; one shared expert
        "deepseek_v3": lambda: DeepseekV3Config(
            vocab_size=128,
            hidden_size=64,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    }


KINDS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3"]


def make_model(kind: str, **config) -> nn.Module:
    """``kind``'s tiny fp32 model; ``config``: attributes of its config to change (e.g. ``hidden_size``)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    cfg = _configs()[kind]()
    for name, value in config.items():
        setattr(cfg, name, value)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(PROMPT, attention_mask=torch.ones_like(PROMPT)).logits


@torch.no_grad()
def greedy(model) -> tuple[torch.Tensor, torch.Tensor]:
    out = model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences, torch.stack(out.logits, 1)


def assert_same_greedy(model, ref_seq, ref_step_logits):
    """model's greedy tokens equal ref_seq; on failure, report the reference's smallest top-1/top-2 margin."""
    seq, _ = greedy(model)
    if not torch.equal(seq, ref_seq):
        top2 = ref_step_logits.float().topk(2, dim=-1).values
        margin = (top2[..., 0] - top2[..., 1]).min().item()
        pytest.fail(f"greedy tokens differ: {seq.tolist()} vs {ref_seq.tolist()} (reference min margin {margin:.3g})")


def assert_close_logits(out, ref, rel: float = 2e-2):
    err = (out - ref).abs().max().item()
    bound = rel * ref.abs().max().item() + 1e-3
    assert err <= bound, f"max |patched - reference| = {err:.3g} > {bound:.3g}"


def source_checkpoint(tmp_path, kind: str):
    """``tmp_path / "src"``: a save_pretrained checkpoint of ``make_model(kind)``."""
    src = tmp_path / "src"
    make_model(kind).save_pretrained(src)
    return src
