"""Hugging Face transformers 5.x drop-in (torch_ktmoe.hf): tiny random models built from configs, offline.

The models and the tolerance of the comparisons: tests/helpers/hf_models.py.
"""

from __future__ import annotations

import copy
import inspect
import json
import os

import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import torch_ktmoe  # noqa: E402
from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.hf import KTMoEExperts  # noqa: E402
from torch_ktmoe.hf.load_hook import before_and_after_weight_loading  # noqa: E402

from tests.helpers.hf_models import (  # noqa: E402
    KINDS,
    PROMPT,
    assert_close_logits,
    assert_same_greedy,
    greedy,
    logits,
    make_model,
)


def dense_expert_bytes(model) -> int:
    return sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj")
    )


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """kind -> directory of a save_pretrained checkpoint (transformers writes per-expert keys)."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for kind in KINDS:
        make_model(kind).save_pretrained(root / kind)
        out[kind] = root / kind
    return out


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_patch_model_matches_reference(kind):
    model = make_model(kind)
    ref_logits = logits(model)
    ref_seq, ref_step_logits = greedy(model)
    n_blocks = sum(1 for n, _ in model.named_modules() if n.endswith("mlp.experts"))

    report = hf.patch_model(model, weight_format="bf16")

    assert report.num_layers == n_blocks > 0
    assert not report.refused
    adapters = [m for m in model.modules() if isinstance(m, KTMoEExperts)]
    assert len(adapters) == n_blocks
    assert sorted(a.layer_idx for a in adapters) == sorted(report.layers_patched)
    if kind == "deepseek_v3":  # first_k_dense_replace=1: layer 0 keeps its dense MLP
        assert report.layers_patched == [1, 2]
        assert not hasattr(model.model.layers[0].mlp, "experts")
        assert model.model.layers[1].mlp.shared_experts is not None
    if kind == "qwen2_moe":  # shared expert and its gate stay in place
        mlp = model.model.layers[0].mlp
        assert isinstance(mlp.shared_expert_gate, nn.Linear) and mlp.shared_expert is not None
    assert model.get_experts_implementation()[""] == "ktmoe"

    assert_close_logits(logits(model), ref_logits)
    assert_same_greedy(model, ref_seq, ref_step_logits)


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_file_backed_bit_identical(kind, tmp_path):
    # tmp_path must be on a real file system (ext4/xfs): on tmpfs the arena falls back to anonymous memory
    anon = make_model(kind)
    filed = copy.deepcopy(anon)
    r_anon = hf.patch_model(anon)
    r_file = hf.patch_model(filed, mmap_experts_dir=tmp_path)
    assert r_anon.file_backed_bytes == 0
    assert r_file.file_backed_bytes > 0
    assert r_file.packed_bytes == r_anon.packed_bytes > 0
    assert torch.equal(logits(anon), logits(filed))


def test_dense_expert_parameters_freed():
    model = make_model("olmoe")
    before = param_bytes(model)
    dense = dense_expert_bytes(model)
    assert dense > 0
    old = model.model.layers[0].mlp.experts.gate_up_proj
    report = hf.patch_model(model)
    after = param_bytes(model)
    assert dense_expert_bytes(model) == 0
    assert before - after == dense == report.dense_bytes_freed
    assert old.numel() == 0, "a Parameter object someone still holds must not keep the dense storage"
    assert not any(n.endswith(("gate_up_proj", "down_proj")) for n, _ in model.named_parameters())


@pytest.mark.parametrize("kind", KINDS)
def test_from_pretrained_equals_patch_model(kind, saved):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(saved[kind], dtype=torch.float32)
    hf.patch_model(ref)
    streamed = hf.from_pretrained(saved[kind], dtype=torch.float32, progress=False)
    assert dense_expert_bytes(streamed) == 0
    assert streamed.ktmoe_report.layers_patched == ref.ktmoe_report.layers_patched
    assert streamed.ktmoe_report.packed_bytes == ref.ktmoe_report.packed_bytes
    assert param_bytes(streamed) == param_bytes(ref)
    assert torch.equal(logits(streamed), logits(ref))


def test_private_load_hook_still_fits(saved):
    """hf.from_pretrained's one private dependency: fails loudly when transformers changes it."""
    from transformers import AutoModelForCausalLM, PreTrainedModel

    raw = PreTrainedModel.__dict__.get("_load_pretrained_model")
    assert isinstance(raw, staticmethod), "PreTrainedModel._load_pretrained_model is gone or no longer static"
    params = list(inspect.signature(raw.__func__).parameters)
    assert params[:4] == ["model", "state_dict", "checkpoint_files", "load_config"], params
    seen = {}
    with before_and_after_weight_loading(lambda m: seen.update(before=type(m)),
                                             lambda m, info: seen.update(after=info)) as fired:
        AutoModelForCausalLM.from_pretrained(saved["qwen3_moe"], dtype=torch.float32)
    assert fired and seen["before"].__name__ == "Qwen3MoeForCausalLM"
    assert isinstance(seen["after"].unexpected_keys, (set, list)), "the loading info lost unexpected_keys"
    assert PreTrainedModel.__dict__["_load_pretrained_model"] is raw  # restored


def test_from_pretrained_fused_checkpoint_keys(saved, tmp_path):
    """A checkpoint holding fused ``experts.gate_up_proj [E,2I,H]`` / ``experts.down_proj [E,H,I]`` keys."""
    src = saved["qwen3_moe"]
    sd = safetensors_torch.load_file(src / "model.safetensors")
    fused = {}
    for key in sorted(sd):
        if ".mlp.experts." not in key:
            fused[key] = sd[key]
    n_layers, n_exp = 2, 8
    for layer in range(n_layers):
        p = f"model.layers.{layer}.mlp.experts"
        gate = [sd[f"{p}.{e}.gate_proj.weight"] for e in range(n_exp)]
        up = [sd[f"{p}.{e}.up_proj.weight"] for e in range(n_exp)]
        fused[f"{p}.gate_up_proj"] = torch.stack([torch.cat([g, u], 0) for g, u in zip(gate, up)])
        fused[f"{p}.down_proj"] = torch.stack([sd[f"{p}.{e}.down_proj.weight"] for e in range(n_exp)])
    dst = tmp_path / "fused"
    dst.mkdir()
    safetensors_torch.save_file(fused, dst / "model.safetensors", metadata={"format": "pt"})
    for name in os.listdir(src):
        if name.endswith(".json"):
            (dst / name).write_text((src / name).read_text())
    streamed = hf.from_pretrained(dst, dtype=torch.float32, progress=False)
    per_expert = hf.from_pretrained(src, dtype=torch.float32, progress=False)
    assert torch.equal(logits(streamed), logits(per_expert))


def test_from_pretrained_sharded_and_file_backed(saved, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(saved["mixtral"], dtype=torch.float32)
    shard_dir = tmp_path / "sharded"
    model.save_pretrained(shard_dir, max_shard_size="100KB")
    with open(shard_dir / "model.safetensors.index.json") as f:
        assert len(set(json.load(f)["weight_map"].values())) > 1
    hf.patch_model(model)
    streamed = hf.from_pretrained(shard_dir, dtype=torch.float32, mmap_experts_dir=tmp_path / "arena", progress=False)
    assert streamed.ktmoe_report.file_backed_bytes > 0
    assert torch.equal(logits(streamed), logits(model))


def test_compile_no_graph_break_in_moe_layers():
    model = make_model("qwen3_moe")
    hf.patch_model(model)
    eager = logits(model)

    # 1. each MoE block alone traces into a single graph
    x = torch.randn(1, PROMPT.shape[1], 64)
    blocks = [m for m in model.modules() if isinstance(getattr(m, "experts", None), KTMoEExperts)]
    assert blocks
    for block in blocks:
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(block)(x)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1

    # 2. the whole forward: whatever breaks transformers has elsewhere, none is inside an MoE layer
    torch._dynamo.reset()
    ktmoe_files = {inspect.getsourcefile(KTMoEExperts)}
    ktmoe_files |= {inspect.getsourcefile(type(m)) for m in model.modules() if isinstance(m, torch_ktmoe.KTMoE)}
    block_file = inspect.getsourcefile(type(blocks[0]))
    block_src, block_line = inspect.getsourcelines(type(blocks[0]).forward)
    block_lines = range(block_line, block_line + len(block_src))
    explanation = torch._dynamo.explain(model)(PROMPT, attention_mask=torch.ones_like(PROMPT))
    for reason in explanation.break_reasons:
        for frame in reason.user_stack:
            inside = frame.filename in ktmoe_files or (frame.filename == block_file and frame.lineno in block_lines)
            assert not inside, f"graph break inside an MoE layer: {reason.reason} at {frame}"

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=False, backend="eager")
    with torch.no_grad():
        out = compiled(PROMPT, attention_mask=torch.ones_like(PROMPT)).logits
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-5)


def test_experts_implementation_ktmoe(saved):
    from transformers import AutoModelForCausalLM

    from torch_ktmoe.hf import implementation as te

    model = make_model("mixtral")
    ref = logits(model)
    te.configure_experts_implementation(keep_dense=True)
    try:
        model.set_experts_implementation("ktmoe")
        assert_close_logits(logits(model), ref)
        assert dense_expert_bytes(model) > 0  # keep_dense: both copies, switchable back
        model.set_experts_implementation("eager")
        torch.testing.assert_close(logits(model), ref, rtol=1e-5, atol=1e-6)
    finally:
        te._IMPL_OPTIONS.clear()

    loaded = AutoModelForCausalLM.from_pretrained(saved["mixtral"], dtype=torch.float32, experts_implementation="ktmoe")
    patched = AutoModelForCausalLM.from_pretrained(saved["mixtral"], dtype=torch.float32)
    hf.patch_model(patched)
    assert torch.equal(logits(loaded), logits(patched))
    assert dense_expert_bytes(loaded) == 0, "the natural path must end with the dense experts freed"


@pytest.mark.parametrize("other", ["eager", "batched_mm", "grouped_mm"])
def test_experts_implementation_switch_back_without_keep_dense_is_a_clear_error(other):
    """keep_dense=False released the dense experts: another implementation says keep_dense=True is needed (it
    was transformers' IndexError on the empty parameters); "ktmoe" keeps working."""
    model = make_model("mixtral")
    model.set_experts_implementation("ktmoe")
    packed = logits(model)
    model.set_experts_implementation(other)
    with pytest.raises(RuntimeError, match=rf"experts_implementation='{other}' needs the dense experts, .*"
                                           r"\(keep_dense=False\).* keep_dense=True"):
        logits(model)
    model.set_experts_implementation("ktmoe")
    assert torch.equal(logits(model), packed)


def test_experts_implementation_options_from_environment(saved, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("KTMOE_WEIGHT_FORMAT", "int8")
    monkeypatch.setenv("KTMOE_MMAP_EXPERTS_DIR", str(tmp_path / "experts"))
    loaded = AutoModelForCausalLM.from_pretrained(saved["olmoe"], dtype=torch.float32, experts_implementation="ktmoe")
    out = logits(loaded)
    ktms = [m.__dict__["_ktmoe_packed"].ktmoe for m in loaded.modules() if "_ktmoe_packed" in m.__dict__]
    assert len(ktms) == 2
    assert all(k.weight_format == "int8" and k.file_backed_bytes == k.packed_bytes > 0 for k in ktms)
    patched = AutoModelForCausalLM.from_pretrained(saved["olmoe"], dtype=torch.float32)
    hf.patch_model(patched, weight_format="int8")
    assert torch.equal(out, logits(patched))
    # state_dict / save_pretrained unpack the released experts again (int8: dequantized, with a warning)
    with pytest.warns(UserWarning, match="dequantized"):
        sd = loaded.state_dict()
    assert sd["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)


class FooExperts(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(4, 16, 8))
        self.down_proj = nn.Parameter(torch.zeros(4, 8, 8))


class FooModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleDict({"mlp": nn.ModuleDict({"experts": FooExperts()})})])


def test_unknown_block_refused():
    with pytest.raises(hf.UnsupportedExpertsError, match="FooExperts"):
        hf.patch_model(FooModel())
    report = hf.patch_model(FooModel(), strict=False)
    assert report.num_layers == 0 and [r.class_name for r in report.refused] == ["FooExperts"]
    with pytest.raises(ValueError, match="no Mixture-of-Experts"):
        hf.patch_model(nn.Sequential(nn.Linear(4, 4)))
