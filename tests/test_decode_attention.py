"""hf.decode_attention: "ktmoe_decode", SDPA with single-token decode as grouped fp32 matmuls.

Checked against transformers' own sdpa_attention_forward (torch's SDPA) on the same inputs: GQA and
plain multi-head, bool / float / per-head / absent masks, fp32 and bf16, batch > 1; prefill and the
options it does not handle go to SDPA unchanged; a patched model switched to it generates the same
greedy tokens, eager and under compile_decode.
"""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tests.helpers.hf_models import PROMPT, make_model
from torch_ktmoe import hf
from torch_ktmoe.hf.decode_attention import NAME, decode_attention_forward


class Heads(torch.nn.Module):
    def __init__(self, heads, kv_heads):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True


def qkv(b, h, kv, n, d, dtype, q_len=1, dv=None):
    g = torch.Generator().manual_seed(b * 1000 + h * 100 + kv * 10 + n)
    q = torch.randn(b, h, q_len, d, generator=g).to(dtype)
    k = torch.randn(b, kv, n, d, generator=g).to(dtype)
    v = torch.randn(b, kv, n, dv or d, generator=g).to(dtype)
    return q, k, v


def masks(b, h, n):
    keep = torch.rand(b, 1, 1, n, generator=torch.Generator().manual_seed(n)) > 0.3
    keep[..., 0] = True  # every row attends somewhere
    per_head = keep.expand(b, h, 1, n).clone()
    per_head[:, 1::2, :, 1] = False
    additive = torch.zeros(b, 1, 1, n).masked_fill(~keep, torch.finfo(torch.float32).min)
    return {"none": None, "bool": keep, "per_head": per_head, "float": additive}


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "per_head", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_sdpa(heads, kv_heads, mask_kind, dtype):
    b, n, d = 2, 37, 16
    q, k, v = qkv(b, heads, kv_heads, n, d, dtype, dv=24)
    mask = masks(b, heads, n)[mask_kind]
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    module = Heads(heads, kv_heads)
    out, weights = decode_attention_forward(module, q, k, v, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert weights is None and out.shape == ref.shape == (b, 1, heads, 24) and out.dtype == dtype
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_masked_positions_do_not_leak():
    """A position the mask excludes changes nothing, even when its values are huge."""
    q, k, v = qkv(1, 4, 2, 9, 8, torch.float32)
    keep = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    keep[..., 4] = False
    out, _ = decode_attention_forward(Heads(4, 2), q, k, v, keep)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4], v2[:, :, 4] = 1e4, 1e4
    out2, _ = decode_attention_forward(Heads(4, 2), q, k2, v2, keep)
    assert torch.equal(out, out2)


@pytest.mark.parametrize("case", ["prefill", "softcap", "dropout", "sinks"])
def test_other_cases_go_to_sdpa_unchanged(case, monkeypatch):
    q, k, v = qkv(1, 8, 2, 12, 16, torch.float32, q_len=5 if case == "prefill" else 1)
    kwargs = {"softcap": {"softcap": 30.0}, "dropout": {"dropout": 0.5}, "sinks": {"s_aux": torch.zeros(8)}}.get(case, {})
    calls = []
    import transformers.integrations.sdpa_attention as sdpa

    def spy(*a, **kw):
        calls.append(kw)
        return "sdpa's answer", None

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", spy)
    out, _ = decode_attention_forward(Heads(8, 2), q, k, v, None, **kwargs)
    assert out == "sdpa's answer" and len(calls) == 1


@torch.no_grad()
def test_patched_model_switches_and_generates_the_same_tokens():
    model = make_model("qwen3_moe")
    hf.patch_model(model, decode_attention=False)
    assert model.config._attn_implementation == "sdpa"
    ids, mask = PROMPT, torch.ones_like(PROMPT)
    before = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    assert hf.use_decode_attention(model) is True
    assert model.config._attn_implementation == NAME
    assert hf.use_decode_attention(model) is True  # idempotent
    after = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    assert torch.equal(before, after), f"{after.tolist()} vs sdpa {before.tolist()}"


def test_other_attention_implementations_are_left_alone():
    model = make_model("qwen3_moe")
    model.set_attn_implementation("eager")
    assert hf.use_decode_attention(model) is False
    assert model.config._attn_implementation == "eager"
    assert hf.use_decode_attention(torch.nn.Linear(2, 2)) is False


def test_compile_decode_uses_it():
    torch._dynamo.reset()
    model = make_model("qwen3_moe")
    hf.patch_model(model, decode_attention=False)
    hf.compile_decode(model, max_cache_len=32, backend="aot_eager")
    assert model.config._attn_implementation == NAME
    torch._dynamo.reset()


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_models_that_test_for_sdpa_by_name_stay_on_it(model_type):
    """Their sparse indexers fold the selection into the mask only under "eager" / "sdpa": under another name
    it would be passed as indices that neither decode attention nor SDPA reads (wrong logits)."""
    from tests.helpers.hf_families import tiny_model

    model = tiny_model(model_type)
    report = hf.patch_model(model)
    assert hf.use_decode_attention(model) is False and model.config._attn_implementation == "sdpa"
    assert f"modeling_{model_type} tests for 'sdpa' by name" in report.defaults_left["decode_attention"]
    assert not report.decode_attention
