"""gpt-oss through the sglang wrapper: its checkpoint (bf16 ``gate_up_proj`` [E, H, 2I] or MXFP4 ``_blocks`` /
``_scales``) interleaves gate and up, carries expert biases and uses the clamped SwiGLU; the wrapper reads all
three from the checkpoint and its config.json, against the unpatched GptOssExperts."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from torch_ktmoe.checkpoint.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402
from torch_ktmoe.sglang import KTMoEWrapper  # noqa: E402
from tests.helpers import FORMAT_TOLERANCE  # noqa: E402
from tests.test_hf_gpt_oss import tiny_gpt_oss  # noqa: E402

E, K, LAYER, GPU = 8, 2, 1, 2  # tiny_gpt_oss: 8 experts top-2, H=64, I=32; experts [0, GPU) on the GPU


def _checkpoint(path, mxfp4: bool):
    """tiny_gpt_oss saved as transformers saves it (bf16 experts), or with its experts as MXFP4 blocks; returns the
    reference experts module of layer LAYER holding the checkpoint's (dequantized) values."""
    model = tiny_gpt_oss()
    model.save_pretrained(path)
    experts = model.model.layers[LAYER].mlp.experts
    if mxfp4:
        state = load_file(path / "model.safetensors")
        for key in [k for k in state if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            blocks, scales = quantize_mxfp4(state.pop(key).transpose(1, 2))  # stored output-major
            state[key + "_blocks"], state[key + "_scales"] = blocks, scales
        save_file(state, path / "model.safetensors", metadata={"format": "pt"})
        with torch.no_grad():
            for name in ("gate_up_proj", "down_proj"):
                key = f"model.layers.{LAYER}.mlp.experts.{name}"
                getattr(experts, name).copy_(dequantize_mxfp4(state[key + "_blocks"], state[key + "_scales"])
                                             .transpose(1, 2))
    return model.config, experts


def _routing(T, H, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    w, ids = torch.topk(torch.softmax(torch.randn(T, E, generator=g), -1), K, dim=-1)
    return x, ids, w


def _reference(experts, x, ids, w):
    """GptOssExperts on the CPU experts alone (a GPU expert's weight 0: its output and bias drop out)."""
    with torch.no_grad():
        return experts(x, ids, torch.where(ids < GPU, torch.zeros_like(w), w))


def _relative_error(wr, cfg, experts) -> float:
    """The wrapper's output against GptOssExperts' on 16 tokens (mean |out - ref| / mean |ref|)."""
    x, ids, w = _routing(16, cfg.hidden_size)
    out = wr.forward(x.to(torch.bfloat16), ids.to(torch.int32), w)
    ref = _reference(experts, x.to(torch.bfloat16).float(), ids, w)
    return float((out.float() - ref).abs().mean() / ref.abs().mean())


@pytest.mark.parametrize("method,mxfp4", [("BF16", False), ("MXFP4", True)], ids=["bf16", "mxfp4"])
def test_gpt_oss_checkpoint_matches_gpt_oss_experts(tmp_path, method, mxfp4):
    cfg, experts = _checkpoint(tmp_path, mxfp4)
    wr = KTMoEWrapper(LAYER, E, K, cfg.hidden_size, cfg.intermediate_size, num_gpu_experts=GPU,
                      weight_path=str(tmp_path), method=method)
    wr.load_weights(None)
    assert wr.activation == "swiglu_oai"
    assert wr.activation_params == {"alpha": cfg.swiglu_alpha, "limit": cfg.swiglu_limit}
    rel = _relative_error(wr, cfg, experts)
    assert rel <= FORMAT_TOLERANCE["bf16"], rel


def test_gpt_oss_from_tensors_takes_the_checkpoint_biases(tmp_path):
    """load_weights_from_tensors (gate / up / down [E, I, H] / [E, H, I]) of a gpt-oss checkpoint: the tensors carry
    no biases, the wrapper reads them from weight_path."""
    cfg, experts = _checkpoint(tmp_path, mxfp4=False)
    gate_up = experts.gate_up_proj.detach().transpose(1, 2)  # [E, 2I, H], gate and up interleaved
    wr = KTMoEWrapper(LAYER, E, K, cfg.hidden_size, cfg.intermediate_size, num_gpu_experts=GPU,
                      weight_path=str(tmp_path), method="BF16")
    wr.load_weights_from_tensors(gate_up[:, 0::2], gate_up[:, 1::2], experts.down_proj.detach().transpose(1, 2))
    assert _relative_error(wr, cfg, experts) <= FORMAT_TOLERANCE["bf16"]


def test_an_explicit_activation_wins_over_the_config(tmp_path):
    """activation= given wins (and here computes another function: the comparison above can fail)."""
    cfg, experts = _checkpoint(tmp_path, mxfp4=False)
    wr = KTMoEWrapper(LAYER, E, K, cfg.hidden_size, cfg.intermediate_size, num_gpu_experts=GPU,
                      weight_path=str(tmp_path), method="BF16", activation="silu")
    assert wr.activation == "silu"
    wr.load_weights(None)
    assert _relative_error(wr, cfg, experts) > 10 * FORMAT_TOLERANCE["bf16"]


def test_a_gpt_oss_config_without_its_biases_is_refused(tmp_path):
    cfg, _ = _checkpoint(tmp_path, mxfp4=False)
    state = load_file(tmp_path / "model.safetensors")
    del state[f"model.layers.{LAYER}.mlp.experts.down_proj_bias"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    wr = KTMoEWrapper(LAYER, E, K, cfg.hidden_size, cfg.intermediate_size, num_gpu_experts=GPU,
                      weight_path=str(tmp_path), method="BF16")
    with pytest.raises(KeyError, match="down_proj_bias"):
        wr.load_weights(None)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt_oss"


@pytest.mark.parametrize("method,mxfp4", [("BF16", False), ("MXFP4", True)], ids=["bf16", "mxfp4"])
def test_a_gpt_oss_checkpoint_without_config_json_is_recognised_from_its_tensors(tmp_path, method, mxfp4):
    """No config.json: the expert biases beside the fused experts say gpt-oss (interleaved, biased, clamped
    SwiGLU with its default constants), not SiLU over a concatenated split."""
    cfg, experts = _checkpoint(tmp_path, mxfp4)
    (tmp_path / "config.json").unlink()
    wr = KTMoEWrapper(LAYER, E, K, cfg.hidden_size, cfg.intermediate_size, num_gpu_experts=GPU,
                      weight_path=str(tmp_path), method=method)
    wr.load_weights(None)
    assert wr.gpt_oss and wr.activation == "swiglu_oai"
    assert wr.activation_params == {"alpha": 1.702, "limit": 7.0} == {"alpha": cfg.swiglu_alpha,
                                                                      "limit": cfg.swiglu_limit}
    assert _relative_error(wr, cfg, experts) <= FORMAT_TOLERANCE["bf16"]


def test_expert_biases_under_another_model_type_are_refused_naming_both(tmp_path):
    cfg, _ = _checkpoint(tmp_path, mxfp4=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "mixtral"}))
    wr = KTMoEWrapper(LAYER, E, K, cfg.hidden_size, cfg.intermediate_size, num_gpu_experts=GPU,
                      weight_path=str(tmp_path), method="MXFP4")
    with pytest.raises(ValueError, match=r"model_type is 'mixtral'.*layers\.1\.mlp\.experts\.gate_up_proj_bias"):
        wr.load_weights(None)


def test_an_e8m0_nan_scale_is_refused_in_the_dequantizing_path(tmp_path):
    """method BF16 over an MXFP4 checkpoint dequantizes its experts: a _scales byte 0xFF is refused naming the
    tensor (before: inf in the output)."""
    cfg, _ = _checkpoint(tmp_path, mxfp4=True)
    state = load_file(tmp_path / "model.safetensors")
    key = f"model.layers.{LAYER}.mlp.experts.down_proj_scales"
    state[key][GPU, 3, 0] = 0xFF
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    wr = KTMoEWrapper(LAYER, E, K, cfg.hidden_size, cfg.intermediate_size, num_gpu_experts=GPU,
                      weight_path=str(tmp_path), method="BF16")
    with pytest.raises(ValueError, match=rf"{key}: E8M0 scale byte 0xFF \(NaN\)"):
        wr.load_weights(None)
