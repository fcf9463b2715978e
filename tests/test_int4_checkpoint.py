"""Int4-group checkpoints (compressed-tensors pack-quantized, GPTQ, AWQ) read by torch_ktmoe.checkpoint: the readers
against each encoding's own dequantization, act-order, and every refusal naming its tensor or field."""
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from torch_ktmoe.checkpoint import SafetensorsCheckpoint, check_int4_config, find_experts
from torch_ktmoe.checkpoint.int4_linear import unpack_int32_nibbles
from torch_ktmoe.reference import moe_reference, relative_error
from tests.helpers.int4_checkpoints import AWQ_ORDER, ct_quantize, gptq_quantize, quantize_int4

pytest.importorskip("compressed_tensors")

E, H, I, L = 3, 256, 160, 1
PREFIX = f"model.layers.{L}.mlp.experts"
SHAPES = {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}
KINDS = ("ct", "ct_asym", "gptq", "awq", "gptq_down_act_order")


def int4_experts_tensors(kind: str, seed: int = 0):
    """({key: tensor} of E experts in ``kind``, [(gate_up [2I, H], down [H, I])] of their dequantized weights)."""
    g = torch.Generator().manual_seed(seed)
    t, ref = {}, []
    for e in range(E):
        deq = {}
        for name, (n, k) in SHAPES.items():
            parts, deq[name] = quantize_int4(kind, torch.randn(n, k, generator=g) / k ** 0.5, name, seed=e)
            t.update({f"{PREFIX}.{e}.{name}.{s}": v for s, v in parts.items()})
        ref.append((torch.cat([deq["gate_proj"], deq["up_proj"]]), deq["down_proj"]))
    return t, ref


def _write(tmp_path, t) -> str:
    save_file(t, os.path.join(tmp_path, "model.safetensors"))
    return str(tmp_path)


def _read(path):
    with SafetensorsCheckpoint(path) as ckpt:
        reader = find_experts(ckpt, [PREFIX], H, I)
        return reader, list(reader.experts(range(E))), list(reader.int4_experts(range(E)))


def _dequantize_grouped(codes, scale, zero, group):
    k = codes.shape[1]
    zero = torch.full_like(scale, 8) if zero is None else zero.float()
    return scale.repeat_interleave(group, 1)[:, :k] * (codes.float() - zero.repeat_interleave(group, 1)[:, :k])


def test_nibble_unpacking_follows_each_packing():
    word = torch.tensor([[int.from_bytes(bytes([0x10, 0x32, 0x54, 0x76]), "little", signed=True),
                          int.from_bytes(bytes([0x98, 0xBA, 0xDC, 0xFE]), "little", signed=True)]], dtype=torch.int32)
    assert unpack_int32_nibbles(word, 1, 16).tolist() == [list(range(16))]
    assert unpack_int32_nibbles(word.t(), 0, 16).t().tolist() == [list(range(16))]
    # AWQ: nibble i holds column order[i]
    assert unpack_int32_nibbles(word[:, :1], 1, 8, AWQ_ORDER).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]


@pytest.mark.parametrize("kind", KINDS)
def test_readers_match_the_encodings_own_dequantization(tmp_path, kind):
    t, ref = int4_experts_tensors(kind)
    reader, dense, exact = _read(_write(tmp_path, t))
    assert reader.group_size == (32 if kind.startswith("ct") else 128)
    for (gu, dn), (rgu, rdn) in zip(dense, ref):
        assert gu.dtype == torch.float32 and torch.equal(gu, rgu) and torch.equal(dn, rdn)
    g = reader.group_size
    for (gq, dq, gs, ds, gz, dz), (rgu, rdn) in zip(exact, ref):
        assert gq.dtype == dq.dtype == torch.uint8 and int(gq.max()) <= 15 and int(dq.max()) <= 15
        assert gs.shape == (2 * I, -(-H // g)) and ds.shape == (H, -(-I // g))
        assert (gz is None) == (dz is None) == (kind == "ct")
        gu, dn = _dequantize_grouped(gq, gs, gz, g), _dequantize_grouped(dq, ds, dz, g)
        if kind.endswith("act_order"):  # I permuted: the same layer, not the same tensors
            assert not torch.equal(dn, rdn)
            assert torch.equal(torch.sort(dn, 1).values, torch.sort(rdn, 1).values)
        else:
            assert torch.equal(gu, rgu) and torch.equal(dn, rdn)


def test_down_act_order_is_the_same_layer(tmp_path):
    t, ref = int4_experts_tensors("gptq_down_act_order")
    reader, _, exact = _read(_write(tmp_path, t))
    g = reader.group_size
    gx = torch.Generator().manual_seed(3)
    x = torch.randn(9, H, generator=gx)
    w, ids = torch.topk(torch.softmax(torch.randn(9, E, generator=gx), -1), 2, dim=-1)
    permuted = [(_dequantize_grouped(gq, gs, gz, g), _dequantize_grouped(dq, ds, dz, g))
                for gq, dq, gs, ds, gz, dz in exact]
    got = moe_reference(x, ids, w, torch.stack([p[0] for p in permuted]), torch.stack([p[1] for p in permuted]))
    want = moe_reference(x, ids, w, torch.stack([r[0] for r in ref]), torch.stack([r[1] for r in ref]))
    assert relative_error(got, want) < 1e-6


def test_compressed_tensors_bf16_decompress_is_the_exact_values_rounded(tmp_path):
    """compressed-tensors' own decompress with its bf16 scales rounds each product once; the reader's fp32
    values are exact, so rounding them to bf16 gives the library's result."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from tests.helpers.int4_checkpoints import ct_scheme

    t, _ = int4_experts_tensors("ct")
    _, dense, _ = _read(_write(tmp_path, t))
    parts = {s: t[f"{PREFIX}.0.gate_proj.{s}"] for s in ("weight_packed", "weight_scale", "weight_shape")}
    bf16 = PackedQuantizationCompressor.decompress(parts, ct_scheme())["weight"]
    assert bf16.dtype == torch.bfloat16 and torch.equal(dense[0][0][:I].to(torch.bfloat16), bf16)


def test_gptq_v1_zero_nibble_15_is_zero_point_16(tmp_path):
    t, _ = int4_experts_tensors("gptq")
    key = f"{PREFIX}.0.down_proj.qzeros"
    t[key] = torch.full_like(t[key], -1)  # every nibble 15: z = 16
    _, dense, exact = _read(_write(tmp_path, t))
    qweight = unpack_int32_nibbles(t[f"{PREFIX}.0.down_proj.qweight"], 0, I).t().float()
    scales = t[f"{PREFIX}.0.down_proj.scales"].float().t().repeat_interleave(128, 1)[:, :I]
    assert torch.equal(dense[0][1], scales * (qweight - 16))
    assert int(exact[0][5].min()) == int(exact[0][5].max()) == 16


# ------------------------------------------------------------------ refusals
def _refuses(tmp_path, t, match, error=ValueError):
    with pytest.raises(error, match=match):
        _read(_write(tmp_path, t))


def test_weight_shape_that_disagrees_is_refused(tmp_path):
    t, _ = int4_experts_tensors("ct")
    t[f"{PREFIX}.1.up_proj.weight_shape"] = torch.tensor([I, H + 32])
    _refuses(tmp_path, t, rf"{PREFIX}\.1\.up_proj\.weight_shape: \[{I}, {H + 32}\] .* \(weight_shape disagrees\)")


def test_weight_shape_of_the_wrong_shape_is_refused_from_the_header(tmp_path):
    """A weight_shape that is not two values is refused by its header's shape, in a short message (it was read
    whole and printed: a 128 MiB tensor gave a 50 MB message)."""
    t, _ = int4_experts_tensors("ct")
    key = f"{PREFIX}.1.up_proj.weight_shape"
    t[key] = torch.full((100_000,), 7)
    with pytest.raises(ValueError, match=rf"{key}: shape \[100000\] .* expected \[2\]") as err:
        _read(_write(tmp_path, t))
    assert len(str(err.value)) < 500


@pytest.mark.parametrize("kind, suffix, bad, match", [
    ("ct", "weight_scale", torch.ones(H, 4, dtype=torch.bfloat16), r"4 groups over k=160 inputs fit no group size"),
    ("ct", "weight_scale", torch.ones(7, 5, dtype=torch.bfloat16), r"shape \[7, 5\] .* expected \[256, groups\]"),
    ("ct", "weight_scale", torch.ones(H, 5, dtype=torch.int32), r"dtype I32 .* expected a float scale"),
    ("gptq", "scales", torch.ones(2, 7, dtype=torch.float16), r"shape \[2, 7\] .* expected \[groups, 256\]"),
    ("gptq", "qzeros", torch.zeros(3, H // 8, dtype=torch.int32), r"shape \[3, 32\] .* expected \[2, 32\]"),
    ("gptq", "qweight", torch.zeros(I // 8, H, dtype=torch.int64), r"dtype I64 .* expected I32"),
    ("gptq", "qweight", torch.zeros(I, H, dtype=torch.int32), r"fits neither GPTQ \(\[20, 256\]\) nor AWQ"),
])
def test_bad_int4_tensors_are_refused_naming_them(tmp_path, kind, suffix, bad, match):
    t, _ = int4_experts_tensors(kind)
    key = f"{PREFIX}.2.down_proj.{suffix}"
    t[key] = bad
    _refuses(tmp_path, t, rf"{key}: .*{match}")


def test_missing_scale_is_refused(tmp_path):
    t, _ = int4_experts_tensors("ct")
    del t[f"{PREFIX}.2.gate_proj.weight_scale"]
    _refuses(tmp_path, t, rf"{PREFIX}\.2\.gate_proj\.weight_packed: compressed-tensors .* without "
                          rf"{PREFIX}\.2\.gate_proj\.weight_scale")


@pytest.mark.parametrize("other", ["dense", "gptq"])
def test_mixed_format_layer_is_refused(tmp_path, other):
    t, _ = int4_experts_tensors("ct")
    for key in [k for k in t if k.startswith(f"{PREFIX}.1.down_proj.")]:
        del t[key]
    if other == "dense":
        t[f"{PREFIX}.1.down_proj.weight"] = torch.randn(H, I)
    else:
        t.update({f"{PREFIX}.1.down_proj.{s}": v for s, v in gptq_quantize(torch.randn(H, I))[0].items()})
    _refuses(tmp_path, t, rf"{PREFIX}\.1\.down_proj: holds .* but the experts under {PREFIX} are compressed-tensors "
                          r"pack-quantized int4 \(weight_packed\); a layer must be one format")


def test_gate_act_order_is_refused_naming_the_tensor(tmp_path):
    t, _ = int4_experts_tensors("gptq")
    parts, _ = gptq_quantize(torch.randn(I, H), act_order=True, seed=4)
    t.update({f"{PREFIX}.0.up_proj.{s}": v for s, v in parts.items()})
    path = _write(tmp_path, t)
    with SafetensorsCheckpoint(path) as ckpt:
        reader = find_experts(ckpt, [PREFIX], H, I)
        assert len(list(reader.experts(range(E)))) == E  # dequantized: any g_idx is fine
        with pytest.raises(ValueError, match=rf"{PREFIX}\.0\.up_proj: act-order g_idx over the hidden inputs"):
            list(reader.int4_experts(range(E)))


def test_unbalanced_g_idx_is_refused(tmp_path):
    t, _ = int4_experts_tensors("gptq_down_act_order")
    key = f"{PREFIX}.0.down_proj.g_idx"
    t[key] = torch.zeros(I, dtype=torch.int32)  # every input in group 0
    path = _write(tmp_path, t)
    with SafetensorsCheckpoint(path) as ckpt:
        with pytest.raises(ValueError, match=rf"{PREFIX}\.0\.down_proj: its act-order g_idx does not put 128 inputs"):
            list(find_experts(ckpt, [PREFIX], H, I).int4_experts(range(E)))
    t[key] = torch.full((I,), 2, dtype=torch.int32)
    _refuses(tmp_path, t, rf"{key}: group indices in \[2, 2\] .* outside the 2 groups")


@pytest.mark.parametrize("qc, match", [
    ({"quant_method": "gptq", "bits": 8}, r"quantization_config\.bits = 8; torch_ktmoe reads 4-bit GPTQ"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}, r"checkpoint_format = 'gptq_v2'"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, r"quantization_config\.version = 'gemv'"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}},
     r"quantization_config\.format = 'int-quantized'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "int", "strategy": "group"}}}},
     r"quantization_config\.config_groups\.group_0\.weights\.num_bits = 8"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"},
                              "input_activations": {"num_bits": 8}}}},
     r"config_groups\.g\.input_activations = .* weight-only"),
    ({"quant_method": "hqq"}, r"quant_method = 'hqq'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 0}, r"quantization_config\.group_size = 0; .* positive integer"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": "96"}}}},
     r"quantization_config\.config_groups\.g\.weights\.group_size = '96'"),
])
def test_int4_configs_torch_ktmoe_does_not_read_are_refused_naming_the_field(qc, match):
    with pytest.raises(ValueError, match=match):
        check_int4_config(qc, "ckpt/config.json")


def test_the_fixture_configs_are_read():
    from tests.helpers.int4_checkpoints import ct_config, gptq_config

    for qc in (ct_config(), gptq_config(), gptq_config(awq=True), gptq_config(desc_act=True)):
        check_int4_config(qc, "fixture")


# ------------------------------------------------------------------ the config's group size
G96 = 192  # k = 192 inputs in groups of 96 make 2 groups, as groups of 128 would: only the config tells them apart


def _group_checkpoint(tmp_path, kind: str, group: int, config_group: int):
    """E experts [192, 192] in ``kind`` ("ct" / "awq") quantized in groups of ``group``, and a config.json naming
    ``config_group``; returns (path, [(gate_up, down)] of their dequantized weights)."""
    from tests.helpers.int4_checkpoints import ct_config, gptq_config

    g = torch.Generator().manual_seed(0)
    t, ref = {}, []
    for e in range(E):
        deq = {}
        for name in ("gate_proj", "up_proj", "down_proj"):
            w = torch.randn(G96, G96, generator=g) / G96 ** 0.5
            parts, deq[name] = ct_quantize(w, group) if kind == "ct" else gptq_quantize(w, group, awq=True)
            t.update({f"{PREFIX}.{e}.{name}.{s}": v for s, v in parts.items()})
        ref.append((torch.cat([deq["gate_proj"], deq["up_proj"]]), deq["down_proj"]))
    path = _write(tmp_path, t)
    qc = ct_config(config_group) if kind == "ct" else gptq_config(config_group, awq=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"quantization_config": qc}, f)
    return path, ref


@pytest.mark.parametrize("kind", ["ct", "awq"])
def test_a_group_size_that_is_no_power_of_two_is_read_from_the_config(tmp_path, kind):
    path, ref = _group_checkpoint(tmp_path, kind, 96, 96)
    with SafetensorsCheckpoint(path) as ckpt:
        reader = find_experts(ckpt, [PREFIX], G96, G96)
        assert reader.group_size == 96
        for (gu, dn), (rgu, rdn) in zip(reader.experts(range(E)), ref):
            assert torch.equal(gu, rgu) and torch.equal(dn, rdn)
        for (gq, dq, gs, ds, gz, dz), (rgu, rdn) in zip(reader.int4_experts(range(E)), ref):
            assert gs.shape == (2 * G96, 2)
            assert torch.equal(_dequantize_grouped(gq, gs, gz, 96), rgu)
            assert torch.equal(_dequantize_grouped(dq, ds, dz, 96), rdn)


@pytest.mark.parametrize("kind", ["ct", "awq"])
def test_scales_that_do_not_fit_the_configs_group_size_are_refused(tmp_path, kind):
    path, _ = _group_checkpoint(tmp_path, kind, 64, 96)  # 3 groups of 64; the config says 96 (2 groups)
    scale = "weight_scale" if kind == "ct" else "scales"
    match = (rf"{PREFIX}\.0\.gate_proj\.{scale}: 3 groups over k=192 inputs .* but the quantization_config's "
             r"group_size 96 gives 2 \(ceil\(k / group_size\)\)")
    with SafetensorsCheckpoint(path) as ckpt, pytest.raises(ValueError, match=match):
        find_experts(ckpt, [PREFIX], G96, G96)
