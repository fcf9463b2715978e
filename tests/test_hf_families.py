"""Every experts class of the installed transformers is either supported or refused with a named reason.

Enumeration: the classes named ``*Experts`` in ``transformers/models/*/modeling_*.py`` (read as text,
then imported, then built on the meta device from a config of their family). Each supported class
generates the same greedy tokens as its unpatched model on a tiny random config, in fp32, bf16 and
fp16 (the five original families: tests/test_hf.py; the others here); every other class is refused
by ``unsupported_reason`` with a sentence that names it, and patching it raises UnsupportedExpertsError.
The README lists both sets, and this test checks that it names every class.

Tiny configs: TINY's keys that a config class has go to its constructor (so derived fields follow),
per-layer lists keep one layer of each of their first kinds, OVERRIDES adds what a family needs.
Multimodal families are tested through their text model under a plain LM head (TEXT_MODELS).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import os
import re

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

transformers = pytest.importorskip("transformers")

from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.hf import SUPPORTED_EXPERTS_CLASSES, KTMoEExperts, unsupported_reason  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402

from tests.helpers.hf_models import PROMPT, assert_close_logits, greedy, logits  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def test_every_experts_class_is_supported_or_refused_with_a_reason():
    classes = experts_classes()
    assert len(classes) > 40, "the scan found too few experts classes: did transformers move its models?"
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    supported, refused, unlisted = [], [], []
    for name, module_name in classes.items():
        if name not in readme:
            unlisted.append(name)
        inst = meta_instance(name, module_name)
        if name in SUPPORTED_EXPERTS_CLASSES:
            # (a class no config builds on meta is fine: the generation test builds a tiny one)
            assert inst is None or unsupported_reason(inst) is None, f"{name}: supported but refused"
            supported.append(name)
            continue
        if inst is None:  # not buildable from its default config: refused by name
            inst = type(name, (nn.Module,), {"__module__": module_name})()
        reason = unsupported_reason(inst)
        assert reason and name in reason, f"{name}: refusal must name the class, got {reason!r}"
        holder = nn.Module()
        holder.layers = nn.ModuleList([nn.Module()])
        holder.layers[0].mlp = nn.Module()
        holder.layers[0].mlp.experts = inst
        with pytest.raises(hf.UnsupportedExpertsError, match=name):
            hf.patch_model(holder)
        refused.append(name)
    assert not unlisted, f"README.md does not list these experts classes: {unlisted}"
    assert set(supported) == SUPPORTED_EXPERTS_CLASSES & set(classes)
    assert refused


# tiny random configs of the families added after the first five (same shapes as tests/helpers/hf_models.py): the keys
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
}

FAMILIES = {  # model_type -> its experts class
    "afmoe": "AfmoeExperts", "axk1": "AXK1Experts", "axk2": "AXK2Experts", "bailing_hybrid": "BailingHybridExperts",
    "cohere2_moe": "Cohere2MoeExperts", "deepseek_ocr2_text": "DeepseekOcr2TextExperts",
    "deepseek_v2": "DeepseekV2Experts", "deepseek_v32": "DeepseekV32Experts", "dots1": "Dots1Experts",
    "dots3_note_text": "Dots3NoteExperts", "ernie4_5_moe": "Ernie4_5_MoeExperts",
    "ernie4_5_vl_moe_text": "Ernie4_5_VLMoeMoeExperts", "exaone_moe": "ExaoneMoeExperts",
    "flex_olmo": "FlexOlmoExperts", "flint": "FlintExperts", "glm4_moe": "Glm4MoeExperts",
    "glm4_moe_lite": "Glm4MoeLiteExperts", "glm4v_moe_text": "Glm4vMoeTextExperts", "glm_moe_dsa": "GlmMoeDsaExperts",
    "granitemoe": "GraniteMoeExperts", "granitemoe_swa": "GraniteMoeSWAExperts",
    "granitemoehybrid": "GraniteMoeHybridExperts", "granitemoeshared": "GraniteMoeSharedExperts",
    "hunyuan_v1_moe": "HunYuanMoEV1Experts", "hy_v3": "HYV3Experts", "inkling_text": "InklingExperts",
    "jamba": "JambaExperts", "kimi_linear": "KimiLinearExperts", "kolibri1": "Kolibri1Experts",
    "laguna": "LagunaExperts", "lara_mini": "LaraMiniExperts", "lfm2_moe": "Lfm2MoeExperts", "mellum": "MellumExperts",
    "mimo_v2_flash": "MiMoV2FlashExperts", "minimax": "MiniMaxExperts", "minimax_m2": "MiniMaxM2Experts",
    "mistral4": "Mistral4Experts", "mistral_large4_text": "MistralLarge4TextExperts", "phimoe": "PhimoeExperts",
    "qwen3_5_moe_text": "Qwen3_5MoeExperts", "qwen3_next": "Qwen3NextExperts",
    "qwen3_omni_moe_talker_text": "Qwen3OmniMoeTalkerTextExperts",
    "qwen3_omni_moe_text": "Qwen3OmniMoeThinkerTextExperts", "qwen3_vl_moe_text": "Qwen3VLMoeTextExperts",
    "qwen4_exp_text": "Qwen4ExpTextExperts", "solar_open": "SolarOpenExperts",
    "unlimited_ocr_text": "UnlimitedOcrTextExperts", "zaya": "ZayaExperts",
}

# families without an AutoModelForCausalLM entry: their text model (or causal LM) class, built directly
# (multimodal families: the text model under a plain LM head, what their ForConditionalGeneration runs on text)
TEXT_MODELS = {
    "deepseek_ocr2_text": "DeepseekOcr2TextModel", "ernie4_5_vl_moe_text": "Ernie4_5_VLMoeTextModel",
    "glm4v_moe_text": "Glm4vMoeTextModel", "mistral4": "Mistral4ForCausalLM",
    "mistral_large4_text": "MistralLarge4TextModel", "qwen3_omni_moe_talker_text": "Qwen3OmniMoeTalkerModel",
    "qwen3_omni_moe_text": "Qwen3OmniMoeThinkerTextModel", "qwen3_vl_moe_text": "Qwen3VLMoeTextModel",
    "unlimited_ocr_text": "UnlimitedOcrTextModel",
}
DENSE_BLOCKS = {"inkling_text": {"InklingSharedExperts"}}  # *Experts modules that stay dense (strict=False)
# what the logits check passes besides the prompt: Ernie 4.5 VL sends the tokens marked as vision to its vision experts
LOGITS_INPUTS = {"ernie4_5_vl_moe_text": dict(moe_mm_token_type_ids=torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0]]))}


def tiny_config(model_type: str):
    from transformers import CONFIG_MAPPING

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
    return model.to(dtype).eval()


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


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread is ~10x faster than two on a busy 2-core machine (the op follows torch's setting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_families_table_matches_supported_set():
    assert set(FAMILIES.values()) | {"MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts", "OlmoeExperts",
                                     "DeepseekV3Experts", "GptOssExperts"} == SUPPORTED_EXPERTS_CLASSES  # gpt-oss: test_hf_gpt_oss.py


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_family_generates_like_unpatched(model_type, dtype):
    """Logits and greedy tokens of the patched model equal the unpatched one's, under the same routing.

    The routers' outputs are recorded in the unpatched runs and replayed in the patched ones: top-k is
    discontinuous, and a near-tie between two experts flips under any rounding difference upstream (seen
    in ~2 % of these tiny bf16/fp16 models, with any kernel), which would change the expert, not test it.
    With experts ~N(0, 1/fan_in) the check has teeth: a shifted expert index or a negated output fails it
    in every family (checked by hand, with KTMoEExperts.forward mutated).
    """
    model = tiny_model(model_type, dtype)
    replay_routing = hook_routers(model)
    run = lambda: model(PROMPT, attention_mask=torch.ones_like(PROMPT), **LOGITS_INPUTS.get(model_type, {})).logits
    with torch.no_grad():
        ref = run()
    ref_seq, ref_step_logits = greedy(model)
    dense = DENSE_BLOCKS.get(model_type, set())
    report = hf.patch_model(model, strict=not dense)
    assert report.replaced_classes.keys() == {FAMILIES[model_type]}
    assert {r.class_name for r in report.refused} == dense
    replay_routing()
    largest = {}  # every replaced block runs and contributes (not a model whose experts are zero or bypassed)
    for name, module in model.named_modules():
        if isinstance(module, KTMoEExperts):
            module.register_forward_hook(lambda m, a, out, n=name: largest.update({n: out.abs().max().item()}))
    with torch.no_grad():
        out = run().float()
    assert_close_logits(out, ref.float())
    assert largest.keys() == set(report.module_names) and min(largest.values()) > 0, largest
    assert_same_greedy_up_to_ties(model, ref_seq, ref_step_logits, (out - ref.float()).abs().max().item(), dtype)


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


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - set(TEXT_MODELS)))  # (hf.from_pretrained: Auto classes)
def test_family_streams_from_its_checkpoint(model_type, tmp_path):
    """hf.from_pretrained finds these families' expert keys (fused input_linear/output_linear, per-expert ...)."""
    model = tiny_model(model_type)
    model.save_pretrained(tmp_path / "ckpt")
    hf.patch_model(model, strict=model_type not in DENSE_BLOCKS)
    streamed = hf.from_pretrained(tmp_path / "ckpt", dtype=torch.float32, progress=False,
                                  strict=model_type not in DENSE_BLOCKS)
    assert streamed.ktmoe_report.layers_patched == model.ktmoe_report.layers_patched
    assert torch.equal(logits(streamed), logits(model))
