"""hf.compile_decode: a static KV cache and a compiled decode step on the CPU, one graph for every token and prompt.

Graph counts come from CompiledDecode.graphs (the backend wrapper counts each graph dynamo hands it). Every
test but one uses backend="aot_eager" (a few seconds to compile); the bf16 one uses inductor, what users run
and where the numerics differ from eager (~30-50 s to compile on a loaded 2-core host, so once).
"""

import pytest
import torch

from tests.helpers.hf_models import PROMPT, assert_close_logits, make_model
from torch_ktmoe import hf

NEW_TOKENS = 16
CACHE = 32  # positions of the static cache: prompt (8) + NEW_TOKENS (16) fit, with room


def patched(dtype=torch.float32):
    model = make_model("qwen3_moe").to(dtype)
    hf.patch_model(model)
    return model


@torch.no_grad()
def generate(model, prompt, new_tokens=NEW_TOKENS, **kwargs):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                          do_sample=False, **kwargs)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def test_compiled_greedy_equals_eager_fp32():
    model = patched()
    eager = generate(model, PROMPT)  # the model's default: a dynamic cache, no compile
    compiled = hf.compile_decode(model, max_cache_len=CACHE, backend="aot_eager")
    assert model.ktmoe_compiled is compiled and compiled.graphs == 0
    out = generate(model, PROMPT)
    assert compiled.graphs == 1, "the decode step was not compiled (or compiled more than once)"
    assert torch.equal(out, eager), f"{out.tolist()} vs eager {eager.tolist()}"


def test_compiled_bf16_logits_within_bound():
    """Each compiled decode step's logits against an eager forward over the same tokens (teacher-forced, so a
    rounding-level tie that flips a greedy token cannot make the two runs compare different contexts)."""
    model = patched(torch.bfloat16)
    hf.compile_decode(model, max_cache_len=CACHE, backend="inductor")
    out = generate(model, PROMPT, output_logits=True, return_dict_in_generate=True)
    assert model.ktmoe_compiled.graphs == 1
    step_logits = torch.stack(out.logits, 1)  # [1, NEW_TOKENS, V], fp32 copies of the bf16 logits
    seq = out.sequences
    with torch.no_grad():
        ref = model(seq[:, :-1], attention_mask=torch.ones_like(seq[:, :-1])).logits.float()
    assert_close_logits(step_logits, ref[:, PROMPT.shape[1] - 1:])


def test_no_recompile_from_token_to_token():
    model = patched()
    compiled = hf.compile_decode(model, max_cache_len=CACHE, backend="aot_eager")
    generate(model, PROMPT, new_tokens=3)  # prefill + 2 compiled decode steps
    assert compiled.graphs == 1
    generate(model, PROMPT, new_tokens=CACHE - PROMPT.shape[1])  # every position of the cache
    assert compiled.graphs == 1
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # dynamo's own count agrees


def test_prompt_lengths_share_one_decode_graph():
    """Prefill is eager (any length, nothing compiled); the decode graph's shapes are the cache's, not the prompt's."""
    model = patched()
    eager = {n: generate(model, PROMPT[:, :n]) for n in (3, 8)}
    compiled = hf.compile_decode(model, max_cache_len=CACHE, backend="aot_eager")
    for n in (3, 8):  # shorter first: without max_cache_len, the longer call would size a larger cache
        assert torch.equal(generate(model, PROMPT[:, :n]), eager[n])
    assert compiled.graphs == 1
    # the cache holds prompt + new tokens - 1 positions (the last token is never fed back): one past max_cache_len
    # makes transformers size a larger cache, which is a second graph
    generate(model, PROMPT, new_tokens=CACHE - PROMPT.shape[1] + 2)
    assert compiled.graphs == 2


def test_refuses_unpatched_model():
    with pytest.raises(hf.CompileDecodeError, match="no KTMoE experts.*patch_model"):
        hf.compile_decode(make_model("qwen3_moe"))


def test_refuses_model_without_fullgraph():
    model = patched()
    model._can_compile_fullgraph = False
    with pytest.raises(hf.CompileDecodeError, match="fullgraph"):
        hf.compile_decode(model)


def test_refuses_model_without_cache_objects(monkeypatch):
    model = patched()
    monkeypatch.setattr(type(model), "_supports_default_dynamic_cache", classmethod(lambda cls: False))
    with pytest.raises(hf.CompileDecodeError, match="cannot be static"):
        hf.compile_decode(model)


@pytest.mark.parametrize("bad", [0, -4, 16.0])
def test_refuses_bad_cache_length(bad):
    with pytest.raises(hf.CompileDecodeError, match="max_cache_len"):
        hf.compile_decode(patched(), max_cache_len=bad)
