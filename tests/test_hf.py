"""Hugging Face transformers 5.x drop-in (torch_ktmoe.hf): tiny random models built from configs, offline.

Tolerance. Models are fp32 and KTMoE packs the experts as bf16 (weight_format="bf16"),
so each expert weight is rounded to 8 mantissa bits (relative error <= 2^-9). On these
tiny random models (init std 0.02, logits ~0.5) the measured max |logit difference| is
<= 3.3e-4; we assert max|patched - reference| <= 2e-2 * max|reference| + 1e-3, i.e. ~100x
headroom for kernels that also round activations to bf16. Greedy generate() must give
the same tokens; the test reports the reference's smallest top-1/top-2 logit margin
along the generated path if it does not.
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
from torch_ktmoe.integrations.transformers_experts import KTMoEExperts  # noqa: E402

SEED = 1  # chosen so the greedy path's smallest top-1/top-2 margin (2.4e-3) is >> the bf16 error (<=3.3e-4)
PROMPT = torch.tensor([[3, 17, 42, 8, 99, 5, 61, 23]])
NEW_TOKENS = 10
COMMON = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
              bos_token_id=None, eos_token_id=None)


def _configs():
    from transformers import (
        DeepseekV3Config,
        MixtralConfig,
        OlmoeConfig,
        Qwen2MoeConfig,
        Qwen3MoeConfig,
    )

    return {
        "mixtral": lambda: MixtralConfig(
            **COMMON, intermediate_size=32, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2
        ),
        "qwen2_moe": lambda: Qwen2MoeConfig(
            **COMMON,
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
        ),
        "qwen3_moe": lambda: Qwen3MoeConfig(
            **COMMON,
            head_dim=16,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
        ),
        "olmoe": lambda: OlmoeConfig(
            **COMMON, intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2
        ),
        # first_k_dense_replace=1: layer 0 is a dense MLP; grouped top-k router; one shared expert
        "deepseek_v3": lambda: DeepseekV3Config(
            vocab_size=128,
            hidden_size=64,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    }


KINDS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3"]


def make_model(kind: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(_configs()[kind](), dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(PROMPT, attention_mask=torch.ones_like(PROMPT)).logits


@torch.no_grad()
def greedy(model) -> tuple[torch.Tensor, torch.Tensor]:
    out = model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences, torch.stack(out.logits, 1)


def assert_same_greedy(model, ref_seq, ref_step_logits):
    """model's greedy tokens equal ref_seq; on failure, report the reference's smallest top-1/top-2 margin."""
    seq, _ = greedy(model)
    if not torch.equal(seq, ref_seq):
        top2 = ref_step_logits.float().topk(2, dim=-1).values
        margin = (top2[..., 0] - top2[..., 1]).min().item()
        pytest.fail(f"greedy tokens differ: {seq.tolist()} vs {ref_seq.tolist()} (reference min margin {margin:.3g})")


def dense_expert_bytes(model) -> int:
    return sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj")
    )


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def assert_close_logits(out, ref):
    err = (out - ref).abs().max().item()
    bound = 2e-2 * ref.abs().max().item() + 1e-3
    assert err <= bound, f"max |patched - reference| = {err:.3g} > {bound:.3g}"


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
    with hf._before_and_after_weight_loading(lambda m: seen.update(before=type(m)),
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

    from torch_ktmoe.integrations import transformers_experts as te

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
