"""Expert dtypes are checked by every reader (issue 21 item 1): fp32 / bf16 / fp16 and the quantized
layouts a reader knows (FP8 + scales, MXFP4) are read, anything else is refused naming the key, its dtype
and the companion tensors beside it -- never packed as numbers."""
import json
import os
import re

import pytest
import torch
from safetensors.torch import save_file

from torch_ktmoe.checkpoint import SafetensorsCheckpoint, find_experts
from torch_ktmoe.sglang import KTMoEWrapper
from tests.helpers import random_experts
from tests.helpers.fp8 import quantize_blocks

E, H, I, L = 4, 64, 32, 3
PREFIX = f"model.layers.{L}.mlp.experts"


def _write(path, tensors):
    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, "model.safetensors"))
    return str(path)


def _per_expert(dtype=torch.bfloat16, first=None, extra=None):
    """Per-expert keys in ``dtype``; ``first``: expert 0's gate_proj replaced; ``extra``: more tensors."""
    gate_up, down = random_experts(E, H, I)
    t = {}
    for e in range(E):
        t.update({f"{PREFIX}.{e}.gate_proj.weight": gate_up[e, :I].to(dtype),
                  f"{PREFIX}.{e}.up_proj.weight": gate_up[e, I:].to(dtype),
                  f"{PREFIX}.{e}.down_proj.weight": down[e].to(dtype)})
    if first is not None:
        t[f"{PREFIX}.0.gate_proj.weight"] = first
    t.update(extra or {})
    return t


def _read(path):
    with SafetensorsCheckpoint(path) as ckpt:
        reader = find_experts(ckpt, [PREFIX], H, I, num_experts=E)
        return [gu for gu, _ in reader.experts(range(E))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float_experts_are_read(tmp_path, dtype):
    assert len(_read(_write(tmp_path, _per_expert(dtype)))) == E


@pytest.mark.parametrize("dtype, name", [(torch.int8, "I8"), (torch.int32, "I32"), (torch.bool, "BOOL")])
def test_integer_expert_tensors_are_refused_naming_key_and_dtype(tmp_path, dtype, name):
    bad = torch.ones(I, H, dtype=dtype)
    zero = {f"{PREFIX}.0.gate_proj.weight_zero_point": torch.zeros(I, dtype=torch.int8)}
    path = _write(tmp_path, _per_expert(first=bad, extra=zero))
    with pytest.raises(ValueError, match=rf"{PREFIX}\.0\.gate_proj\.weight: expert weight of dtype {name} .*"
                                         rf"companion tensors found: \['{PREFIX}\.0\.gate_proj\.weight_zero_point'\]"):
        _read(path)


def test_fused_integer_tensor_is_refused(tmp_path):
    gate_up, down = random_experts(E, H, I)
    path = _write(tmp_path, {f"{PREFIX}.gate_up_proj": gate_up.to(torch.int8), f"{PREFIX}.down_proj": down})
    with pytest.raises(ValueError, match=rf"{PREFIX}\.gate_up_proj: expert weight of dtype I8 .* found: none"):
        _read(path)


def test_fp8_weight_without_its_scale_is_refused(tmp_path):
    q, _ = quantize_blocks(torch.randn(I, H))
    path = _write(tmp_path, _per_expert(first=q))  # expert 0's gate in FP8, no weight_scale_inv anywhere
    with pytest.raises(ValueError, match=rf"{PREFIX}\.0\.gate_proj\.weight: FP8 \(F8_E4M3\) weight without its "
                                         "scale"):
        _read(path)


def test_fp8_scale_of_the_wrong_shape_is_refused(tmp_path):
    t = {}
    for e in range(E):
        for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            q, s = quantize_blocks(torch.randn(*shape))
            t[f"{PREFIX}.{e}.{name}.weight"], t[f"{PREFIX}.{e}.{name}.weight_scale_inv"] = q, s
    t[f"{PREFIX}.2.down_proj.weight_scale_inv"] = torch.ones(3, 3)
    with pytest.raises(ValueError, match=rf"{PREFIX}\.2\.down_proj\.weight_scale_inv: scale shape \[3, 3\] fits "
                                         r"neither 128x128 blocks"):
        _read(_write(tmp_path, t))


@pytest.mark.parametrize("marker, what", [("qweight", "GPTQ / AWQ int4"),
                                          ("weight_packed", "compressed-tensors pack-quantized int4")])
def test_int4_group_experts_in_an_unread_layout_are_refused_naming_the_tensor(tmp_path, marker, what):
    t = {f"{PREFIX}.gate_up_proj.{marker}": torch.zeros(E, 8, 4, dtype=torch.int32),
         f"{PREFIX}.gate_up_proj.weight_scale": torch.ones(E, 8, 1, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match=rf"{PREFIX}\.gate_up_proj\.{marker}: the experts under {PREFIX} are "
                                         rf"{re.escape(what)}.* in a layout torch_ktmoe does not read"):
        _read(_write(tmp_path, t))


def test_sglang_refuses_integer_experts(tmp_path):
    path = _write(tmp_path, _per_expert(first=torch.ones(I, H, dtype=torch.int32)))
    wrapper = KTMoEWrapper(L, E, 2, H, I, num_gpu_experts=0, weight_path=path, method="BF16")
    with pytest.raises(ValueError, match=rf"{PREFIX}\.0\.gate_proj\.weight: expert weight of dtype I32"):
        wrapper.load_weights()
    gate = torch.ones(E, I, H, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"gate_proj: dtype torch\.int8; dense expert weights must be"):
        wrapper.load_weights_from_tensors(gate, gate.float(), torch.ones(E, H, I))


def test_hf_streaming_refuses_integer_experts(tmp_path):
    from tests.helpers.hf_models import source_checkpoint
    import torch_ktmoe.hf as kthf
    from safetensors.torch import load_file

    src = source_checkpoint(tmp_path, "qwen3_moe")
    tensors = load_file(os.path.join(src, "model.safetensors"))
    key = "model.layers.1.mlp.experts.3.down_proj.weight"
    tensors[key] = tensors[key].to(torch.int8)
    save_file(tensors, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{key}: expert weight of dtype I8"):
        kthf.from_pretrained(src, progress=False)


def test_hf_unknown_quant_method_is_refused_naming_it(tmp_path):
    from tests.helpers.hf_models import source_checkpoint
    import torch_ktmoe.hf as kthf

    src = source_checkpoint(tmp_path, "qwen3_moe")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="quantization_config.quant_method 'bitsandbytes' .* reads 'fp8'"):
        kthf.from_pretrained(src, progress=False)


def test_patch_model_refuses_integer_experts():
    from tests.helpers.hf_models import make_model
    from torch_ktmoe.hf import patch_model

    model = make_model("qwen3_moe")
    experts = model.model.layers[0].mlp.experts
    experts.down_proj = torch.nn.Parameter(experts.down_proj.data.to(torch.int8), requires_grad=False)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.down_proj: dtype torch\.int8"):
        patch_model(model)
