"""The defaults of hf.patch_model / hf.from_pretrained: packed dense linears (bf16 models) and decode attention.

A bf16 model gets both (its linears hold the same bf16 weights packed): the report says so, the attention
projections and lm_head are KTLinear, and the greedy tokens equal the unpatched model's and those with both
switched off. fp32 / fp16 models keep torch's linears (the report says why) and get decode attention.
``pack_linears=False`` / ``decode_attention=False`` turn each off. Explicit pack_linears /
use_decode_attention / compile_decode calls after the defaults still work, and the checkpoints a defaulted
model writes (save_pretrained, save_packed) reload.

The models are the tiny Qwen3-MoE of the other tests made wide enough (hidden 256, head_dim 64) for their
attention projections and lm_head to reach pack_linears' default min_bytes (64 KiB in bf16).
"""

import pytest
import torch
import torch.nn as nn
from transformers import AutoModelForCausalLM

from tests.helpers.fp8 import fp8_checkpoint
from tests.helpers.hf_models import greedy, make_model
from torch_ktmoe import hf
from torch_ktmoe.hf.decode_attention import NAME as DECODE_ATTENTION
from torch_ktmoe.linear import KTLinear

PACKED = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"] + ["lm_head"]
BOTH_OFF = {"pack_linears": "pack_linears=False", "decode_attention": "decode_attention=False"}


def wide_model(dtype=torch.bfloat16) -> nn.Module:
    return make_model("qwen3_moe", hidden_size=256, head_dim=64).to(dtype)


def sequence(model) -> torch.Tensor:
    return greedy(model)[0]


def packed_names(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, KTLinear)]


def assert_defaults_applied(model, report):
    assert report.linears is not None and report.linears.module_names == PACKED
    assert packed_names(model) == PACKED
    assert report.decode_attention and model.config._attn_implementation == DECODE_ATTENTION
    assert report.defaults_left == {} and model.ktmoe_report is report


def assert_defaults_off(model, report):
    assert report.linears is None and not packed_names(model)
    assert not report.decode_attention and model.config._attn_implementation == "sdpa"
    assert report.defaults_left == BOTH_OFF


@pytest.fixture(scope="module")
def bf16_reference():
    """The unpatched bf16 model's greedy tokens."""
    return sequence(wide_model())


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("defaults") / "src"
    wide_model().save_pretrained(path)
    return path


def test_bf16_patch_model_packs_and_switches(bf16_reference):
    model = wide_model()
    report = hf.patch_model(model)
    assert_defaults_applied(model, report)
    assert report.linears.packed_bytes > 0 and report.linears.dense_bytes_freed > 0
    assert torch.equal(sequence(model), bf16_reference)


def test_switches_turn_the_defaults_off(bf16_reference):
    model = wide_model()
    report = hf.patch_model(model, pack_linears=False, decode_attention=False)
    assert_defaults_off(model, report)
    assert torch.equal(sequence(model), bf16_reference)


@pytest.mark.parametrize("switch", ["pack_linears", "decode_attention"])
def test_each_switch_alone(switch):
    model = wide_model()
    report = hf.patch_model(model, **{switch: False})
    assert report.defaults_left == {switch: BOTH_OFF[switch]}
    assert bool(packed_names(model)) == (switch != "pack_linears")
    assert report.decode_attention == (switch != "decode_attention")


def test_switches_must_be_bools(bf16_checkpoint):
    model = wide_model()
    with pytest.raises(TypeError, match="pack_linears must be True or False"):
        hf.patch_model(model, pack_linears="no")
    assert not any(isinstance(m, hf.KTMoEExperts) for m in model.modules())  # refused before patching
    with pytest.raises(TypeError, match="decode_attention must be True or False"):
        hf.from_pretrained(bf16_checkpoint, decode_attention=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp32_fp16_keep_torch_linears(dtype):
    model = wide_model(dtype)
    report = hf.patch_model(model)
    assert report.linears is None and not packed_names(model)
    assert report.defaults_left["pack_linears"].startswith(f"model dtype {dtype}: packing rounds")
    assert report.decode_attention and set(report.defaults_left) == {"pack_linears"}


def test_bf16_model_leaves_its_fp32_layers():
    """A bf16 model with an fp32 layer (transformers' _keep_in_fp32_modules): that layer is not rounded."""
    model = wide_model()
    model.lm_head.float()
    report = hf.patch_model(model)
    assert report.linears.skipped["lm_head"] == "weight dtype torch.float32 (packs bf16)"
    assert type(model.lm_head) is nn.Linear and packed_names(model) == PACKED[:-1]


def test_attention_other_than_sdpa_is_left_and_reported():
    model = wide_model()
    model.set_attn_implementation("eager")
    report = hf.patch_model(model)
    assert not report.decode_attention and model.config._attn_implementation == "eager"
    assert report.defaults_left == {"decode_attention": "attention 'eager' left as it is ('ktmoe_decode' "
                                                        "replaces 'sdpa' only)"}


def test_explicit_calls_after_the_defaults_change_nothing(bf16_reference):
    model = wide_model()
    hf.patch_model(model)
    again = hf.pack_linears(model, min_bytes=0)  # the routers (4 KiB, under the default min_bytes) now too
    assert again.module_names == [] and again.routers == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert hf.pack_linears(model, min_bytes=0).routers == []  # a packed router is not packed twice
    assert hf.use_decode_attention(model) is True
    assert packed_names(model) == PACKED
    assert torch.equal(sequence(model), bf16_reference)


def test_compile_decode_on_a_defaulted_model():
    torch._dynamo.reset()
    model = wide_model()
    hf.patch_model(model)
    eager = sequence(model)
    compiled = hf.compile_decode(model, max_cache_len=32, backend="aot_eager")
    assert torch.equal(sequence(model), eager) and compiled.graphs == 1
    torch._dynamo.reset()


def test_from_pretrained_defaults_and_switches(bf16_checkpoint, bf16_reference):
    model = hf.from_pretrained(bf16_checkpoint, dtype=torch.bfloat16, progress=False)
    assert_defaults_applied(model, model.ktmoe_report)
    assert torch.equal(sequence(model), bf16_reference)
    off = hf.from_pretrained(bf16_checkpoint, dtype=torch.bfloat16, progress=False, pack_linears=False,
                             decode_attention=False)
    assert_defaults_off(off, off.ktmoe_report)
    fp32 = hf.from_pretrained(bf16_checkpoint, dtype=torch.float32, progress=False)
    assert fp32.ktmoe_report.linears is None and "model dtype torch.float32" in fp32.ktmoe_report.defaults_left[
        "pack_linears"]


def test_defaulted_model_saves_dense_keys_and_reloads(bf16_checkpoint, bf16_reference, tmp_path):
    """state_dict holds nn.Linear's weights (no packed buffers): save_pretrained reloads into plain
    transformers, save_packed into a packed directory whose model gets the defaults again."""
    model = hf.from_pretrained(bf16_checkpoint, dtype=torch.bfloat16, progress=False)
    keys = model.state_dict().keys()
    assert {f"{name}.weight" for name in PACKED} <= keys and not any("w_packed" in k for k in keys)
    model.save_pretrained(tmp_path / "out")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
    assert torch.equal(sequence(plain), bf16_reference)
    hf.save_packed(model, tmp_path / "packed")
    served = hf.from_pretrained(tmp_path / "packed", dtype=torch.bfloat16)
    assert_defaults_applied(served, served.ktmoe_report)
    assert torch.equal(sequence(served), bf16_reference)


def test_fp8_checkpoint_in_bf16_packs_its_dequantized_linears(bf16_checkpoint, tmp_path):
    """An FP8 checkpoint's dense weights are bf16 once loaded into a bf16 model: packed like any other,
    with the greedy tokens of torch's linears over the same weights."""
    fp8 = fp8_checkpoint(bf16_checkpoint, tmp_path / "fp8")
    model = hf.from_pretrained(fp8, dtype=torch.bfloat16, progress=False)
    assert model.ktmoe_report.linears.module_names == PACKED and model.ktmoe_report.defaults_left == {}
    torch_linears = hf.from_pretrained(fp8, dtype=torch.bfloat16, progress=False, pack_linears=False)
    assert torch.equal(sequence(model), sequence(torch_linears))


def _tied_model() -> nn.Module:
    model = make_model("qwen3_moe", hidden_size=256, head_dim=64, tie_word_embeddings=True).to(torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def _logits_and_head_input(model, tokens):
    seen = []
    handle = model.lm_head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        logits = model(tokens).logits
    handle.remove()
    return logits, seen[0]


def test_a_tied_lm_head_follows_its_embedding():
    """The defaults leave a tied lm_head unpacked (the report says why): resize_token_embeddings works (before:
    AttributeError on KTLinear.weight after the input embeddings were resized) and set_input_embeddings +
    tie_weights changes the logits (before: the old packed copy went on, silently)."""
    model = _tied_model()
    report = hf.patch_model(model)
    assert "lm_head" not in packed_names(model) and "tied" in report.linears.skipped["lm_head"]
    assert packed_names(model) == PACKED[:-1]  # the untied layers are packed as before
    vocab = model.config.vocab_size
    model.resize_token_embeddings(vocab + 64)
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.shape[0] == vocab + 64
    tokens = torch.tensor([[1, 2, 3, vocab + 5]])
    logits, _ = _logits_and_head_input(model, tokens)
    assert logits.shape[-1] == vocab + 64
    new = nn.Embedding(vocab + 64, 256, dtype=torch.bfloat16)
    model.set_input_embeddings(new)
    model.tie_weights()
    logits, head_input = _logits_and_head_input(model, tokens)
    assert torch.equal(logits, nn.functional.linear(head_input, new.weight))
