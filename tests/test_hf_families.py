"""Every experts class of the installed transformers is either supported or refused with a named reason.

Enumeration: the classes named ``*Experts`` in ``transformers/models/*/modeling_*.py`` (read as text,
then imported). Each supported class generates the same greedy tokens as its unpatched model on a
tiny random config (the five original families: tests/test_hf.py; the others here); every other
class is refused by ``unsupported_reason`` with a sentence that names it, and patching it raises
UnsupportedExpertsError. The README lists both sets, and this test checks that it names every class.
"""

from __future__ import annotations

import glob
import importlib
import os
import re

import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")

from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.integrations.transformers_experts import SUPPORTED_EXPERTS_CLASSES, unsupported_reason  # noqa: E402

from tests.test_hf import assert_close_logits, assert_same_greedy, greedy, logits  # noqa: E402

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
    """The class built on the meta device from its family's default config, or None if that is not possible."""
    module = importlib.import_module(module_name)
    cls = getattr(module, cls_name)
    configs = [getattr(module, a).config_class for a in dir(module)
               if a.endswith("PreTrainedModel") and getattr(getattr(module, a), "config_class", None) is not None]
    try:
        config = configs[0]()
        for sub in ("text_config", "thinker_config"):
            if getattr(config, sub, None) is not None and not hasattr(config, "hidden_size"):
                config = getattr(config, sub)
        with torch.device("meta"):
            return cls(config)
    except Exception:  # per-layer configs, extra constructor arguments, ...: classified by name below
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
            # (a default config that cannot build it on meta is fine: the generation test builds a tiny one)
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


# tiny random configs of the families added after the first five (same shapes as tests/test_hf.py)
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_local_experts=8,
            n_routed_experts=8, moe_num_experts=8, num_experts_per_tok=2, moe_k=2,
            shared_expert_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1, pad_token_id=0,
            bos_token_id=None, eos_token_id=None, max_position_embeddings=256, kv_lora_rank=16, q_lora_rank=None,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1, moe_layer_freq=1,
            decoder_sparse_step=1, mlp_only_layers=[], expert_layer_period=1, expert_layer_offset=0,
            attn_layer_period=1, attn_layer_offset=0, num_shared_experts=1,
            moe_shared_expert_intermediate_size=48, linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=2, sliding_window=None,
            shared_intermediate_size=48, first_dense_layers=1, tie_word_embeddings=False)

FAMILIES = {  # model_type -> its experts class
    "dots1": "Dots1Experts", "ernie4_5_moe": "Ernie4_5_MoeExperts", "exaone_moe": "ExaoneMoeExperts",
    "flex_olmo": "FlexOlmoExperts", "glm4_moe": "Glm4MoeExperts", "glm4_moe_lite": "Glm4MoeLiteExperts",
    "granitemoe": "GraniteMoeExperts", "granitemoeshared": "GraniteMoeSharedExperts",
    "hunyuan_v1_moe": "HunYuanMoEV1Experts", "jamba": "JambaExperts", "laguna": "LagunaExperts",
    "minimax": "MiniMaxExperts", "minimax_m2": "MiniMaxM2Experts", "phimoe": "PhimoeExperts",
    "qwen3_next": "Qwen3NextExperts", "solar_open": "SolarOpenExperts",
}


def tiny_model(model_type: str, dtype=torch.float32) -> nn.Module:
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    config = CONFIG_MAPPING[model_type]()
    for key, value in TINY.items():
        if key in config.to_dict() or hasattr(type(config), key):
            try:
                setattr(config, key, value)
            except Exception:  # a strict field (e.g. sliding_window must stay an int)
                pass
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) != 2:  # hybrids: one layer of each of the first kinds
        config.layer_types = (list(dict.fromkeys(layer_types)) + layer_types)[:2]
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def test_families_table_matches_supported_set():
    assert set(FAMILIES.values()) | {"MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts", "OlmoeExperts",
                                     "DeepseekV3Experts", "GptOssExperts"} == SUPPORTED_EXPERTS_CLASSES  # gpt-oss: test_hf_gpt_oss.py


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_family_generates_like_unpatched(model_type, dtype):
    model = tiny_model(model_type, dtype)
    ref = logits(model)
    ref_seq, ref_step_logits = greedy(model)
    report = hf.patch_model(model)
    assert report.replaced_classes.keys() == {FAMILIES[model_type]} and not report.refused
    assert_close_logits(logits(model).float(), ref.float())
    assert_same_greedy(model, ref_seq, ref_step_logits)


# exaone_moe and laguna are left out: their tiny configs keep per-layer lists of the default depth,
# which transformers' from_pretrained validation rejects (from_config does not check them)
@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - {"exaone_moe", "laguna"}))
def test_family_streams_from_its_checkpoint(model_type, tmp_path):
    """hf.from_pretrained finds these families' expert keys (fused input_linear/output_linear, per-expert ...)."""
    model = tiny_model(model_type)
    model.save_pretrained(tmp_path / "ckpt")
    hf.patch_model(model)
    streamed = hf.from_pretrained(tmp_path / "ckpt", dtype=torch.float32, progress=False)
    assert streamed.ktmoe_report.layers_patched == model.ktmoe_report.layers_patched
    assert torch.equal(logits(streamed), logits(model))
