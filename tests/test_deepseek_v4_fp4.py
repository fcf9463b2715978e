"""DeepSeek-V4's FP4 experts (``expert_dtype="fp4"``): per expert ``ffn.experts.{e}.w1/w2/w3.weight`` int8 [n, k/2]
or safetensors F4 (float4_e2m1fn_x2, header shape [n, k]), two e2m1 codes per byte, the low nibble first, with a
UE8M0 scale [n, k/32] (``.scale``, as DeepSeek-V4 ships it, or ``.weight_scale_inv``, as transformers names it; float8_e8m0fnu or fp32 powers of two) -- the layout of
transformers 5.25's FP8Experts(expert_dtype="fp4") and Fp8Dequantize._unpack_fp4. hf.from_pretrained dequantizes
them (exact in bf16) by default and packs their codes and scales as they are with weight_format="mxfp4"; a tiny
DeepSeek-V4 streamed from such a checkpoint generates like the model holding the dequantized weights."""
import json

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.checkpoint import SafetensorsCheckpoint, find_experts  # noqa: E402
from torch_ktmoe.checkpoint.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402
from torch_ktmoe.unpack import unpack_experts  # noqa: E402
from tests.helpers.hf_models import assert_close_logits, greedy, logits  # noqa: E402
from tests.helpers.hf_families import assert_same_greedy_up_to_ties, tiny_model  # noqa: E402

QUANTIZATION_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                       "weight_block_size": [128, 128], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
E, H, I = 8, 64, 32  # tiny_config("deepseek_v4")
PREFIX = "model.layers.1.ffn.experts"


def fp4_checkpoint(path, scale_name="scale", scale_dtype=torch.float8_e8m0fnu, weight_dtype=torch.int8) -> dict:
    """Rewrites the save_pretrained checkpoint ``path`` with its experts in DeepSeek-V4's FP4 (OCP MX rounding;
    the packed bytes as ``weight_dtype``: int8, or float4_e2m1fn_x2, safetensors' F4); returns {expert weight
    key: its dequantized fp32 value}."""
    state = load_file(path / "model.safetensors")
    dequantized = {}
    for key in [k for k in state if ".experts." in k and k.endswith(".weight")]:
        blocks, scales = quantize_mxfp4(state.pop(key))
        state[key] = blocks.flatten(-2).view(weight_dtype)
        scale = scales.view(torch.float8_e8m0fnu)
        state[key[: -len("weight")] + scale_name] = scale if scale_dtype == scale.dtype else scale.to(scale_dtype)
        dequantized[key] = dequantize_mxfp4(blocks, scales)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = QUANTIZATION_CONFIG
    (path / "config.json").write_text(json.dumps(config))
    return dequantized


def stacked(dequantized: dict, prefix: str):
    """The dequantized experts under ``prefix`` as (gate_up [E, 2I, H], down [E, H, I])."""
    w = lambda e, n: dequantized[f"{prefix}.{e}.{n}.weight"]
    return (torch.stack([torch.cat([w(e, "w1"), w(e, "w3")]) for e in range(E)]),
            torch.stack([w(e, "w2") for e in range(E)]))


def f4_loads(tmp_path) -> bool:
    """Whether this safetensors / torch round-trip an F4 (float4_e2m1fn_x2) tensor, bytes and header shape."""
    t = torch.tensor([[0x21, 0x43]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    try:
        save_file({"t": t}, tmp_path / "f4.safetensors")
        with SafetensorsCheckpoint(tmp_path) as ckpt:
            return ckpt.dtype("t") == "F4" and ckpt.shape("t") == [1, 4] and torch.equal(ckpt.get("t").view(torch.uint8),
                                                                                         t.view(torch.uint8))
    except Exception:
        return False


WEIGHT_DTYPES = [pytest.param(torch.int8, id="int8"), pytest.param(torch.float4_e2m1fn_x2, id="F4")]


@pytest.mark.parametrize("weight_format", [None, "mxfp4"])
@pytest.mark.parametrize("scale_name, scale_dtype", [("scale", torch.float8_e8m0fnu),
                                                     ("weight_scale_inv", torch.float32)], ids=["e8m0", "fp32"])
@pytest.mark.parametrize("weight_dtype", WEIGHT_DTYPES)
def test_fp4_checkpoint_streams_exactly(tmp_path, weight_format, scale_name, scale_dtype, weight_dtype):
    if weight_dtype != torch.int8 and not f4_loads(tmp_path):
        pytest.skip("this safetensors / torch cannot round-trip F4 tensors")
    model = tiny_model("deepseek_v4")
    model.save_pretrained(tmp_path / "ckpt")
    dequantized = fp4_checkpoint(tmp_path / "ckpt", scale_name, scale_dtype, weight_dtype)
    with torch.no_grad():  # the reference: the unpatched model holding the dequantized experts
        for i, layer in enumerate(model.model.layers):
            gate_up, down = stacked(dequantized, f"model.layers.{i}.ffn.experts")
            layer.mlp.experts.gate_up_proj.copy_(gate_up)
            layer.mlp.experts.down_proj.copy_(down)
    ref = logits(model)
    ref_seq, ref_step = greedy(model)
    loaded = hf.from_pretrained(tmp_path / "ckpt", dtype=torch.float32, progress=False, weight_format=weight_format)
    assert loaded.ktmoe_report.replaced_classes == {"DeepseekV4Experts": 2}
    for i, layer in enumerate(loaded.model.layers):  # the packed weights are the checkpoint's values
        gate_up, down, fmt = unpack_experts(layer.mlp.experts.ktmoe.packed_tensors())
        assert fmt == (weight_format or "bf16")
        want_gu, want_dn = stacked(dequantized, f"model.layers.{i}.ffn.experts")
        assert torch.equal(gate_up.float(), want_gu) and torch.equal(down.float(), want_dn)
    out = logits(loaded)
    assert_close_logits(out, ref)  # exact weights: only the activations' rounding
    assert_same_greedy_up_to_ties(loaded, ref_seq, ref_step, (out - ref).abs().max().item(), torch.bfloat16)


def layer_tensors(weight_dtype=torch.int8) -> dict:
    """One layer of DeepSeek-V4 FP4 experts as tensors: {key: tensor} with e8m0 ``.scale`` tensors, the weights'
    bytes as ``weight_dtype`` (int8, or float4_e2m1fn_x2: safetensors' F4)."""
    g = torch.Generator().manual_seed(0)
    t = {}
    for e in range(E):
        for name, (n, k) in {"w1": (I, H), "w3": (I, H), "w2": (H, I)}.items():
            blocks, scales = quantize_mxfp4(torch.randn(n, k, generator=g))
            t[f"{PREFIX}.{e}.{name}.weight"] = blocks.flatten(-2).view(weight_dtype)
            t[f"{PREFIX}.{e}.{name}.scale"] = scales.view(torch.float8_e8m0fnu)
    return t


@pytest.fixture
def ckpt_tensors():
    return layer_tensors()


def read(tmp_path, tensors, exact=True):
    save_file(tensors, tmp_path / "model.safetensors")
    with SafetensorsCheckpoint(tmp_path) as ckpt:
        reader = find_experts(ckpt, [PREFIX], H, I, num_experts=E)
        return list(reader.mxfp4_experts(range(E)) if exact else reader.experts(range(E)))


@pytest.mark.parametrize("weight_dtype", WEIGHT_DTYPES)
def test_reader_keeps_codes_and_scale_bytes(tmp_path, weight_dtype):
    if weight_dtype != torch.int8 and not f4_loads(tmp_path):
        pytest.skip("this safetensors / torch cannot round-trip F4 tensors")
    ckpt_tensors = layer_tensors(weight_dtype)
    got = read(tmp_path, ckpt_tensors)
    for e, (gate_up, down, gate_up_scale, down_scale) in enumerate(got):
        for name, codes, scale, rows in (("w1", gate_up, gate_up_scale, slice(0, I)),
                                         ("w3", gate_up, gate_up_scale, slice(I, 2 * I)), ("w2", down, down_scale, None)):
            packed = ckpt_tensors[f"{PREFIX}.{e}.{name}.weight"].view(torch.uint8)
            codes, scale = (codes, scale) if rows is None else (codes[rows], scale[rows])
            assert torch.equal(codes[:, 0::2] | (codes[:, 1::2] << 4), packed)  # the low nibble first
            assert torch.equal(scale, ckpt_tensors[f"{PREFIX}.{e}.{name}.scale"].view(torch.uint8))
    dense = read(tmp_path, ckpt_tensors, exact=False)
    blocks = ckpt_tensors[f"{PREFIX}.3.w2.weight"].view(torch.uint8).reshape(H, I // 32, 16)
    assert torch.equal(dense[3][1], dequantize_mxfp4(blocks, ckpt_tensors[f"{PREFIX}.3.w2.scale"].view(torch.uint8)))


def _nan_scale(t):
    t = t.view(torch.uint8).clone()
    t[5, 1] = 0xFF
    return t.view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("key, change, match", [
    pytest.param("2.w3.scale", _nan_scale, rf"{PREFIX}\.2\.w3\.scale: E8M0 scale byte 0xFF \(NaN\) at \[5, 1\]",
                 id="nan-scale"),
    pytest.param("2.w3.scale", lambda t: t.float() * 3, rf"{PREFIX}\.2\.w3\.scale: scale .* is not a power of two",
                 id="not-power-of-two"),
    pytest.param("2.w3.scale", lambda t: t[:, :1].contiguous(), rf"{PREFIX}\.2\.w3\.scale: shape \[32, 1\] .* "
                 r"expected \[32, 2\]", id="scale-shape"),
    pytest.param("4.w2.weight", lambda t: t[:, :8].contiguous(), rf"{PREFIX}\.4\.w2\.weight: shape \[64, 8\] .* "
                 r"expected \[64, 16\]", id="weight-shape"),
    pytest.param("4.w2.weight", lambda t: t.to(torch.bfloat16), rf"{PREFIX}\.4\.w2\.weight: dtype BF16 .* the other "
                 "experts of this block are FP4", id="mixed"),
    pytest.param("4.w2.scale", None, rf"{PREFIX}\.4\.w2\.weight: FP4 \(packed e2m1\) weight without its scale",
                 id="missing-scale"),
])
def test_refusals_name_the_tensor(tmp_path, ckpt_tensors, key, change, match):
    key = f"{PREFIX}.{key}"
    if change is None:
        del ckpt_tensors[key]
    else:
        ckpt_tensors[key] = change(ckpt_tensors[key])
    with pytest.raises(ValueError, match=match):
        read(tmp_path, ckpt_tensors)


def test_f4_weight_of_the_wrong_shape_is_refused(tmp_path):
    """An F4 header counts codes: a w2 of [64, 16] codes (half its inputs) is named with the [64, 32] it needs."""
    if not f4_loads(tmp_path):
        pytest.skip("this safetensors / torch cannot round-trip F4 tensors")
    t = layer_tensors(torch.float4_e2m1fn_x2)
    key = f"{PREFIX}.4.w2.weight"
    t[key] = t[key].view(torch.uint8)[:, :8].contiguous().view(torch.float4_e2m1fn_x2)
    with pytest.raises(ValueError, match=rf"{key}: shape \[64, 16\] .* expected \[64, 32\]"):
        read(tmp_path, t)
