"""ktmoe::pack_linear / ktmoe::linear, KTLinear and hf.pack_linears: a dense nn.Linear through the experts' bf16 gemm.

The reference is fp32 F.linear on x and W rounded to bf16 (the op's own rounding of its inputs): only the
summation order and, for bf16 / fp16 x, the output's rounding are left, held to the bf16 row of the format table.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_ktmoe
from tests.helpers import FORMAT_TOLERANCE, QUANTIZED_REFERENCE_TOLERANCE
from tests.helpers.hf_models import PROMPT, assert_same_greedy, greedy, make_model
from torch_ktmoe import hf, ops
from torch_ktmoe.linear import KTLinear

BF16_TOLERANCE = FORMAT_TOLERANCE["bf16"]


def reference(x, weight, bias=None):
    """fp32 F.linear over bf16-rounded x and weight (+ the bias in fp32)."""
    return F.linear(x.bfloat16().float(), weight.bfloat16().float(), None if bias is None else bias.float())


def relative_error(out, ref):
    return ((out.float() - ref).abs().mean() / ref.abs().mean()).item()


@pytest.mark.parametrize("m", [1, 3, 17, 130])
@pytest.mark.parametrize("n, k", [(70, 100), (1000, 600)])  # N, K not multiples of 16 / 32; 1000 x 600: 3 panels
def test_matches_reference_on_every_isa(isa, m, n, k):
    weight, bias = torch.randn(n, k) / k ** 0.5, torch.randn(n)
    x = torch.randn(m, k)
    out = ops.linear(x, ops.pack_linear(weight), n, bias)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert relative_error(out, reference(x, weight, bias)) <= QUANTIZED_REFERENCE_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dtypes_and_3d_input(isa, dtype, with_bias):
    weight = (torch.randn(48, 80) / 80 ** 0.5).to(dtype)
    bias = torch.randn(48).to(dtype) if with_bias else None
    x = torch.randn(2, 5, 80).to(dtype)
    out = ops.linear(x, ops.pack_linear(weight), 48, bias)
    assert out.shape == (2, 5, 48) and out.dtype == dtype
    assert relative_error(out, reference(x, weight, bias)) <= BF16_TOLERANCE


def test_bits_do_not_depend_on_threads_or_rows():
    """Blocks split over threads (decode) or panels and row chunks (prefill): the same bits; a row alone equals
    itself inside a batch (the gemm's sums depend neither on the block split nor on M)."""
    weight, x = torch.randn(300, 200), torch.randn(40, 200)
    packed = ops.pack_linear(weight)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.linear(x, packed, 300)
        torch.set_num_threads(max(2, threads))
        many = ops.linear(x, packed, 300)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)
    alone = ops.linear(x[7:8], packed, 300)
    if torch_ktmoe.active_isa() != "amx":
        assert torch.equal(alone, one[7:8])
    else:  # 4 rows and more run on AMX tiles, which round bf16 dots their own way (docs/isa.md)
        assert torch.equal(alone, ops.linear(x[5:8], packed, 300)[2:3])
        torch.testing.assert_close(alone, one[7:8], rtol=1e-3, atol=1e-3)


def test_empty_rows():
    out = ops.linear(torch.empty(0, 3, 64), ops.pack_linear(torch.randn(20, 64)), 20)
    assert out.shape == (0, 3, 20)


def test_packed_layout_is_one_plain_bf16_matrix():
    weight = torch.randn(70, 100)
    packed = ops.pack_linear(weight)
    assert packed.dtype == torch.uint8 and packed.dim() == 1
    assert packed.numel() == torch_ktmoe._C.packed_matrix_bytes("bf16", "plain", 70, 100, 0)
    assert torch.equal(ops.pack_linear(weight.bfloat16()), packed)  # bf16 rounding is the packing's


def test_opcheck():
    weight, x, bias = torch.randn(40, 96), torch.randn(3, 96), torch.randn(40)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static")
    torch.library.opcheck(torch.ops.ktmoe.pack_linear.default, (weight,), test_utils=utils)
    torch.library.opcheck(torch.ops.ktmoe.linear.default, (x, ops.pack_linear(weight), 40, bias), test_utils=utils)


def packed_forty_by_ninety_six():
    return ops.pack_linear(torch.randn(40, 96))


@pytest.mark.parametrize("call, match", [
    (lambda p: ops.linear(torch.ones(2, 96, dtype=torch.int32), p, 40), "x must be bfloat16, float16 or float32"),
    (lambda p: ops.linear(torch.ones(2, 95), p, 40), r"x has K = 95 input features but w_packed was packed for K = 96"),
    (lambda p: ops.linear(torch.ones(2, 96), p, 41), "out_features is 41 but w_packed was packed for N = 40"),
    (lambda p: ops.linear(torch.ones(2, 96), p, 40, torch.zeros(39)), r"bias must be \[N\] = \[40\]"),
    (lambda p: ops.linear(torch.ones(2, 96), p, 40, torch.zeros(40, dtype=torch.int64)), "bias must be a float"),
    (lambda p: ops.linear(torch.ones(2, 96), p.view(-1, 64), 40), "contiguous 1-D uint8"),
    (lambda p: ops.linear(torch.ones(2, 96), p[:32], 40), "less than a packed header"),
    (lambda p: ops.linear(torch.ones(2, 96), torch.randint(0, 255, p.shape, dtype=torch.uint8), 40),
     "not a packed linear weight.*magic"),
    (lambda p: ops.linear(torch.ones(2, 96), p[:-64], 40), "not a packed linear weight.*total_bytes"),
])
def test_linear_errors(call, match):
    with pytest.raises(RuntimeError, match=match):
        call(packed_forty_by_ninety_six())


def test_refuses_a_packed_expert_matrix():
    w13, w2 = ops.pack_experts(torch.randn(2, 64, 96), torch.randn(2, 96, 32), "bf16")
    with pytest.raises(RuntimeError, match="not a packed linear weight.*role is 2, expected 0"):
        ops.linear(torch.ones(1, 32), w2[0].contiguous(), 96)


@pytest.mark.parametrize("weight, match", [
    (torch.randn(64), r"non-empty 2-D \[N, K\]"),
    (torch.randn(0, 64), r"non-empty 2-D \[N, K\]"),
    (torch.ones(8, 64, dtype=torch.int8), "float32, bfloat16 or float16"),
])
def test_pack_linear_errors(weight, match):
    with pytest.raises(RuntimeError, match=match):
        ops.pack_linear(weight)


def test_pack_linear_names_a_non_finite_weight():
    weight = torch.randn(600, 64)
    weight[517, 9] = float("inf")  # in the third chunk of 256 rows
    with pytest.raises(RuntimeError, match=r"weight\[517, 9\] is inf"):
        ops.pack_linear(weight)


def test_ktlinear_from_linear():
    linear = nn.Linear(100, 70)
    layer = KTLinear.from_linear(linear)
    assert (layer.in_features, layer.out_features) == (100, 70) and not hasattr(layer, "weight")
    assert layer.bias is linear.bias or torch.equal(layer.bias, linear.bias)
    x = torch.randn(4, 100)
    assert relative_error(layer(x), reference(x, linear.weight, linear.bias)) <= QUANTIZED_REFERENCE_TOLERANCE
    no_bias = KTLinear.from_linear(nn.Linear(100, 70, bias=False))
    assert no_bias.bias is None and no_bias(x).shape == (4, 70)
    with pytest.raises(TypeError, match="takes an nn.Linear"):
        KTLinear.from_linear(nn.Conv1d(3, 3, 1))


def test_ktlinear_state_dict_is_nn_linear_s():
    """state_dict() writes nn.Linear's keys (the packed bf16 weight exactly, in the replaced dtype); a dense
    state_dict loads back into a KTLinear (packed again) and into an nn.Linear."""
    linear = nn.Linear(100, 70)
    layer = KTLinear.from_linear(linear)
    state = layer.state_dict()
    assert set(state) == {"weight", "bias"} and state["weight"].dtype == torch.float32
    assert torch.equal(state["weight"], linear.weight.detach().bfloat16().float())
    dense = nn.Linear(100, 70)
    dense.load_state_dict(state)
    other = KTLinear.from_linear(nn.Linear(100, 70))
    other.load_state_dict(state)
    assert torch.equal(other.w_packed, layer.w_packed) and torch.equal(other.bias, layer.bias)


def test_ktlinear_load_state_dict_checks_the_shape():
    """A weight of another shape is refused like nn.Linear's, even when it packs to the same bytes ([41, 70]
    and [40, 72] both pad to the same packed size), and the layer keeps its weight."""
    layer = KTLinear.from_linear(nn.Linear(72, 40, bias=False))
    before = layer.w_packed.clone()
    assert ops.pack_linear(torch.randn(41, 70)).numel() == before.numel()
    with pytest.raises(RuntimeError, match=r"size mismatch for weight: .* \(41, 70\) .* is \(40, 72\)"):
        layer.load_state_dict({"weight": torch.randn(41, 70)})
    assert torch.equal(layer.w_packed, before)


def test_ktlinear_compiles_fullgraph():
    torch._dynamo.reset()
    layer = KTLinear.from_linear(nn.Linear(96, 40))
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for shape in [(1, 96), (2, 7, 96)]:
        x = torch.randn(shape, dtype=torch.bfloat16)
        assert torch.equal(compiled(x), layer(x))
    torch._dynamo.reset()


def test_backward_is_refused():
    layer = KTLinear.from_linear(nn.Linear(96, 40))
    out = layer(torch.randn(2, 96, requires_grad=True))
    with pytest.raises(ops.InferenceOnlyError, match="packed linears.*nn.Linear"):
        out.sum().backward()


# ---------------------------------------------------------------- hf.pack_linears

def patched_and_packed(**kwargs):
    model = make_model("qwen3_moe")
    hf.patch_model(model)
    return model, hf.pack_linears(model, min_bytes=0, **kwargs)


def test_pack_linears_greedy_equals_unpatched_fp32(isa):
    ref_seq, ref_logits = greedy(make_model("qwen3_moe"))
    model, report = patched_and_packed()
    attention = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"]
    assert sorted(report.module_names) == sorted(attention + ["lm_head"]) and report.replaced == 9
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert report.routers == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert report.packed_bytes == sum(m.packed_bytes for m in model.modules() if isinstance(m, KTLinear)) + sum(
        model.get_submodule(name).ktmoe_w_packed.numel() for name in report.routers)
    assert report.dense_bytes_freed == 4 * (2 * (64 * 64 * 2 + 32 * 64 * 2) + 128 * 64) and not report.tied
    assert_same_greedy(model, ref_seq, ref_logits)


def test_pack_linears_skips_small_layers_and_experts():
    model = make_model("qwen3_moe")
    report = hf.pack_linears(model, min_bytes=64 * 64 * 4)  # q / o / lm_head (>= 16 KiB) packed, k / v not
    small = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "kv"]
    assert sorted(report.skipped) == sorted(small + [f"model.layers.{i}.mlp.gate" for i in range(2)])
    assert "< min_bytes" in report.skipped["model.layers.0.self_attn.k_proj"] and report.replaced == 5
    assert isinstance(model.model.layers[0].mlp.experts, nn.Module) and not any(
        "experts" in name for name in report.module_names)
    with pytest.raises(ValueError, match="min_bytes"):
        hf.pack_linears(model, min_bytes=-1)


def test_pack_linears_packs_the_dtypes_given():
    model = make_model("qwen3_moe")
    report = hf.pack_linears(model, min_bytes=0, dtypes=(torch.bfloat16,))
    assert report.replaced == 0 and not report.routers
    reason = "weight dtype torch.float32 (packs bf16)"
    assert report.skipped["lm_head"] == report.skipped["model.layers.0.mlp.gate"] == reason
    for bad in ((), (torch.int8,)):
        with pytest.raises(ValueError, match="dtypes must be a non-empty selection"):
            hf.pack_linears(model, dtypes=bad)


def test_pack_linears_twice_packs_nothing_twice():
    model, first = patched_and_packed()
    again = hf.pack_linears(model, min_bytes=0)
    assert first.replaced == 9 and len(first.routers) == 2
    assert again.replaced == 0 and not again.routers and not again.skipped


def test_pack_linears_leaves_subclasses_of_linear():
    """nn.MultiheadAttention reads its out_proj's weight itself (out_proj is a subclass of nn.Linear)."""
    model = nn.ModuleDict(dict(attn=nn.MultiheadAttention(64, 4), proj=nn.Linear(64, 64)))
    report = hf.pack_linears(model, min_bytes=0)
    assert report.module_names == ["proj"] and "subclass of nn.Linear" in report.skipped["attn.out_proj"]
    x = torch.randn(3, 1, 64)
    assert model["attn"](x, x, x)[0].shape == (3, 1, 64)


def test_pack_linears_tied_lm_head_keeps_the_embedding():
    ref = make_model("qwen3_moe")
    ref.lm_head.weight = ref.model.embed_tokens.weight
    ref_seq, ref_logits = greedy(ref)
    model = make_model("qwen3_moe")
    model.lm_head.weight = model.model.embed_tokens.weight
    hf.patch_model(model)
    untied = hf.pack_linears(model, min_bytes=0)  # by default a tied layer follows its embedding, unpacked
    assert "lm_head" in untied.skipped and "tied" in untied.skipped["lm_head"]
    report = hf.pack_linears(model, min_bytes=0, tied=True)
    assert report.module_names == ["lm_head"] and report.tied == ["lm_head"] and report.dense_bytes_freed == 0
    assert model.model.embed_tokens.weight.shape == (128, 64)
    assert_same_greedy(model, ref_seq, ref_logits)


def test_pack_linears_under_compile_decode_no_recompiles():
    torch._dynamo.reset()
    model, _ = patched_and_packed()
    with torch.no_grad():
        eager = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=12, do_sample=False)
    compiled = hf.compile_decode(model, max_cache_len=32, backend="aot_eager")
    for new_tokens in (3, 12):
        with torch.no_grad():
            out = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=new_tokens,
                                 do_sample=False)
        assert torch.equal(out, eager[:, :PROMPT.shape[1] + new_tokens])
    assert compiled.graphs == 1
    torch._dynamo.reset()


def test_save_packed_after_pack_linears_reloads(tmp_path):
    """save_packed writes the packed linears as dense nn.Linear weights: the reloaded model, packed again,
    generates the same tokens."""
    model, _ = patched_and_packed()
    seq, _ = greedy(model)
    hf.save_packed(model, tmp_path / "packed")
    reloaded = hf.from_pretrained(tmp_path / "packed", dtype=torch.float32)
    assert isinstance(reloaded.lm_head, nn.Linear)
    hf.pack_linears(reloaded, min_bytes=0)
    assert torch.equal(greedy(reloaded)[0], seq)
