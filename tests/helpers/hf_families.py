"""Tiny random models of transformers' MoE families and the checks of their generation, shared by the family
tests (tests/test_hf_families.py) and the tests that need one such model (decode attention, DeepSeek-V4 FP4).

Tiny configs: ktmoe_harness.transformers_families.tiny_config; multimodal families run their text model under a
plain LM head (TEXT_MODELS); routers are found by their [E, *] weight (moe_blocks) and can be recorded and
replayed (hook_routers).
"""
from __future__ import annotations

import importlib

import torch
import torch.nn as nn
import transformers
from torch.utils._pytree import tree_map
from transformers.modeling_outputs import CausalLMOutputWithPast

from ktmoe_harness.transformers_families import tiny_config
from tests.helpers.hf_models import PROMPT, greedy

# families without an AutoModelForCausalLM entry: their text model (or causal LM) class, built directly
# (multimodal families: the text model under a plain LM head, what their ForConditionalGeneration runs on text)
TEXT_MODELS = {
    "deepseek_ocr2_text": "DeepseekOcr2TextModel", "ernie4_5_vl_moe_text": "Ernie4_5_VLMoeTextModel",
    "glm4v_moe_text": "Glm4vMoeTextModel", "glm5_next_text": "Glm5NextTextModel", "hy_v4_vl_text": "HYV4VLTextModel",
    "step3p7_text": "Step3p7TextModel", "mistral4": "Mistral4ForCausalLM",
    "mistral_large4_text": "MistralLarge4TextModel", "qwen3_omni_moe_talker_text": "Qwen3OmniMoeTalkerModel",
    "qwen3_omni_moe_text": "Qwen3OmniMoeThinkerTextModel", "qwen3_vl_moe_text": "Qwen3VLMoeTextModel",
    "unlimited_ocr_text": "UnlimitedOcrTextModel",
}
class TextLM(transformers.PreTrainedModel, transformers.GenerationMixin):
    """A text model under a plain LM head (input embeddings looked up here: some text models only take embeddings)."""

    base_model_prefix = "model"

    def __init__(self, config, text_model_cls):
        super().__init__(config)
        self.model = text_model_cls(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, inputs_embeds=None, logits_to_keep=0, **kwargs):
        if inputs_embeds is None:
            inputs_embeds = self.model.get_input_embeddings()(input_ids)
        out = self.model(inputs_embeds=inputs_embeds, **kwargs)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return CausalLMOutputWithPast(logits=self.lm_head(hidden), past_key_values=out.past_key_values)


def tiny_model(model_type: str, dtype=torch.float32) -> nn.Module:
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    torch.manual_seed(1)
    if model_type not in TEXT_MODELS:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        family = model_type.removesuffix("_talker_text").removesuffix("_text")
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        cls = getattr(module, TEXT_MODELS[model_type])
        model = cls._from_config(config, dtype=dtype) if cls.__name__.endswith("ForCausalLM") else TextLM(config, cls)
    with torch.no_grad():
        # experts ~N(0, 1/fan_in), not the usual N(0, 0.02): their output is then as large as the residual
        # stream, so a wrong expert shows in the logits (with 0.02 it is ~1e-3 of it: halving it went unseen);
        # and some families' init leaves them at zero (Qwen3-Omni's talker)
        for _, experts in moe_blocks(model):
            experts.gate_up_proj.normal_(0, experts.gate_up_proj.shape[2] ** -0.5)
            experts.down_proj.normal_(0, experts.down_proj.shape[2] ** -0.5)
    model.to(dtype)
    keep_fp32 = getattr(model, "_keep_in_fp32_modules_strict", None) or []  # what loading keeps fp32 (Inkling 2)
    for name, param in model.named_parameters():
        if any(pattern in name for pattern in keep_fp32):
            param.data = param.data.float()
    for name, buf in model.named_buffers():
        if any(pattern in name for pattern in keep_fp32):
            buf.data = buf.data.float()
    return model.eval()


def moe_blocks(model: nn.Module):
    """(router, experts) of each MoE block; its router is the child holding the [E, *] (or [E + 1, *]) weight."""
    for block in model.modules():
        experts = getattr(block, "experts", None)
        if isinstance(getattr(experts, "gate_up_proj", None), nn.Parameter) and experts.gate_up_proj.dim() == 3:
            num_experts = experts.gate_up_proj.shape[0]
            routers = [child for child in block.children() if child is not experts and any(
                p.dim() == 2 and p.shape[0] in (num_experts, num_experts + 1) for p in child.parameters())]
            assert len(routers) == 1, f"{type(block).__name__}: cannot tell its router"
            yield routers[0], experts


def hook_routers(model: nn.Module):
    """Records each MoE router's outputs, call after call; after the returned ``replay()``, the routers return
    those instead, in the same order (cloned: blocks may normalise them in place)."""
    replaying = []
    for router, _ in moe_blocks(model):
        calls = []

        def hook(module, args, out, calls=calls):
            if not replaying:
                calls.append(tree_map(_clone, out))
                return None
            return tree_map(_clone, calls.pop(0))

        router.register_forward_hook(hook)
    return lambda: replaying.append(True)


def _clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def assert_same_greedy_up_to_ties(model, ref_seq, ref_step_logits, logit_error: float, dtype):
    """Same greedy tokens, or the first different one is where the reference's top-1/top-2 logit margin is a
    tie at the rounding level: within twice the measured logit error or two ulps of the dtype. (A bf16 logit
    has 8 bits: with 128 tokens, an exact tie or a one-ulp margin turns up in a few % of these runs, and any
    rounding difference then picks either side.)"""
    seq, _ = greedy(model)
    differ = (seq[0, PROMPT.shape[1]:] != ref_seq[0, PROMPT.shape[1]:]).nonzero()
    if len(differ):
        step = differ[0].item()
        top2 = ref_step_logits[0, step].float().topk(2).values
        margin = (top2[0] - top2[1]).item()
        tie = 2 * max(logit_error, torch.finfo(dtype).eps * top2[0].abs().item())
        assert margin <= tie, (f"greedy tokens differ from step {step}, where the reference's top-1/top-2 margin is "
                               f"{margin:.3g} > {tie:.3g}: {seq.tolist()} vs {ref_seq.tolist()}")
