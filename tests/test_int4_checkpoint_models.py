"""Int4 checkpoints end to end: tiny Qwen3-MoE- and DeepSeek-V3-shaped checkpoints in compressed-tensors int4 and GPTQ
int4 (every linear quantized; GPTQ's down_proj and non-expert linears in act order) load through hf.from_pretrained
(experts from the int4 tensors, other linears dequantized) and generate transformers' greedy tokens on the
dequantized weights; the sglang wrapper's RAWINT4 / GPTQ_INT4 stay within the bf16 bound of the dequantized
reference."""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe.reference import moe_reference, relative_error
from torch_ktmoe.sglang import KTMoEWrapper
from tests.helpers import FORMAT_TOLERANCE, QUANTIZED_REFERENCE_TOLERANCE
from tests.helpers.int4_checkpoints import int4_checkpoint, quantize_int4
from tests.helpers.quantized_models import greedy, tiny_config

pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")




@pytest.fixture(scope="module", params=[("qwen3_moe", "compressed-tensors"), ("qwen3_moe", "gptq"),
                                        ("deepseek_v3", "compressed-tensors"), ("deepseek_v3", "gptq")],
                ids=lambda p: "-".join(p))
def int4_model(request, tmp_path_factory):
    """(int4 checkpoint dir, its kind, greedy tokens of transformers on its dequantized weights)."""
    from transformers import AutoModelForCausalLM

    model_kind, kind = request.param
    tmp = tmp_path_factory.mktemp(f"{model_kind}-{kind}")
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(tiny_config(model_kind), dtype=torch.float32).save_pretrained(tmp / "src")
    path = int4_checkpoint(tmp / "src", tmp / "int4", kind, down_act_order=kind == "gptq")
    ref = AutoModelForCausalLM.from_pretrained(path + "-dequantized", dtype=torch.float32).eval()
    return path, kind, greedy(ref)


def test_from_pretrained_streams_int4_experts_exactly(int4_model, monkeypatch):
    import torch_ktmoe.hf as kthf

    path, kind, ref_seq = int4_model
    seen = set()
    load_expert = torch_ktmoe.KTMoE.load_expert

    def spy(self, expert, gate_up, down, **kw):
        seen.add((gate_up.dtype, down.dtype, kw.get("gate_up_scale") is not None, kw.get("gate_up_zero") is None))
        return load_expert(self, expert, gate_up, down, **kw)

    monkeypatch.setattr(torch_ktmoe.KTMoE, "load_expert", spy)
    model = kthf.from_pretrained(path, dtype=torch.float32, progress=False)
    symmetric = kind == "compressed-tensors"  # no zero points: z = 8
    assert seen == {(torch.uint8, torch.uint8, True, symmetric)}  # codes as they are, never a dequantized expert
    layers = [m.ktmoe for m in model.modules() if hasattr(m, "ktmoe")]
    assert layers and {(k.weight_format, k.group_size) for k in layers} == {
        ("int4_affine", 32 if kind == "compressed-tensors" else 128)}
    assert torch.equal(greedy(model), ref_seq)


def test_from_pretrained_int4_into_bf16_on_request(int4_model):
    import torch_ktmoe.hf as kthf

    path, _, ref_seq = int4_model
    model = kthf.from_pretrained(path, dtype=torch.float32, weight_format="bf16", progress=False)
    assert {m.ktmoe.weight_format for m in model.modules() if hasattr(m, "ktmoe")} == {"bf16"}
    assert torch.equal(greedy(model), ref_seq)


def test_non_expert_int4_linears_are_the_dequantized_weights(int4_model):
    import torch_ktmoe.hf as kthf
    from safetensors.torch import load_file
    import os

    path, _, _ = int4_model
    model = kthf.from_pretrained(path, dtype=torch.float32, weight_format="bf16", progress=False)
    ref = load_file(os.path.join(path + "-dequantized", "model.safetensors"))
    params = dict(model.named_parameters())
    checked = [k for k in ref if k in params and k.endswith("proj.weight")]
    assert any(".self_attn." in k for k in checked)
    if "deepseek" in path:  # the dense MLP of layer 0 and the shared experts
        assert any(".shared_experts." in k for k in checked) and any(".layers.0.mlp." in k for k in checked)
    for k in checked:
        assert torch.equal(params[k].detach(), ref[k]), k


def test_patch_model_of_transformers_compressed_tensors_load(int4_model):
    """transformers with the compressed-tensors package decompresses a pack-quantized checkpoint's experts into its
    fused bf16 experts (and keeps the other linears compressed); patch_model packs those as they are."""
    from transformers import AutoModelForCausalLM
    from torch_ktmoe.hf import patch_model

    path, kind, ref_seq = int4_model
    if kind != "compressed-tensors":
        pytest.skip("transformers loads GPTQ only through optimum / gptqmodel, which are not CPU dependencies here")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    report = patch_model(model, weight_format="bf16")
    assert report.num_layers == sum(1 for m in model.modules() if hasattr(m, "ktmoe")) > 0
    assert torch.equal(greedy(model), ref_seq)


E, H, I, L = 6, 256, 160, 1


@pytest.fixture(scope="module", params=["compressed-tensors", "gptq", "awq"])
def int4_layer(request, tmp_path_factory):
    """(checkpoint dir of one int4 experts layer L, gate_up [E, 2I, H], down [E, H, I] dequantized)."""
    from safetensors.torch import save_file

    kind = {"compressed-tensors": "ct", "gptq": "gptq_down_act_order", "awq": "awq"}[request.param]
    g = torch.Generator().manual_seed(2)
    t, gate_up, down = {}, [], []
    for e in range(E):
        deq = {}
        for name, (n, k) in {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}.items():
            parts, deq[name] = quantize_int4(kind, torch.randn(n, k, generator=g) / k ** 0.5, name, seed=e)
            t.update({f"model.layers.{L}.mlp.experts.{e}.{name}.{s}": v for s, v in parts.items()})
        gate_up.append(torch.cat([deq["gate_proj"], deq["up_proj"]]))
        down.append(deq["down_proj"])
    path = tmp_path_factory.mktemp(request.param)
    save_file(t, str(path / "model.safetensors"))
    return str(path), torch.stack(gate_up), torch.stack(down)


def _wrapper_error(path, method, gate_up, down):
    wrapper = KTMoEWrapper(L, E, 2, H, I, num_gpu_experts=1, weight_path=path, method=method)
    wrapper.load_weights()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, H, generator=g)
    w, ids = torch.topk(torch.softmax(torch.randn(7, E, generator=g), -1), 2, dim=-1)
    out = wrapper.forward(x, ids, w)
    on_cpu = ids >= 1  # expert 0 is on the GPU: the wrapper skips it
    ref = moe_reference(x, torch.where(on_cpu, ids, torch.zeros_like(ids)), torch.where(on_cpu, w, 0 * w),
                        gate_up, down, "bf16")
    return wrapper, relative_error(out, ref)


@pytest.mark.parametrize("method", ["BF16", "INT8"])
def test_sglang_dequantizes_int4_experts_into_other_formats(int4_layer, method):
    path, gate_up, down = int4_layer
    wrapper, err = _wrapper_error(path, method, gate_up, down)
    assert wrapper.moe.weight_format == method.lower()
    assert err <= FORMAT_TOLERANCE[method.lower()]


@pytest.mark.parametrize("method", ["RAWINT4", "GPTQ_INT4"])
def test_sglang_int4_methods_read_the_codes_exactly(int4_layer, method):
    """RAWINT4 / GPTQ_INT4 pack the checkpoint's codes, scales and zeros (int4_affine): within the bf16 bound of
    the dequantized reference, and in fact only summation order away from it (bf16 activations)."""
    path, gate_up, down = int4_layer
    wrapper, err = _wrapper_error(path, method, gate_up, down)
    assert wrapper.moe.weight_format == "int4_affine"
    assert err <= QUANTIZED_REFERENCE_TOLERANCE <= FORMAT_TOLERANCE["bf16"]


def test_fp8_per_channel_weight_scale_is_still_an_fp8_scale(tmp_path):
    """compressed-tensors and FP8 per channel both name a scale ``weight_scale``: an FP8 checkpoint's non-expert
    weights are still dequantized with it."""
    import os
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    import torch_ktmoe.hf as kthf
    from tests.helpers.fp8 import fp8_checkpoint

    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(tiny_config("qwen3_moe"), dtype=torch.float32).save_pretrained(tmp_path / "src")
    path = fp8_checkpoint(tmp_path / "src", tmp_path / "fp8", per_channel=True)
    model = kthf.from_pretrained(path, dtype=torch.float32, weight_format="bf16", progress=False)
    t = load_file(os.path.join(path, "model.safetensors"))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.get_parameter(key).detach(), t[key].float() * t[key + "_scale"])
