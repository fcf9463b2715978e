"""FP8 checkpoints end to end: hf.from_pretrained of a tiny Qwen3-MoE- and DeepSeek-V3-shaped FP8 checkpoint
(experts streamed into fp8 exactly, other weights dequantized) generates transformers' greedy tokens on the
dequantized weights; the sglang wrapper's FP8 and FP8_PERCHANNEL methods match the dequantized reference."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import torch_ktmoe
from torch_ktmoe.reference import moe_reference, relative_error
from torch_ktmoe.sglang import KTMoEWrapper
from tests.helpers import FORMAT_TOLERANCE, random_experts
from tests.helpers.fp8 import dequantize_blocks, fp8_checkpoint, quantize_blocks, quantize_rows
from tests.helpers.quantized_models import greedy, tiny_config

pytest.importorskip("transformers")



def _dequantized_copy(fp8_dir, dst):
    """The FP8 checkpoint with every weight dequantized to fp32 and no quantization_config (the reference)."""
    os.makedirs(dst)
    t = load_file(os.path.join(fp8_dir, "model.safetensors"))
    out = {k: (dequantize_blocks(v, t[k + "_scale_inv"].float()) if v.dtype == torch.float8_e4m3fn else v)
           for k, v in t.items() if not k.endswith("_scale_inv")}
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(fp8_dir, "config.json")) as f:
        config = json.load(f)
    del config["quantization_config"]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


@pytest.fixture(scope="module", params=["qwen3_moe", "deepseek_v3"])
def fp8_model(request, tmp_path_factory):
    """(FP8 checkpoint dir, greedy tokens of transformers on its dequantized weights)."""
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(tiny_config(request.param), dtype=torch.float32).save_pretrained(tmp / "src")
    fp8_dir = fp8_checkpoint(tmp / "src", tmp / "fp8")
    ref = AutoModelForCausalLM.from_pretrained(_dequantized_copy(fp8_dir, tmp / "deq"), dtype=torch.float32).eval()
    return fp8_dir, greedy(ref)



def test_from_pretrained_streams_fp8_experts_exactly(fp8_model, monkeypatch):
    import torch_ktmoe.hf as kthf

    fp8_dir, ref_seq = fp8_model
    seen = set()
    load_expert = torch_ktmoe.KTMoE.load_expert

    def spy(self, expert, gate_up, down, **kw):
        seen.add((gate_up.dtype, down.dtype, kw.get("gate_up_scale") is not None))
        return load_expert(self, expert, gate_up, down, **kw)

    monkeypatch.setattr(torch_ktmoe.KTMoE, "load_expert", spy)
    model = kthf.from_pretrained(fp8_dir, dtype=torch.float32, progress=False)
    assert seen == {(torch.float8_e4m3fn, torch.float8_e4m3fn, True)}  # no dequantized expert ever
    layers = [m.ktmoe for m in model.modules() if hasattr(m, "ktmoe")]
    assert layers and all(k.weight_format == "fp8" for k in layers)
    assert torch.equal(greedy(model), ref_seq)


def test_from_pretrained_fp8_into_bf16_on_request(fp8_model):
    import torch_ktmoe.hf as kthf

    fp8_dir, ref_seq = fp8_model
    model = kthf.from_pretrained(fp8_dir, dtype=torch.float32, weight_format="bf16", progress=False)
    assert {m.ktmoe.weight_format for m in model.modules() if hasattr(m, "ktmoe")} == {"bf16"}
    assert torch.equal(greedy(model), ref_seq)


O_PROJ = "model.layers.0.self_attn.o_proj"


@pytest.fixture(scope="module")
def fp8_qwen3(tmp_path_factory):
    """A tiny Qwen3-MoE FP8 checkpoint (block scales on every linear, o_proj included)."""
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp("fp8_dense")
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(tiny_config("qwen3_moe"), dtype=torch.float32).save_pretrained(tmp / "src")
    return fp8_checkpoint(tmp / "src", tmp / "fp8")


def _copy_with(src, dst, change):
    """A copy of the checkpoint ``src`` with its tensors ``t`` replaced by ``change(t)``."""
    os.makedirs(dst)
    for name in os.listdir(src):
        if name != "model.safetensors":
            with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
                g.write(f.read())
    t = change(load_file(os.path.join(src, "model.safetensors")))
    save_file(t, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def _with_o_proj(src, dst, **tensors):
    """A copy of the FP8 checkpoint ``src`` with o_proj's ``weight`` / ``weight_scale_inv`` replaced (None: removed)."""
    def change(t):
        for suffix, value in tensors.items():
            t.pop(f"{O_PROJ}.{suffix}")
            if value is not None:
                t[f"{O_PROJ}.{suffix}"] = value
        return t
    return _copy_with(src, dst, change)


def _with_nan_code(q):
    q = q.clone()
    q.view(torch.uint8)[3, 5] = 0x7F  # e4m3fn's NaN
    return q


@pytest.mark.parametrize("case, match", [
    pytest.param("missing scale", rf"{O_PROJ}\.weight: FP8 \(F8_E4M3\) weight without its scale", id="missing"),
    pytest.param("NaN scale", rf"{O_PROJ}\.weight_scale_inv: non-finite scale \(nan\)", id="nan"),
    pytest.param("integer scale", rf"{O_PROJ}\.weight_scale_inv: dtype I32, expected a float scale", id="int"),
    pytest.param("e5m2 weight", rf"{O_PROJ}\.weight: dtype F8_E5M2 .* expected FP8 as e4m3", id="e5m2"),
    pytest.param("NaN code", rf"{O_PROJ}\.weight: non-finite weights once dequantized", id="nan-code"),
    pytest.param("NaN UE8M0 scale", rf"{O_PROJ}\.weight_scale_inv: E8M0 scale byte 0xFF \(NaN\) at \[0, 0\]",
                 id="nan-e8m0"),
])
def test_fp8_non_expert_weight_is_checked_like_an_expert(fp8_qwen3, tmp_path, case, match):
    """An FP8 o_proj without a usable scale, or in e5m2, is refused by name, as an expert's would be (it
    loaded as raw e4m3 codes, or NaN, before)."""
    import torch_ktmoe.hf as kthf

    t = load_file(os.path.join(fp8_qwen3, "model.safetensors"))
    weight, scale = t[f"{O_PROJ}.weight"], t[f"{O_PROJ}.weight_scale_inv"]
    changed = {
        "missing scale": {"weight_scale_inv": None},
        "NaN scale": {"weight_scale_inv": torch.full_like(scale, float("nan"))},
        "integer scale": {"weight_scale_inv": torch.ones(scale.shape, dtype=torch.int32)},
        "e5m2 weight": {"weight": weight.float().to(torch.float8_e5m2)},
        "NaN code": {"weight": _with_nan_code(weight)},
        "NaN UE8M0 scale": {"weight_scale_inv": torch.full(scale.shape, 0xFF, dtype=torch.uint8).view(
            torch.float8_e8m0fnu)},
    }[case]
    path = _with_o_proj(fp8_qwen3, tmp_path / "ckpt", **changed)
    with pytest.raises(ValueError, match=match):
        kthf.from_pretrained(path, dtype=torch.float32, progress=False)


def _ue8m0(t, dtype):
    """Every scale of the FP8 checkpoint's tensors ``t`` rounded up to a power of two (DeepSeek-V3.2 / V4's
    ``scale_fmt="ue8m0"``), stored in ``dtype`` (float8_e8m0fnu, or fp32 powers of two)."""
    return {k: torch.exp2(torch.ceil(torch.log2(v))).to(dtype) if k.endswith("_scale_inv") else v for k, v in t.items()}


@pytest.mark.parametrize("dtype", [torch.float8_e8m0fnu, torch.float32], ids=["e8m0", "fp32"])
def test_ue8m0_scales_read_exactly(fp8_qwen3, tmp_path, dtype):
    """UE8M0 scales (float8_e8m0fnu, or fp32 powers of two), on the experts and the other linears: the experts are
    packed into fp8 with the scales' exact values, o_proj is dequantized with them, and the model generates the
    tokens of transformers on the dequantized weights."""
    from transformers import AutoModelForCausalLM
    import torch_ktmoe.hf as kthf
    from torch_ktmoe.unpack import unpack_experts

    path = _copy_with(fp8_qwen3, tmp_path / "ue8m0", lambda t: _ue8m0(t, dtype))
    t = load_file(os.path.join(path, "model.safetensors"))
    assert t[f"{O_PROJ}.weight_scale_inv"].dtype == dtype
    deq = lambda key: dequantize_blocks(t[key + ".weight"], t[key + ".weight_scale_inv"].float())
    ref = AutoModelForCausalLM.from_pretrained(_dequantized_copy(path, tmp_path / "deq"), dtype=torch.float32).eval()
    model = kthf.from_pretrained(path, dtype=torch.float32, progress=False)
    assert torch.equal(model.get_parameter(f"{O_PROJ}.weight"), deq(O_PROJ))
    block = model.model.layers[0].mlp.experts
    assert block.ktmoe.weight_format == "fp8"
    gate_up, down, _ = unpack_experts(block.ktmoe.packed_tensors())
    experts = "model.layers.0.mlp.experts"
    for e in range(gate_up.shape[0]):
        assert torch.equal(gate_up[e], torch.cat([deq(f"{experts}.{e}.gate_proj"), deq(f"{experts}.{e}.up_proj")]))
        assert torch.equal(down[e], deq(f"{experts}.{e}.down_proj"))
    assert torch.equal(greedy(model), greedy(ref))


E, H, I, L = 6, 256, 160, 2
PREFIX = f"model.layers.{L}.mlp.experts"


@pytest.mark.parametrize("method", ["FP8", "FP8_PERCHANNEL"])
def test_sglang_fp8_methods_match_the_dequantized_reference(tmp_path, method):
    gate_up, down = random_experts(E, H, I)
    quantize = quantize_rows if method == "FP8_PERCHANNEL" else quantize_blocks
    suffix = "weight_scale" if method == "FP8_PERCHANNEL" else "weight_scale_inv"
    t, deq_gu, deq_dn = {}, [], []
    for e in range(E):
        parts = {"gate_proj": gate_up[e, :I], "up_proj": gate_up[e, I:], "down_proj": down[e]}
        deq = {}
        for name, w in parts.items():
            q, s = quantize(w)
            t[f"{PREFIX}.{e}.{name}.weight"], t[f"{PREFIX}.{e}.{name}.{suffix}"] = q, s
            deq[name] = q.float() * s if method == "FP8_PERCHANNEL" else dequantize_blocks(q, s)
        deq_gu.append(torch.cat([deq["gate_proj"], deq["up_proj"]]))
        deq_dn.append(deq["down_proj"])
    save_file(t, os.path.join(tmp_path, "model.safetensors"))
    wrapper = KTMoEWrapper(L, E, 2, H, I, num_gpu_experts=0, weight_path=str(tmp_path), method=method)
    wrapper.load_weights()
    assert wrapper.moe.weight_format == "fp8"
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, H, generator=g)
    w, ids = torch.topk(torch.softmax(torch.randn(7, E, generator=g), -1), 2, dim=-1)
    out = wrapper.forward(x, ids, w)
    ref = moe_reference(x, ids, w, torch.stack(deq_gu), torch.stack(deq_dn), "bf16")
    assert relative_error(out, ref) <= FORMAT_TOLERANCE["bf16"] / 10
