"""gpt-oss through the Hugging Face drop-in: transposed, interleaved, biased experts with the clamped
SwiGLU, against the unpatched GptOssExperts; checkpoints (bf16 and MXFP4), save/reload, packed dirs."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.checkpoint.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402
from torch_ktmoe.unpack import unpack_experts  # noqa: E402
from tests.helpers import FORMAT_TOLERANCE  # noqa: E402
from tests.helpers.hf_models import COMMON, assert_close_logits, assert_same_greedy, greedy, logits  # noqa: E402

LIMIT = 7.0


def tiny_gpt_oss(dtype=torch.float32, seed=16):
    """2 layers (sliding + full attention), 8 experts top-2, H=64, I=32, with expert weights and
    biases large enough that the SwiGLU clamps are hit (see test_the_clamps_are_hit). Seed 16: the
    greedy path's smallest top-1/top-2 logit margin is >= 0.03 in fp32, bf16 and fp16 (bf16 experts: <= 1e-3)."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    cfg = GptOssConfig(**COMMON, head_dim=16, intermediate_size=32, num_hidden_layers=2, num_local_experts=8,
                       num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                       swiglu_limit=LIMIT)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            ex = layer.mlp.experts
            ex.gate_up_proj.copy_(torch.randn(ex.gate_up_proj.shape, generator=g) * 0.5)
            ex.gate_up_proj_bias.copy_(torch.randn(ex.gate_up_proj_bias.shape, generator=g) * 2)
            ex.down_proj.copy_(torch.randn(ex.down_proj.shape, generator=g) * 0.05)
            ex.down_proj_bias.copy_(torch.randn(ex.down_proj_bias.shape, generator=g) * 0.1)
    return model.to(dtype)


def test_gpt_oss_is_supported_with_its_layout():
    ex = tiny_gpt_oss().model.layers[0].mlp.experts
    assert hf.unsupported_reason(ex) is None
    layout = hf.layout_of(ex)
    assert (layout.transposed, layout.interleaved, layout.biases, layout.activation) == (True, True, True, "swiglu_oai")
    assert hf.experts_dims(ex) == (8, 64, 32)


def test_the_clamps_are_hit():
    model = tiny_gpt_oss()
    seen = []
    ex = model.model.layers[1].mlp.experts
    hook = ex.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    logits(model)
    hook.remove()
    pre = torch.einsum("th,ehi->tei", seen[0], ex.gate_up_proj) + ex.gate_up_proj_bias
    assert (pre[..., 0::2] > LIMIT).float().mean() > 0.02 and (pre[..., 1::2].abs() > LIMIT).float().mean() > 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_patched_gpt_oss_generates_like_unpatched(dtype):
    model = tiny_gpt_oss(dtype)
    ref = logits(model)
    ref_seq, ref_step = greedy(model)
    report = hf.patch_model(model)
    assert report.replaced_classes == {"GptOssExperts": 2} and not report.refused
    assert_close_logits(logits(model).float(), ref.float())
    assert_same_greedy(model, ref_seq, ref_step)


@pytest.mark.parametrize("fmt", list(FORMAT_TOLERANCE))
def test_each_format_within_its_bound_on_a_layer(fmt):
    """One experts layer, patched in each format, against the eager GptOssExperts (fp32) on random tokens."""
    model = tiny_gpt_oss()
    ex = model.model.layers[0].mlp.experts
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g)
    ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(64)])
    w = torch.softmax(torch.randn(64, 2, generator=g), -1)
    with torch.no_grad():
        ref = ex(x, ids, w)
        hf.patch_model(model, weight_format=fmt)
        out = model.model.layers[0].mlp.experts(x, ids, w)
    err = ((out - ref).abs().mean() / ref.abs().mean()).item()
    assert err <= FORMAT_TOLERANCE[fmt], f"{fmt}: {err:.4f}"


def test_experts_implementation_ktmoe():
    model = tiny_gpt_oss()
    ref_seq, ref_step = greedy(model)
    model.set_experts_implementation("ktmoe")
    assert_same_greedy(model, ref_seq, ref_step)
    assert model.model.layers[0].mlp.experts.gate_up_proj.numel() == 0  # dense freed, biases kept
    assert model.model.layers[0].mlp.experts.gate_up_proj_bias.numel() == 8 * 64


def test_checkpoint_stream_save_reload_and_packed_dir(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_gpt_oss()
    model.save_pretrained(tmp_path / "ckpt")
    hf.patch_model(model)
    want = logits(model)
    streamed = hf.from_pretrained(tmp_path / "ckpt", dtype=torch.float32, progress=False)
    assert torch.equal(logits(streamed), want)
    # save_pretrained of the patched model writes gpt-oss's own layout (bf16 experts: exact)
    streamed.save_pretrained(tmp_path / "resaved")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "resaved", dtype=torch.float32).eval()
    ref = tiny_gpt_oss()
    for a, b in zip(plain.model.layers, ref.model.layers):
        assert torch.equal(a.mlp.experts.gate_up_proj, b.mlp.experts.gate_up_proj.bfloat16().float())
        assert torch.equal(a.mlp.experts.down_proj_bias, b.mlp.experts.down_proj_bias)
    hf.patch_model(plain)
    assert torch.equal(logits(plain), want)
    # a packed model directory: no source checkpoint, bit-identical logits
    hf.save_packed(streamed, tmp_path / "packed")
    packed = hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    assert torch.equal(logits(packed), want)


@pytest.mark.parametrize("weight_format", [None, "mxfp4"])
def test_mxfp4_checkpoint_loads_by_dequantizing(tmp_path, weight_format):
    """An MXFP4 gpt-oss checkpoint (experts as _blocks/_scales, quantization_config mxfp4) streams
    through hf.from_pretrained, by default dequantized to bf16, with weight_format="mxfp4" its codes and
    scales kept as they are; the reference is the unpatched model holding transformers' own
    dequantization (convert_moe_packed_tensors) of the same blocks."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = tiny_gpt_oss()
    model.save_pretrained(tmp_path / "ckpt")
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    for key in [k for k in state if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = quantize_mxfp4(state.pop(key).transpose(1, 2))  # stored output-major
        state[key + "_blocks"], state[key + "_scales"] = blocks, scales
        assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(1, 2),
                           convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    save_file(state, tmp_path / "ckpt" / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                      "model.layers.*.mlp.router",
                                                                                      "model.embed_tokens", "lm_head"]}
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))

    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for name in ("gate_up_proj", "down_proj"):
                key = f"model.layers.{i}.mlp.experts.{name}"
                getattr(layer.mlp.experts, name).copy_(
                    convert_moe_packed_tensors(state[key + "_blocks"], state[key + "_scales"], dtype=torch.float32))
    ref = logits(model)
    ref_seq, ref_step = greedy(model)
    loaded = hf.from_pretrained(tmp_path / "ckpt", dtype=torch.float32, progress=False, weight_format=weight_format)
    assert isinstance(loaded, AutoModelForCausalLM._model_mapping[type(loaded.config)])
    for i, layer in enumerate(loaded.model.layers):  # the packed weights are the checkpoint's values
        gate_up, down, fmt = unpack_experts(layer.mlp.experts.ktmoe.packed_tensors())
        assert fmt == (weight_format or "bf16")
        key = f"model.layers.{i}.mlp.experts.down_proj"
        assert torch.equal(down, dequantize_mxfp4(state[key + "_blocks"], state[key + "_scales"]).to(down.dtype))
    assert loaded.ktmoe_report.replaced_classes == {"GptOssExperts": 2}
    assert_close_logits(logits(loaded), ref)  # MXFP4 values are exact in bf16: only activation rounding
    assert_same_greedy(loaded, ref_seq, ref_step)


def test_an_e8m0_nan_scale_is_refused_by_from_pretrained(tmp_path):
    """The default (dequantized, bf16) load of an MXFP4 checkpoint refuses a _scales byte 0xFF naming the tensor,
    as weight_format="mxfp4" does (before: a block of ±0.5 codes loaded as ±2^127, the logits inf)."""
    from safetensors.torch import load_file, save_file

    tiny_gpt_oss().save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    for key in [k for k in state if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        state[key + "_blocks"], state[key + "_scales"] = quantize_mxfp4(state.pop(key).transpose(1, 2))
    bad = "model.layers.1.mlp.experts.gate_up_proj_scales"
    state[bad][3, 9, 1] = 0xFF
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for weight_format in (None, "mxfp4"):
        with pytest.raises(ValueError, match=rf"{bad}: E8M0 scale byte 0xFF \(NaN\)"):
            hf.from_pretrained(tmp_path, dtype=torch.float32, progress=False, weight_format=weight_format)
