"""What a Hugging Face user does with a patched model: fp16, deepcopy, pickle, save_pretrained, backward.

Models and helpers come from tests/helpers/hf_models.py (tiny random configs, offline).
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import torch_ktmoe  # noqa: E402
from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.ops import InferenceOnlyError  # noqa: E402

from tests.helpers.hf_models import (  # noqa: E402
    KINDS,
    assert_close_logits,
    assert_same_greedy,
    greedy,
    logits,
    make_model,
)


@pytest.mark.parametrize("kind", KINDS)
def test_fp16_generation_matches_unpatched(kind):
    model = make_model(kind).to(torch.float16)
    ref = logits(model)
    ref_seq, ref_step_logits = greedy(model)
    hf.patch_model(model, numa_parts=1)  # the single-node path that used to reject fp16
    out = logits(model)
    assert out.dtype == torch.float16
    assert_close_logits(out.float(), ref.float())
    assert_same_greedy(model, ref_seq, ref_step_logits)


def test_fp16_two_numa_parts_equals_one():
    one, two = make_model("qwen3_moe").to(torch.float16), make_model("qwen3_moe").to(torch.float16)
    hf.patch_model(one, numa_parts=1)
    hf.patch_model(two, numa_parts=2)
    assert_close_logits(logits(two).float(), logits(one).float())


# ---------------------------------------------------------------------------------------------- copies


def test_deepcopy_shares_packed_experts(tmp_path):
    model = make_model("qwen3_moe")
    hf.patch_model(model, mmap_experts_dir=tmp_path)
    clone = copy.deepcopy(model)
    assert torch.equal(logits(clone), logits(model))
    a = [m for m in model.modules() if isinstance(m, torch_ktmoe.KTMoE)]
    b = [m for m in clone.modules() if isinstance(m, torch_ktmoe.KTMoE)]
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert x is not y
        assert x.w13_0.data_ptr() == y.w13_0.data_ptr(), "the immutable packed experts must be shared"
        assert x.arenas[0] is y.arenas[0] and x.arenas is not y.arenas
    # the rest is a real copy: changing the clone leaves the original alone
    clone.lm_head.weight.data.zero_()
    assert not torch.equal(logits(clone), logits(model))


def test_pickle_anonymous_by_value():
    model = make_model("olmoe")
    hf.patch_model(model)
    back = pickle.loads(pickle.dumps(model))
    assert torch.equal(logits(back), logits(model))
    ktm = next(m for m in back.modules() if isinstance(m, torch_ktmoe.KTMoE))
    assert ktm.arena_stats()[0]["anon_bytes"] == ktm.packed_bytes > 0


@pytest.mark.parametrize("cache", ["reuse", "rebuild"])
def test_pickle_file_backed_maps_the_same_cache_files(tmp_path, cache):
    model = make_model("olmoe")
    hf.patch_model(model, mmap_experts_dir=tmp_path, cache=cache)
    blob = pickle.dumps(model)
    assert len(blob) < sum(m.packed_bytes for m in model.modules() if isinstance(m, torch_ktmoe.KTMoE))
    back = pickle.loads(blob)
    ktm = next(m for m in back.modules() if isinstance(m, torch_ktmoe.KTMoE))
    assert ktm.cache_hit and ktm.file_backed_bytes == ktm.packed_bytes
    assert torch.equal(logits(back), logits(model))


def _child_logits(model, queue):
    queue.put(logits(model).numpy())  # by value: a shared-memory tensor could outlive the child


def test_pickle_through_multiprocessing_spawn(tmp_path):
    model = make_model("olmoe")
    hf.patch_model(model, mmap_experts_dir=tmp_path)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_logits, args=(model, queue))
    proc.start()
    out = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert torch.equal(torch.from_numpy(out), logits(model))


def test_pickle_refused_with_reason_for_unnamed_files(tmp_path):
    model = make_model("olmoe")
    hf.patch_model(model, mmap_experts_dir=tmp_path, cache="off")
    with pytest.raises(TypeError, match="unnamed files"):
        pickle.dumps(model)
    assert logits(model).isfinite().all()  # nothing lost


def test_pickle_file_backed_gone_raises(tmp_path):
    model = make_model("olmoe")
    hf.patch_model(model, mmap_experts_dir=tmp_path)
    blob = pickle.dumps(model)
    for f in tmp_path.glob("*.ktmoe"):
        f.write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="missing or no longer valid"):
        pickle.loads(blob)


def test_experts_implementation_bad_environment_is_a_clear_error(monkeypatch):
    model = make_model("olmoe")
    dense = logits(model)
    monkeypatch.setenv("KTMOE_WEIGHT_FORMAT", "fp4")
    model.set_experts_implementation("ktmoe")
    with pytest.raises(ValueError, match="weight_format must be one of .* got 'fp4'"):
        logits(model)
    monkeypatch.delenv("KTMOE_WEIGHT_FORMAT")
    assert_close_logits(logits(model), dense)  # nothing was lost: the dense experts are still there


# ---------------------------------------------------------------------------------------------- save_pretrained


def test_save_pretrained_bf16_reloads_exactly(tmp_path):
    from transformers import AutoModelForCausalLM

    make_model("qwen3_moe").save_pretrained(tmp_path / "src")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "src", dtype=torch.bfloat16)
    dense = {k: v.clone() for k, v in model.state_dict().items()}
    hf.patch_model(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # bf16: exact, no dequantization warning
        model.save_pretrained(tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
    back = reloaded.state_dict()
    assert back.keys() == dense.keys()
    assert all(torch.equal(back[k], dense[k]) for k in dense), "bf16 experts must unpack bit for bit"
    hf.patch_model(reloaded)
    assert torch.equal(logits(reloaded), logits(model))


def test_save_pretrained_fp32_warns_the_experts_are_bf16_rounded(tmp_path):
    """An fp32 model's experts were rounded to bf16 when packed: save_pretrained writes those values, and says so."""
    model = make_model("qwen3_moe")
    dense = model.model.layers[0].mlp.experts.gate_up_proj.detach().clone()
    hf.patch_model(model)
    with pytest.warns(UserWarning, match=r"bf16 experts as torch.float32 weights: .* rounded to bf16 when packed"):
        model.save_pretrained(tmp_path / "out")
        written = model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(written, dense.bfloat16().float()) and not torch.equal(written, dense)


@pytest.mark.parametrize("fmt", [f for f, row in torch_ktmoe.ops.FORMAT_TRAITS.items() if row["codes"] != "bf16"])
def test_save_pretrained_quantized_writes_dequantized_with_warning(fmt, tmp_path):
    from transformers import AutoModelForCausalLM

    model = make_model("mixtral")
    hf.patch_model(model, weight_format=fmt)
    with pytest.warns(UserWarning, match="dequantized"):
        model.save_pretrained(tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    dense_out = logits(reloaded)  # unpatched: dense fp32 experts = the dequantized values
    assert_close_logits(logits(model), dense_out)
    hf.patch_model(reloaded, weight_format=fmt)  # repacking dequantized values gives the same packed experts
    if fmt == "int4_affine":  # min/max rounding: a group whose top weight took code 14 repacks with another s
        assert_close_logits(logits(reloaded), logits(model))
    else:
        assert torch.equal(logits(reloaded), logits(model))


# ---------------------------------------------------------------------------------------------- backward


def test_backward_raises_inference_only():
    model = make_model("qwen3_moe")
    hf.patch_model(model)
    out = model(torch.tensor([[1, 2, 3]])).logits  # forward outside no_grad works
    with pytest.raises(InferenceOnlyError, match="inference-only"):
        out.sum().backward()


def test_backward_through_op_raises():
    gate_up, down = torch.randn(4, 32, 32), torch.randn(4, 32, 16)
    w13, w2 = torch_ktmoe.ops.pack_experts(gate_up, down, "bf16")
    x = torch.randn(3, 32, requires_grad=True)
    weights = torch.rand(3, 2, requires_grad=True)
    out = torch_ktmoe.ops.moe_forward(x, torch.tensor([[0, 1], [2, 3], [1, -1]]), weights, w13, w2)
    assert out.requires_grad
    with pytest.raises(InferenceOnlyError):
        out.sum().backward()
    assert x.grad is None and weights.grad is None  # no silent zero gradient
