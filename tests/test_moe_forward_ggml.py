"""ktmoe::moe_forward_ggml: GGML experts where they lie (a GGUF's gate / up / down rows, each its own type) through
the MoE driver on every ISA, against the fp32 reference over the exact weights (ggml_dequantize, itself gguf's bits)
with bf16 activations: decode and prefill items, biases, a mix of types per role, a GGUF file mapped in place, the
same bits for any thread count, and bad input named."""
import numpy as np
import pytest
import torch

from gguf import GGMLQuantizationType as Q

from tests.helpers import QUANTIZED_REFERENCE_TOLERANCE, random_routing
from ktmoe_harness.ggml_rows import ggml_experts as harness_experts
from tests.helpers.gguf_files import write_moe_gguf
from torch_ktmoe import ops
from torch_ktmoe.checkpoint.gguf import expert_layers, open_gguf
from torch_ktmoe.reference import moe_reference, relative_error

# gate, up, down types: Q4_K_M's mix, the 32-blocks, the low-bit k-quants, i-quants, mxfp4, plain floats.
MIXES = {
    "q4_K_M": (Q.Q4_K, Q.Q4_K, Q.Q6_K),
    "q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0),
    "q4_0/q4_1/q5_0": (Q.Q4_0, Q.Q4_1, Q.Q5_0),
    "q5_1/iq4_nl/q5_K": (Q.Q5_1, Q.IQ4_NL, Q.Q5_K),
    "q2_K/q3_K/q3_K": (Q.Q2_K, Q.Q3_K, Q.Q3_K),
    "iq4_xs": (Q.IQ4_XS, Q.IQ4_XS, Q.IQ4_XS),
    "mxfp4": (Q.MXFP4, Q.MXFP4, Q.MXFP4),
    "iq2_xxs/iq3_s/iq2_s": (Q.IQ2_XXS, Q.IQ3_S, Q.IQ2_S),
    "iq1_s/iq1_m/iq2_xs": (Q.IQ1_S, Q.IQ1_M, Q.IQ2_XS),
    "iq3_xxs": (Q.IQ3_XXS, Q.IQ3_XXS, Q.IQ3_XXS),
    "f16/bf16/f32": (Q.F16, Q.BF16, Q.F32),
}


def ggml_experts(types, e=4, h=256, i=256, seed=0):
    return harness_experts(types, e, h, i, seed)


def reference(x, ids, w, gate, up, down, types, **kw):
    gate_up = torch.cat([ops.ggml_dequantize(gate, int(types[0])), ops.ggml_dequantize(up, int(types[1]))], 1)
    return moe_reference(x, ids, w, gate_up, ops.ggml_dequantize(down, int(types[2])), "bf16", **kw)


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_matches_reference(isa, mix, tokens):
    types = MIXES[mix]
    gate, up, down = ggml_experts(types)
    x = torch.randn(tokens, 256, dtype=torch.bfloat16)
    ids, w = random_routing(tokens, 4, 2)
    out = ops.moe_forward_ggml(x, ids, w, gate, up, down, types)
    ref = reference(x, ids, w, gate, up, down, types)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert relative_error(out.float(), ref) < QUANTIZED_REFERENCE_TOLERANCE + 4e-3  # + out's bf16 rounding
    out32 = ops.moe_forward_ggml(x.float(), ids, w, gate, up, down, types)
    assert relative_error(out32, ref) < QUANTIZED_REFERENCE_TOLERANCE


def test_biases_activation_skipped_ids_and_dtypes(isa):
    types = MIXES["q4_K_M"]
    gate, up, down = ggml_experts(types, i=512)
    x = torch.randn(7, 256)
    ids, w = random_routing(7, 4, 3)
    ids[0, 1] = -1
    b13, b2 = torch.randn(4, 1024) * 0.1, torch.randn(4, 256) * 0.1
    params = ops.activation_params("swiglu_oai")
    out = ops.moe_forward_ggml(x.half(), ids, w, gate, up, down, types, w13_bias=b13, w2_bias=b2,
                               activation="swiglu_oai", activation_params=params)
    ref = reference(x.half().float(), ids, w, gate, up, down, types, gate_up_bias=b13, down_bias=b2,
                    activation="swiglu_oai", activation_params=dict(zip(ops.GATED_ACTIVATIONS["swiglu_oai"]["params"],
                                                                       params)))
    assert out.dtype == torch.float16
    assert relative_error(out.float(), ref) < QUANTIZED_REFERENCE_TOLERANCE + 2e-3
    assert torch.equal(ops.moe_forward_ggml(x[:0], ids[:0], w[:0], gate, up, down, types), x[:0])


@pytest.mark.parametrize("tokens", [6, 48])  # 48: about 24 rows an expert, the amx table's tiles
@pytest.mark.parametrize("mix", ["q4_K_M", "q8_0", "iq4_xs"])
def test_a_non_finite_activation_stays_in_its_row(isa, mix, tokens):
    """A NaN or Inf in one token's activations makes that token's output non-finite, and no other token's."""
    types = MIXES[mix]
    gate, up, down = ggml_experts(types)
    x = torch.randn(tokens, 256, dtype=torch.bfloat16)
    ids, w = random_routing(tokens, 4, 2)
    clean = ops.moe_forward_ggml(x, ids, w, gate, up, down, types)
    x[1, 7], x[4, 200] = float("nan"), float("inf")
    out = ops.moe_forward_ggml(x, ids, w, gate, up, down, types)
    assert not torch.isfinite(out[1]).all() and not torch.isfinite(out[4]).all()
    keep = [t for t in range(tokens) if t not in (1, 4)]
    assert torch.equal(out[keep], clean[keep])


@pytest.mark.parametrize("tokens", [33, 90])  # 90: about 22 rows an expert, the amx table's tiles
def test_same_bits_for_any_thread_count(isa, tokens):
    types = MIXES["q4_K_M"]
    gate, up, down = ggml_experts(types, e=8, i=512)
    x = torch.randn(tokens, 256, dtype=torch.bfloat16)
    ids, w = random_routing(tokens, 8, 2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.moe_forward_ggml(x, ids, w, gate, up, down, types)
        torch.set_num_threads(max(2, threads))
        many = ops.moe_forward_ggml(x, ids, w, gate, up, down, types)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_a_gguf_file_in_place(tmp_path):
    """The experts of a GGUF file the gguf package wrote, mapped where they lie (no copy: the tensors' memory is the
    file's mapping), per layer with its own type mix."""
    path = write_moe_gguf(tmp_path / "m.gguf", layers=2, experts=4, hidden=256, inter=256, sane=True,
                          layer_types={1: {"gate": Q.Q8_0, "up": Q.IQ4_XS, "down": Q.Q5_K}})
    model = open_gguf(path)
    x = torch.randn(6, 256, dtype=torch.bfloat16)
    ids, w = random_routing(6, 4, 2)
    maps = open("/proc/self/maps").read()
    for layer in expert_layers(model):
        gate, up, down = (model.rows(t) for t in (layer.gate, layer.up, layer.down))
        assert gate.shape == (4, 256, layer.gate.row_bytes) and down.shape == (4, 256, layer.down.row_bytes)
        types = [t.ggml_type for t in (layer.gate, layer.up, layer.down)]
        out = ops.moe_forward_ggml(x, ids, w, gate, up, down, types)
        ref = reference(x, ids, w, gate, up, down, types)
        assert relative_error(out.float(), ref) < QUANTIZED_REFERENCE_TOLERANCE + 4e-3
        with open(path, "rb") as f:  # the bytes are the file's
            f.seek(layer.down.offset)
            assert f.read(64) == bytes(down.reshape(-1)[:64].tolist())
    maps = open("/proc/self/maps").read()
    start = model.rows(expert_layers(model)[0].gate).data_ptr()
    mapped = [l for l in maps.splitlines() if l.endswith(str(path))]
    assert any(int(l.split("-")[0], 16) <= start < int(l.split()[0].split("-")[1], 16) for l in mapped)


def test_compiles_and_opcheck():
    types = MIXES["q8_0"]
    gate, up, down = ggml_experts(types)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    ids, w = random_routing(3, 4, 2)
    args = (x, ids, w, gate, up, down, [int(t) for t in types])
    torch.library.opcheck(torch.ops.ktmoe.moe_forward_ggml.default, args)
    fn = torch.compile(lambda x: ops.moe_forward_ggml(x, ids, w, gate, up, down, types) + 1, fullgraph=True)
    assert torch.equal(fn(x), ops.moe_forward_ggml(*args) + 1)


def test_bad_input_is_named():
    types = MIXES["q4_K_M"]
    gate, up, down = ggml_experts(types)
    x = torch.randn(2, 256)
    ids, w = random_routing(2, 4, 2)
    run = ops.moe_forward_ggml
    with pytest.raises(RuntimeError, match=r"ggml_types must be \[gate, up, down\] type ids, got 2"):
        run(x, ids, w, gate, up, down, types[:2])
    with pytest.raises(RuntimeError, match=r"tq1_0 \(id 34\) is not read by torch_ktmoe"):
        run(x, ids, w, gate, up, down, [Q.TQ1_0, types[1], types[2]])
    with pytest.raises(RuntimeError, match=r"gate's rows of 143 bytes are not whole q4_K blocks"):
        run(x, ids, w, gate[..., :143].contiguous(), up, down, types)
    with pytest.raises(RuntimeError, match=r"hidden_states has H = 128 but gate / up rows hold 256 / 256"):
        run(x[:, :128], ids, w, gate, up, down, types)
    with pytest.raises(RuntimeError, match=r"down has 128 rows, expected H = 256"):
        run(x, ids, w, gate, up, down[:, :128], types)
    with pytest.raises(RuntimeError, match=r"gate, up and down have 4, 3 and 4 experts"):
        run(x, ids, w, gate, up[:3], down, types)
    with pytest.raises(RuntimeError, match=r"up has 240 rows, expected 256"):
        run(x, ids, w, gate, up[:, :240], down, types)
    with pytest.raises(RuntimeError, match=r"must be a uint8 CPU tensor \[E, rows, row bytes\]"):
        run(x, ids, w, gate.view(torch.int8), up, down, types)
    with pytest.raises(RuntimeError, match=r"rows must be contiguous"):
        run(x, ids, w, gate[:, ::2], up[:, ::2], down, types)
    with pytest.raises(RuntimeError, match=r"topk_ids holds expert id 4 but the GGML experts have only 4 experts"):
        run(x, torch.full_like(ids, 4), w, gate, up, down, types)
    g, u, d = ggml_experts((Q.Q8_0, Q.Q8_0, Q.Q8_0), h=256, i=224)
    ref_shapes = run(x, ids, w, g, u, d, MIXES["q8_0"])  # I = 224: a multiple of 16 and of q8_0's 32
    assert ref_shapes.shape == x.shape
    g, u, d = ggml_experts((Q.F32, Q.F32, Q.F32), h=256, i=200)
    with pytest.raises(RuntimeError, match=r"I = 200 and H = 256 must be multiples of 16"):
        run(x, ids, w, g, u, d, [Q.F32] * 3)
