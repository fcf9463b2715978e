"""torch.ops.ktmoe.moe_forward / pack_experts: accuracy per format and ISA, invariances, opcheck,
torch.compile, and a clear error for each bad input."""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe import ops, reference
from tests.helpers import FORMAT_TOLERANCE, QUANTIZED_REFERENCE_TOLERANCE, random_experts, random_routing

FORMATS = ops.WEIGHT_FORMATS

# (E, k, H, I, T): T in {0, 1, 7, >= 512}; odd H / I exercise the padding.
GRID = [
    (8, 2, 64, 32, 0),
    (8, 2, 64, 32, 1),
    (6, 3, 100, 72, 7),
    (16, 4, 128, 96, 33),
    (4, 4, 96, 48, 520),
]


def run(fmt, experts, top_k, hidden, inter, tokens, *, x_dtype=torch.float32, masked=0.0, arena=None,
        ids_dtype=torch.int64, w_dtype=torch.float32, seed=0):
    gate_up, down = random_experts(experts, hidden, inter, seed=seed)
    w13, w2 = ops.pack_experts(gate_up, down, fmt, arena=arena)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1)).to(x_dtype)
    ids, w = random_routing(tokens, experts, top_k, seed=seed + 2, masked=masked)
    out = ops.moe_forward(x, ids.to(ids_dtype), w.to(w_dtype), w13, w2)
    return out, (x, ids, w, gate_up, down, w13, w2)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", GRID, ids=lambda s: "E{}k{}H{}I{}T{}".format(*s))
def test_matches_reference_of_the_formats_rounding(isa, fmt, shape):
    out, (x, ids, w, gate_up, down, _, _) = run(fmt, *shape, masked=0.2)
    assert out.shape == x.shape and out.dtype == x.dtype
    if shape[-1] == 0:
        return
    ref = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, fmt),
                                  reference.quantize_weights(down, fmt), reference.format_activations(fmt))
    err = reference.relative_error(out, ref)
    assert err <= QUANTIZED_REFERENCE_TOLERANCE, f"{isa}/{fmt}: {err:.2e}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_accuracy_against_fp32_experts(fmt):
    """The documented accuracy of each format, on a Qwen-like aspect ratio."""
    out, (x, ids, w, gate_up, down, _, _) = run(fmt, 8, 4, 512, 192, 64)
    err = reference.relative_error(out, reference.moe_reference(x, ids, w, gate_up, down))
    assert err <= FORMAT_TOLERANCE[fmt], f"{fmt}: {err:.4f}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_isa_paths_agree_with_generic(isa, fmt):
    out, (x, ids, w, _, _, w13, w2) = run(fmt, 8, 3, 160, 96, 40)
    with torch_ktmoe.isa_scope("generic"):
        ref = ops.moe_forward(x, ids, w, w13, w2)
    assert reference.relative_error(out, ref) <= 2e-3


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_input_dtypes(fmt, x_dtype, ids_dtype):
    out, (x, ids, w, gate_up, down, w13, w2) = run(fmt, 8, 2, 64, 32, 9, x_dtype=x_dtype, ids_dtype=ids_dtype,
                                                     w_dtype=torch.bfloat16)
    assert out.dtype == x_dtype
    ref = reference.moe_reference(x, ids, w.to(torch.bfloat16), reference.quantize_weights(gate_up, fmt),
                                  reference.quantize_weights(down, fmt), reference.format_activations(fmt))
    assert reference.relative_error(out, ref) <= (QUANTIZED_REFERENCE_TOLERANCE if x_dtype == torch.float32
                                                  else 5e-3)  # bf16 output rounding


def test_any_strides():
    gate_up, down = random_experts(8, 64, 32)
    w13, w2 = ops.pack_experts(gate_up, down, "bf16")
    x = torch.randn(64, 10).T                  # [10, 64], column-major
    ids, w = random_routing(10, 8, 2)
    ids_t, w_t = ids.T.contiguous().T, w.T.contiguous().T
    assert not x.is_contiguous() and not ids_t.is_contiguous()
    torch.testing.assert_close(ops.moe_forward(x, ids_t, w_t, w13, w2),
                               ops.moe_forward(x.contiguous(), ids, w, w13, w2), rtol=0, atol=0)


def test_masked_ids_are_skipped():
    out, (x, ids, w, gate_up, down, w13, w2) = run("bf16", 8, 3, 64, 32, 12)
    drop = ids.clone()
    drop[:, 1] = -1
    partial = ops.moe_forward(x, drop, w, w13, w2)
    only = ids.clone()
    only[:, [0, 2]] = -1
    rest = ops.moe_forward(x, only, w, w13, w2)
    torch.testing.assert_close(partial + rest, out, rtol=1e-5, atol=1e-5)
    all_masked = torch.full_like(ids, -1)
    assert torch.count_nonzero(ops.moe_forward(x, all_masked, w, w13, w2)) == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_file_backed_and_anonymous_are_bit_identical(tmp_path, fmt):
    anon = torch_ktmoe.WeightArena(None, "anon")
    filed = torch_ktmoe.WeightArena(tmp_path, "file")
    out_a, (_, _, _, _, _, w13a, _) = run(fmt, 16, 4, 128, 96, 33, arena=anon)
    out_f, (_, _, _, _, _, w13f, _) = run(fmt, 16, 4, 128, 96, 33, arena=filed)
    assert filed.stats()["file_backed_bytes"] > 0 and filed.stats()["fallbacks"] == 0
    assert w13f.data_ptr() % (2 << 20) == 0
    assert torch.equal(w13a, w13f)
    assert torch.equal(out_a, out_f)


@pytest.mark.parametrize("fmt", FORMATS)
def test_thread_count_does_not_change_a_bit(fmt):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, args = run(fmt, 16, 4, 128, 96, 70)
        torch.set_num_threads(2)
        two = ops.moe_forward(*args[:3], *args[5:])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_packing_is_deterministic_and_accepts_separate_gate_up():
    gate_up, down = random_experts(4, 64, 48, dtype=torch.bfloat16)
    for fmt in FORMATS:
        a = ops.pack_experts(gate_up, down, fmt)
        b = ops.pack_experts(gate_up[:, :48].contiguous(), down, fmt, up=gate_up[:, 48:].contiguous())
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_group_sizes(group):
    gate_up, down = random_experts(4, 256, 128)
    w13, w2 = ops.pack_experts(gate_up, down, "int4", group_size=group)
    x = torch.randn(5, 256)
    ids, w = random_routing(5, 4, 2)
    ref = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, "int4", group),
                                  reference.quantize_weights(down, "int4", group), "int8")
    assert reference.relative_error(ops.moe_forward(x, ids, w, w13, w2), ref) <= QUANTIZED_REFERENCE_TOLERANCE


# ---------------------------------------------------------------- torch.library / compile
@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck_moe_forward(fmt):
    gate_up, down = random_experts(4, 64, 32)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    ids, w = random_routing(5, 4, 2, masked=0.2)
    for x in (torch.randn(5, 64), torch.randn(5, 64).bfloat16(), torch.randn(0, 64)):
        ids_x, w_x = ids[: x.shape[0]], w[: x.shape[0]]
        torch.library.opcheck(torch.ops.ktmoe.moe_forward.default, (x, ids_x, w_x, w13, w2))


@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck_pack_experts(fmt):
    gate_up, down = random_experts(3, 64, 32)
    torch.library.opcheck(torch.ops.ktmoe.pack_experts.default, (gate_up, None, down, fmt, 0, []))
    torch.library.opcheck(torch.ops.ktmoe.pack_experts.default,
                          (gate_up[:, :32].contiguous(), gate_up[:, 32:].contiguous(), down, fmt, 0, []))
    w13, w2 = (torch.empty(s, dtype=torch.uint8) for s in torch_ktmoe._C.packed_sizes(gate_up, None, down, fmt))
    torch.library.opcheck(torch.ops.ktmoe.pack_experts_out.default, (gate_up, None, down, fmt, 0, [], w13, w2))
    torch.ops.ktmoe.pack_experts_out(gate_up, None, down, fmt, 0, [], w13, w2)  # opcheck works on copies
    assert all(torch.equal(a, b) for a, b in zip((w13, w2), ops.pack_experts(gate_up, down, fmt, group_size=0)))


def test_torch_compile_fullgraph_matches_eager():
    gate_up, down = random_experts(8, 64, 32)
    w13, w2 = ops.pack_experts(gate_up, down, "int8")

    def block(x, ids, w):
        return torch.ops.ktmoe.moe_forward(torch.nn.functional.gelu(x), ids, w, w13, w2) * 2 + x

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    for tokens in (3, 3):
        x = torch.randn(tokens, 64)
        ids, w = random_routing(tokens, 8, 2)
        torch.testing.assert_close(compiled(x, ids, w), block(x, ids, w), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- errors
@pytest.fixture(scope="module")
def packed():
    gate_up, down = random_experts(8, 64, 32)
    return ops.pack_experts(gate_up, down, "bf16")


def _call(packed, x=None, ids=None, w=None, w13=None, w2=None):
    x = torch.randn(4, 64) if x is None else x
    rid, rw = random_routing(4, 8, 2)
    return ops.moe_forward(x, rid if ids is None else ids, rw if w is None else w,
                           packed[0] if w13 is None else w13, packed[1] if w2 is None else w2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=torch.randn(4, 64).double()), "hidden_states must be bfloat16, float16 or float32, got Double"),
    (dict(x=torch.randn(4, 2, 64)), r"hidden_states must be \[T, H\]"),
    (dict(x=torch.randn(4, 80)), "packed for H = 64"),
    (dict(ids=torch.zeros(4, 2)), "topk_ids must be int32 or int64"),
    (dict(ids=torch.zeros(3, 2, dtype=torch.long)), r"topk_ids must be \[T, k\]"),
    (dict(ids=torch.tensor([[0, 8]] * 4)), "expert id 8 but the packed weights have only 8 experts"),
    (dict(w=torch.ones(4, 2, dtype=torch.int32)), "topk_weights must be float32, bfloat16 or float16"),
    (dict(w=torch.ones(4, 3)), "topk_weights .* must have the shape of topk_ids"),
])
def test_bad_inputs_raise_clear_errors(packed, kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        _call(packed, **kwargs)


def test_bad_packed_weights_raise_clear_errors(packed):
    w13, w2 = packed
    with pytest.raises(RuntimeError, match="wrong argument position"):
        _call(packed, w13=w2, w2=w13)
    with pytest.raises(RuntimeError, match="packed uint8 CPU tensor"):
        _call(packed, w13=w13.float())
    with pytest.raises(RuntimeError, match="bad header magic"):
        _call(packed, w13=torch.zeros_like(w13))
    corrupt = w13.clone()
    corrupt[3, 8] ^= 1
    with pytest.raises(RuntimeError, match="expert 3 has a header that differs"):
        _call(packed, w13=corrupt, ids=torch.tensor([[3, 0]] * 4))
    # Only routed experts' headers are read: an unrouted expert's page is never touched
    # (cold experts stay out of memory), and the call is unaffected.
    _call(packed, w13=corrupt, ids=torch.tensor([[1, 2]] * 4))
    other = ops.pack_experts(*random_experts(8, 64, 48), "bf16")
    with pytest.raises(RuntimeError, match=r"w2 is packed for \[H, I\] = \[64, 48\]"):
        _call(packed, w2=other[1])
    int8 = ops.pack_experts(*random_experts(8, 64, 32), "int8")
    with pytest.raises(RuntimeError, match="w13 is bf16 but w2 is int8"):
        _call(packed, w2=int8[1])
    with pytest.raises(RuntimeError, match="has 8 experts but w2 has 4"):
        _call(packed, w2=w2[:4])


def test_bad_pack_arguments_raise_clear_errors():
    gate_up, down = random_experts(4, 64, 32)
    with pytest.raises(RuntimeError, match="weight_format must be 'bf16', 'int8', .* got 'fp4'"):  # the table's names
        ops.pack_experts(gate_up, down, "fp4")
    with pytest.raises(RuntimeError, match=r"down must be \[E, H, I\]"):
        ops.pack_experts(gate_up, down[:, :, :16], "bf16")
    with pytest.raises(RuntimeError, match="must be float32, bfloat16 or float16"):
        ops.pack_experts(gate_up.to(torch.int32), down, "bf16")
    with pytest.raises(RuntimeError, match="group_size must be"):
        ops.pack_experts(gate_up, down, "int4", group_size=48)
    (e, b13), (_, b2) = torch_ktmoe._C.packed_sizes(gate_up, None, down, "bf16")
    good13, good2 = torch.empty(e, b13, dtype=torch.uint8), torch.empty(e, b2, dtype=torch.uint8)
    for bad13 in (torch.empty(e, b13 - 64, dtype=torch.uint8), torch.empty(e, b13, dtype=torch.int8),
                  torch.empty(b13, e, dtype=torch.uint8).t()):
        with pytest.raises(RuntimeError, match=rf"pack_experts_out: w13 must be a contiguous uint8 CPU tensor \[{e}, {b13}\]"):
            torch.ops.ktmoe.pack_experts_out(gate_up, None, down, "bf16", 0, [], bad13, good2)
    with pytest.raises(RuntimeError, match="w2 must be 64-byte aligned"):
        torch.ops.ktmoe.pack_experts_out(gate_up, None, down, "bf16", 0, [], good13,
                                         torch.empty(e * b2 + 1, dtype=torch.uint8)[1:].view(e, b2))


@pytest.mark.parametrize("arg", ["w13", "w2", "ids", "w"])
def test_cpu_hidden_states_with_a_meta_argument_is_an_error_not_garbage(packed, arg):
    """The fake kernel is also the Meta kernel: a CPU call with one meta tensor (a partly
    materialised model) dispatches to it and must refuse, naming the argument."""
    args = dict(x=torch.randn(4, 64), ids=torch.tensor([[0, 1]] * 4), w=torch.ones(4, 2),
                w13=packed[0], w2=packed[1])
    args[arg] = torch.empty_like(args[arg], device="meta")
    name = {"ids": "topk_ids", "w": "topk_weights"}.get(arg, arg)
    with pytest.raises(RuntimeError, match=f"moe_forward: {name} is on meta but hidden_states is on cpu"):
        _call(packed, **args)


def test_meta_inputs_still_trace_to_meta_outputs(packed):
    meta = lambda t: torch.empty_like(t, device="meta")  # noqa: E731
    x, (ids, w) = torch.randn(4, 64), random_routing(4, 8, 2)
    out = ops.moe_forward(meta(x), meta(ids), meta(w), meta(packed[0]), meta(packed[1]))
    assert out.device.type == "meta" and out.shape == x.shape
    w13, w2 = ops.pack_experts(*(meta(t) for t in random_experts(8, 64, 32)), "bf16")
    assert w13.device.type == "meta" and w13.shape == packed[0].shape and w2.shape == packed[1].shape


def test_pack_with_a_meta_argument_is_an_error_not_garbage():
    gate_up, down = random_experts(4, 64, 32)
    with pytest.raises(RuntimeError, match="pack_experts: down is on meta but gate_up is on cpu"):
        ops.pack_experts(gate_up, down.to("meta"), "bf16")
    with pytest.raises(RuntimeError, match="pack_experts: up is on meta but gate_up is on cpu"):
        ops.pack_experts(gate_up[:, :32], down, "bf16", up=gate_up[:, 32:].to("meta"))
    w13, w2 = (torch.empty(s, dtype=torch.uint8) for s in torch_ktmoe._C.packed_sizes(gate_up, None, down, "bf16"))
    with pytest.raises(RuntimeError, match="pack_experts_out: w2 is on meta but gate_up is on cpu"):
        torch.ops.ktmoe.pack_experts_out(gate_up, None, down, "bf16", 0, [], w13, w2.to("meta"))


def test_forcing_an_unknown_isa_is_a_clear_error():
    with pytest.raises(RuntimeError, match="unknown ISA 'sse9'.*Available: generic"):
        torch_ktmoe.set_isa("sse9")
