"""moe_forward with expert biases and every gated activation row (gpt-oss's clamped SwiGLU, the clamped
SiLUs, the softcapped SwiGLU): every format and ISA against the independent fp32 reference, the ISAs
against the generic oracle, and clear errors."""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe import ops, reference
from tests.helpers import QUANTIZED_REFERENCE_TOLERANCE, random_experts, random_routing

FORMATS = ops.WEIGHT_FORMATS
LIMIT = 7.0
# each row of ops.GATED_ACTIVATIONS with parameters its clamps / caps bite at (problem() passes them often)
ROWS = {"silu": {}, "silu_clamp": {"limit": LIMIT}, "silu_clamp_after": {"limit": LIMIT},
        "swiglu_oai": {"limit": LIMIT}, "swiglu_softcap": {"gate_softcap": 3.0, "up_softcap": 5.0}}


def problem(experts, top_k, hidden, inter, tokens, seed=0, bias_scale=4.0):
    """Experts, biases and inputs whose gate/up pre-activations often pass +-LIMIT (the clamps matter)."""
    g = torch.Generator().manual_seed(seed)
    gate_up, down = random_experts(experts, hidden, inter, seed=seed)
    gate_up_bias = torch.randn(experts, 2 * inter, generator=g) * bias_scale
    down_bias = torch.randn(experts, hidden, generator=g)
    x = torch.randn(tokens, hidden, generator=g) * 3
    ids, w = random_routing(tokens, experts, top_k, seed=seed + 1, masked=0.1)
    return x, ids, w, gate_up, down, gate_up_bias, down_bias


def forward(fmt, x, ids, w, gate_up, down, b13, b2, activation="swiglu_oai"):
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    return ops.moe_forward(x, ids, w, w13, w2, w13_bias=b13, w2_bias=b2, activation=activation,
                           activation_params=ops.activation_params(activation, ROWS[activation])), (w13, w2)


def test_every_row_is_tested():
    assert set(ROWS) == set(ops.ACTIVATIONS)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("activation", sorted(ROWS))
@pytest.mark.parametrize("shape", [(8, 2, 64, 32, 1), (6, 3, 100, 72, 7), (4, 4, 96, 48, 130)],
                         ids=lambda s: "E{}k{}H{}I{}T{}".format(*s))
def test_matches_reference_of_the_formats_rounding(isa, fmt, activation, shape):
    x, ids, w, gate_up, down, b13, b2 = problem(*shape)
    out, _ = forward(fmt, x, ids, w, gate_up, down, b13, b2, activation)
    ref = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, fmt),
                                  reference.quantize_weights(down, fmt), reference.format_activations(fmt),
                                  gate_up_bias=b13, down_bias=b2, activation=activation,
                                  activation_params=ROWS[activation])
    assert reference.relative_error(out, ref) <= QUANTIZED_REFERENCE_TOLERANCE, f"{isa}/{fmt}/{activation}"


@pytest.mark.parametrize("activation", sorted(set(ROWS) - {"silu"}))
def test_the_clamps_and_caps_are_exercised_and_matter(activation):
    x, ids, w, gate_up, down, b13, b2 = problem(8, 2, 64, 32, 16)
    pre = torch.einsum("th,eih->tei", x, gate_up) + b13  # every token through every expert
    assert (pre.abs() > LIMIT).float().mean() > 0.05
    out, _ = forward("bf16", x, ids, w, gate_up, down, b13, b2, activation)
    loose = {k: 1e6 for k in ROWS[activation]}  # no clamp or cap at all
    unbound = reference.moe_reference(x, ids, w, gate_up, down, "bf16", gate_up_bias=b13, down_bias=b2,
                                      activation=activation, activation_params=loose)
    assert reference.relative_error(out, unbound) > 0.05


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("activation", sorted(ROWS))
def test_isa_paths_agree_with_generic(isa, fmt, activation):
    x, ids, w, gate_up, down, b13, b2 = problem(8, 3, 160, 96, 40)
    out, (w13, w2) = forward(fmt, x, ids, w, gate_up, down, b13, b2, activation)
    with torch_ktmoe.isa_scope("generic"):
        ref = ops.moe_forward(x, ids, w, w13, w2, w13_bias=b13, w2_bias=b2, activation=activation,
                              activation_params=ops.activation_params(activation, ROWS[activation]))
    assert reference.relative_error(out, ref) <= 2e-3


def test_bias_dtypes_and_absent_biases():
    x, ids, w, gate_up, down, b13, b2 = problem(8, 2, 64, 32, 5)
    w13, w2 = ops.pack_experts(gate_up, down, "bf16")
    f32 = ops.moe_forward(x, ids, w, w13, w2, w13_bias=b13, w2_bias=b2)
    half = ops.moe_forward(x, ids, w, w13, w2, w13_bias=b13.bfloat16(), w2_bias=b2.bfloat16())
    as_f32 = ops.moe_forward(x, ids, w, w13, w2, w13_bias=b13.bfloat16().float(), w2_bias=b2.bfloat16().float())
    assert torch.equal(half, as_f32)  # read as fp32, exactly
    zero = ops.moe_forward(x, ids, w, w13, w2, w13_bias=torch.zeros_like(b13), w2_bias=torch.zeros_like(b2))
    assert torch.equal(zero, ops.moe_forward(x, ids, w, w13, w2))
    assert not torch.equal(f32, zero)
    only_down = ops.moe_forward(x, ids, w, w13, w2, w2_bias=b2)
    ref = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, "bf16"),
                                  reference.quantize_weights(down, "bf16"), "bf16", down_bias=b2)
    assert reference.relative_error(only_down, ref) <= QUANTIZED_REFERENCE_TOLERANCE


def test_nan_in_a_token_stays_in_that_token():
    x, ids, w, gate_up, down, b13, b2 = problem(8, 2, 64, 32, 4)
    x[1, 3] = float("nan")
    ids[1] = torch.tensor([0, 1])
    ids[[0, 2, 3]] = torch.tensor([2, 3])  # the other tokens share no expert with token 1
    out, _ = forward("bf16", x, ids, w, gate_up, down, b13, b2)
    assert out[1].isnan().all() and out[[0, 2, 3]].isfinite().all()


def test_opcheck_with_biases():
    x, ids, w, gate_up, down, b13, b2 = problem(8, 2, 64, 32, 3)
    w13, w2 = ops.pack_experts(gate_up, down, "int8")
    torch.library.opcheck(torch.ops.ktmoe.moe_forward.default,
                          (x, ids, w, w13, w2, b13, b2, "swiglu_softcap", [3.0, 5.0]),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(w13_bias=torch.zeros(8, 63)), r"w13_bias must be \[E, 2I\] = \[8, 64\]"),
    (dict(w2_bias=torch.zeros(7, 64)), r"w2_bias must be \[E, H\] = \[8, 64\]"),
    (dict(w2_bias=torch.zeros(8, 64, dtype=torch.int32)), "w2_bias must be a float tensor"),
    (dict(activation="gelu"), "activation must be one of silu, silu_clamp, .*swiglu_softcap, got \"gelu\""),
    (dict(activation="swiglu_oai", activation_params=[1.702, 0.0]), "swiglu_oai: limit must be a finite number > 0"),
    (dict(activation="swiglu_oai", activation_params=[float("nan"), 7.0]), "swiglu_oai: alpha must be a finite number"),
    (dict(activation="silu_clamp", activation_params=[float("inf")]), "silu_clamp: limit must be a finite"),
    (dict(activation="swiglu_softcap", activation_params=[-1.0, 2.0]), "gate_softcap must be a finite number > 0"),
    (dict(activation="silu_clamp", activation_params=[1.0, 2.0]), r"silu_clamp takes 1 parameter\(s\), got 2"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    x, ids, w, gate_up, down, *_ = problem(8, 2, 64, 32, 3)
    w13, w2 = ops.pack_experts(gate_up, down, "bf16")
    with pytest.raises(RuntimeError, match=match):
        ops.moe_forward(x, ids, w, w13, w2, **kwargs)


@pytest.mark.parametrize("parts", [1, 2])
def test_ktmoe_layer_with_biases_and_swiglu_oai(parts):
    import copy
    import pickle

    x, ids, w, gate_up, down, b13, b2 = problem(8, 2, 64, 48, 9)
    layer = torch_ktmoe.KTMoE(8, 2, 64, 48, numa_parts=parts, activation="swiglu_oai",
                              activation_params={"limit": LIMIT})
    layer.load_weights(gate_up, down, gate_up_bias=b13, down_bias=b2)
    x = x.bfloat16()
    ref = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, "bf16"),
                                  reference.quantize_weights(down, "bf16"), "bf16", gate_up_bias=b13,
                                  down_bias=b2, activation="swiglu_oai", activation_params={"limit": LIMIT})
    out = layer(x, ids, w)
    assert out.dtype == torch.bfloat16
    assert reference.relative_error(out, ref) <= 4e-3  # the bf16 output's own rounding: ~1e-3
    got13, got2 = layer.biases()
    assert torch.equal(got13, b13) and torch.equal(got2, b2)
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert twin.activation == "swiglu_oai" and twin.activation_params == layer.activation_params
        assert torch.equal(twin(x, ids, w), out)
    layer.set_biases(None, None)
    plain = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, "bf16"),
                                    reference.quantize_weights(down, "bf16"), "bf16", activation="swiglu_oai",
                                    activation_params={"limit": LIMIT})
    assert reference.relative_error(layer(x, ids, w), plain) <= 4e-3


def test_ktmoe_rejects_unknown_activation_and_bad_bias_shapes():
    with pytest.raises(ValueError, match="activation must be one of"):
        torch_ktmoe.KTMoE(8, 2, 64, 32, activation="gelu")
    with pytest.raises(ValueError, match=r"'silu_clamp' takes \['limit'\], got \['alpha'\]"):
        torch_ktmoe.KTMoE(8, 2, 64, 32, activation="silu_clamp", activation_params={"alpha": 1.0})
    with pytest.raises(ValueError, match="silu_clamp_after: limit must be a finite number > 0"):
        torch_ktmoe.KTMoE(8, 2, 64, 32, activation="silu_clamp_after", activation_params={"limit": 0})
    layer = torch_ktmoe.KTMoE(8, 2, 64, 32)
    with pytest.raises(ValueError, match=r"gate_up_bias must have shape \(8, 64\)"):
        layer.set_biases(torch.zeros(8, 32), None)


@pytest.mark.parametrize("params,message", [
    (None, None),
    ("abc", r"activation 'swiglu_oai': activation_params must be a mapping of parameter name -> number "
            r"\(\['alpha', 'limit'\]\), got str 'abc'"),
    ([1.702, 7.0], r"activation 'swiglu_oai': activation_params must be a mapping .*, got list \[1\.702, 7\.0\]"),
    (7.0, r"activation 'swiglu_oai': activation_params must be a mapping .*, got float 7\.0"),
    ({"limit": None}, r"activation 'swiglu_oai': parameter 'limit' must be a real number, got NoneType None"),
    ({"limit": "abc"}, r"activation 'swiglu_oai': parameter 'limit' must be a real number, got str 'abc'"),
    ({"limit": "7"}, r"activation 'swiglu_oai': parameter 'limit' must be a real number, got str '7'"),
    ({"limit": True}, r"activation 'swiglu_oai': parameter 'limit' must be a real number, got bool True"),
    ({"limit": [7.0]}, r"activation 'swiglu_oai': parameter 'limit' must be a real number, got list \[7\.0\]"),
    ({"limit": torch.tensor(7.0)}, r"parameter 'limit' must be a real number, got Tensor tensor\(7\.\)"),
    ({1: 7.0}, r"activation 'swiglu_oai' takes \['alpha', 'limit'\], got \[1\]"),
    ({"limit": 1e-50}, r"swiglu_oai: limit must be a finite number > 0 in fp32, got 1e-50 \(0 in fp32\)"),
    ({"limit": 1e39}, r"swiglu_oai: limit must be a finite number > 0 in fp32, got 1e\+39 \(inf in fp32\)"),
])
def test_activation_params_errors_name_the_activation_and_the_parameter(params, message):
    """Wrong types are refused naming the activation and the parameter (never a bare Python error; a string, a bool
    or a tensor is not taken as a number); refused values are printed as written (1e-50, not 0.000000)."""
    if message is None:
        assert ops.activation_params("swiglu_oai", params) == pytest.approx((1.702, 7.0))
        return
    with pytest.raises(ValueError, match=message):
        ops.activation_params("swiglu_oai", params)
    with pytest.raises(ValueError, match=message):
        torch_ktmoe.KTMoE(8, 2, 64, 32, activation="swiglu_oai", activation_params=params)
    assert ops.activation_params("swiglu_oai", {"limit": 3, "alpha": 1.5}) == (1.5, 3.0)  # an int is a number
