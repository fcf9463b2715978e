"""torch_ktmoe.hf.gate_activations: each experts class's own _apply_gate is a row of the activation table, checked
on a probe against the reference, so a class whose gate is not what the table says is refused, not run wrong."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from torch_ktmoe import hf, ops, reference  # noqa: E402
from torch_ktmoe.hf.experts import layout_of  # noqa: E402
from torch_ktmoe.hf.gate_activations import GATE_ACTIVATION_CLASSES, gate_activation  # noqa: E402

from ktmoe_harness.transformers_families import experts_classes, meta_instance, tiny_config  # noqa: E402

PER_LAYER = {"BailingHybridExperts": "bailing_hybrid", "Step3p7Experts": "step3p7_text"}  # (config, layer_idx)


def instance(name: str) -> torch.nn.Module:
    """The class on the meta device; classes with a per-layer limit: layer 1 of their tiny config (it has one)."""
    module_name = experts_classes()[name]
    if name in PER_LAYER:
        import importlib
        with torch.device("meta"):
            return getattr(importlib.import_module(module_name), name)(tiny_config(PER_LAYER[name]), 1)
    inst = meta_instance(name, module_name)
    assert inst is not None, f"{name}: no config builds it"
    return inst


@pytest.mark.parametrize("name", sorted(GATE_ACTIVATION_CLASSES))
def test_each_class_gates_as_its_row(name):
    module = instance(name)
    (activation, params), reason = gate_activation(module)
    assert reason is None and activation in ops.ACTIVATIONS
    assert layout_of(module).ktmoe_kwargs().get("activation", "silu") == activation
    assert hf.unsupported_reason(module) is None


@pytest.mark.parametrize("gate_fn", [
    lambda g, u, limit: torch.nn.functional.silu(g.clamp(max=limit)) * u,  # the up clamp dropped
    lambda g, u, limit: torch.nn.functional.silu(g.clamp(max=limit) * 1.001) * u.clamp(-limit, limit),  # 0.1 % off
], ids=["no-up-clamp", "gate-0.1%-off"])
def test_a_gate_that_is_not_its_row_is_refused(gate_fn):
    module = instance("DeepseekV4Experts")
    cls = type(module)
    module.__class__ = type("DeepseekV4Experts", (cls,), {
        "__module__": cls.__module__, "_apply_gate": lambda self, gu: gate_fn(*gu.chunk(2, dim=-1), self.limit)})
    found, reason = gate_activation(module)
    assert found is None and "DeepseekV4Experts overrides _apply_gate" in reason and "not silu_clamp" in reason
    assert hf.unsupported_reason(module) == reason


def test_a_per_layer_limit_of_none_is_plain_silu():
    module = instance("Step3p7Experts")
    module.limit = None
    (activation, params), reason = gate_activation(module)
    assert (activation, params, reason) == ("silu", {}, None)
    module.limit = 2.5
    assert gate_activation(module)[0] == ("silu_clamp_after", {"limit": 2.5})


def test_unreadable_parameters_are_a_reason_not_a_crash():
    module = instance("MiniMaxM3VLExperts")
    module.swiglu_limit = float("nan")
    found, reason = gate_activation(module)
    assert found is None and "MiniMaxM3VLExperts" in reason and "limit" in reason


def test_the_reference_rows_match_the_kernels_table():
    gate, up = torch.randn(2, 64, 48).mul(4).unbind(0)
    for name, row in ops.GATED_ACTIVATIONS.items():
        params = dict(zip(row["params"], row["defaults"]))
        h = reference.gated_activation(gate, up, name, params)
        assert h.shape == gate.shape and torch.isfinite(h).all(), name


@pytest.fixture
def bf16_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what transformers' local_torch_dtype sets while a model is built
    yield
    torch.set_default_dtype(before)


@pytest.mark.parametrize("name", sorted(GATE_ACTIVATION_CLASSES))
def test_the_probe_is_fp32_on_the_cpu_under_any_default_dtype(name, bf16_default):
    """torch's default dtype bf16 (before: the probe was built in it and every class was refused as 'not its row')."""
    module = instance(name)
    found, reason = gate_activation(module)
    assert reason is None and found is not None
    assert hf.unsupported_reason(module) is None


@pytest.mark.parametrize("name", ["DeepseekV4Experts", "Step3p7Experts", "MiniMaxM3VLExperts"])
def test_the_probe_runs_inside_a_meta_device_context(name):
    """Under ``with torch.device("meta")`` (before: Tensor.item() cannot be called on meta tensors)."""
    module = instance(name)
    with torch.device("meta"):
        found, reason = gate_activation(module)
        assert reason is None and found is not None
        blocks, refused = hf.find_experts_blocks(torch.nn.ModuleDict({"experts": module}))
    assert [b.module for b in blocks] == [module] and not refused
