"""torch_ktmoe.hf.from_pretrained(path, gguf_file=...): a transformers MoE model from a GGUF file, written here as
llama.cpp's converter writes one (ktmoe_harness/gguf_models.py), per architecture and type mix: the config from the
metadata, the dense weights exact, the experts in place (the file's mapping) or packed on request; against a
reference model holding the file's values (gguf.quants.dequantize), transformers' own GGUF load where it reads
right, and bad files named."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gguf import GGMLQuantizationType as Q

import torch_ktmoe
import torch_ktmoe.hf as kh
from ktmoe_harness.gguf_models import reference_model, round_like_the_kernel, tiny_model, write_model_gguf
from torch_ktmoe.checkpoint.gguf import GGUFError
from torch_ktmoe.reference import relative_error

MIXES = {"q4_K_M": (Q.Q4_K, Q.Q4_K, Q.Q6_K), "q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0),
         "low-bit": (Q.Q2_K, Q.Q3_K, Q.IQ4_XS), "q5_K/mxfp4/q4_0": (Q.Q5_K, Q.MXFP4, Q.Q4_0),
         "iq2_xxs/iq3_s/iq1_m": (Q.IQ2_XXS, Q.IQ3_S, Q.IQ1_M)}
PROMPT = torch.tensor([[3, 17, 42, 8, 77, 5, 60, 11, 29, 90]])


def write(tmp_path, model_type, mix="q4_K_M", **kwargs):
    model = tiny_model(model_type)
    held = write_model_gguf(model, tmp_path / "model.gguf", expert_types=MIXES[mix], **kwargs)
    return model, reference_model(model, held)


def kernel_like_tolerance():
    """How far our logits may be from round_like_the_kernel's model: a bf16 rounding falling the other way in
    places; amx's decode rows of q4_K / q5_K / q6_K / iq4_xs also round the activations to int16 per block of 32
    (2^-15 of its largest, far below the bf16 rounding modelled), which the random blocks amplify to 0.5-1.6e-3
    (avx512: below 2e-4)."""
    return 3e-3 if torch_ktmoe.active_isa() == "amx" else 1e-3


def logits(model):
    with torch.no_grad():
        return model(PROMPT).logits


def greedy(model):
    return model.generate(PROMPT, max_new_tokens=6, do_sample=False)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "deepseek_v3", "deepseek_v2",
                                        "glm4_moe", "minimax_m2"])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_computes_what_the_file_holds(tmp_path, model_type, mix):
    _, ref = write(tmp_path, model_type, mix, dense_type=Q.Q8_0)
    ours = kh.from_pretrained(tmp_path, gguf_file="model.gguf", progress=False)
    moe_layers = [n for n, layer in enumerate(ref.model.layers) if hasattr(layer.mlp, "experts")]
    assert ours.ktmoe_report.layers_patched == moe_layers and type(ours) is type(ref)
    experts = ours.model.layers[moe_layers[0]].mlp.experts.ktmoe
    assert experts.weight_format == "gguf" and experts.gguf.ggml_types == tuple(int(t) for t in MIXES[mix])
    assert (experts.activation == "swiglu_oai") == (model_type == "gpt_oss")
    assert experts.file_backed_bytes == experts.packed_bytes > 0
    # the experts' bf16 activations, through two layers of random blocks (whose sane scales still amplify)
    assert relative_error(logits(ours), logits(ref)) < 0.15
    # the same fp32 sums over bf16 activations: apart from a bf16 rounding falling the other way in places (the
    # kernels' exp is not torch's)
    kernel_like = round_like_the_kernel(ref)
    assert relative_error(logits(ours), logits(kernel_like)) < kernel_like_tolerance()
    assert torch.equal(greedy(ours), greedy(kernel_like))


def test_agrees_with_transformers_own_gguf_load(tmp_path):
    """transformers reads a qwen2moe file right when its widths are Qwen2MoeConfig's defaults (it ignores the
    file's): then its model and ours compute the same."""
    from transformers import AutoModelForCausalLM

    model = tiny_model("qwen2_moe", moe_intermediate_size=1408, shared_expert_intermediate_size=5632)
    write_model_gguf(model, tmp_path / "model.gguf", expert_types=MIXES["q8_0"], dense_type=Q.Q8_0)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32)
    ours = kh.from_pretrained(tmp_path, gguf_file="model.gguf", progress=False)
    round_like_the_kernel(theirs)  # (I = 1408: a bf16 rounding of an activation may fall the other way in places)
    assert relative_error(logits(ours), logits(theirs)) < kernel_like_tolerance()
    assert torch.equal(greedy(ours), greedy(theirs))


def test_widths_the_transformers_mapping_drops_and_the_tensors_alone(tmp_path):
    """A qwen3moe file's expert width (transformers takes 768) and top-k normalization; without the metadata's
    widths, the tensors' shapes give them."""
    _, ref = write(tmp_path, "qwen3_moe", "q8_0", metadata=False)
    ours = kh.from_pretrained(tmp_path, gguf_file=str(tmp_path / "model.gguf"), progress=False)
    assert ours.config.moe_intermediate_size == 256 and ours.config.norm_topk_prob
    assert relative_error(logits(ours), logits(round_like_the_kernel(ref))) < kernel_like_tolerance()


def test_layers_of_different_mixes_and_a_split_file(tmp_path):
    model = tiny_model("qwen3_moe")
    held = write_model_gguf(model, tmp_path / "model.gguf", expert_types=MIXES["q4_K_M"],
                            layer_expert_types={1: MIXES["low-bit"]}, split_max_tensors=8)
    parts = sorted(os.listdir(tmp_path))
    assert len(parts) > 1 and parts[0].endswith("-00001-of-%05d.gguf" % len(parts))
    ours = kh.from_pretrained(tmp_path, gguf_file=parts[0], progress=False)
    assert [ours.model.layers[n].mlp.experts.ktmoe.gguf.ggml_types[2] for n in (0, 1)] == [Q.Q6_K, Q.IQ4_XS]
    ref = round_like_the_kernel(reference_model(model, held))
    assert relative_error(logits(ours), logits(ref)) < kernel_like_tolerance()


def test_a_weight_format_packs_the_experts_into_the_cache(tmp_path):
    _, ref = write(tmp_path, "qwen3_moe", "q8_0")
    cache = tmp_path / "cache"
    cache.mkdir()
    packed = kh.from_pretrained(tmp_path, gguf_file="model.gguf", weight_format="bf16", mmap_experts_dir=cache,
                                progress=False)
    ktm = packed.model.layers[0].mlp.experts.ktmoe
    assert ktm.weight_format == "bf16" and ktm.gguf is None and ktm.file_backed_bytes == ktm.packed_bytes
    assert relative_error(logits(packed), logits(ref)) < 2e-2
    again = kh.from_pretrained(tmp_path, gguf_file="model.gguf", weight_format="bf16", mmap_experts_dir=cache,
                               progress=False)
    assert again.model.layers[1].mlp.experts.ktmoe.cache_hit
    assert torch.equal(logits(again), logits(packed))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_state_dict_writes_the_exact_values(tmp_path, model_type):
    model = tiny_model(model_type)
    held = write_model_gguf(model, tmp_path / "model.gguf", expert_types=MIXES["q4_K_M"])
    state = kh.from_pretrained(tmp_path, gguf_file="model.gguf", progress=False).state_dict()
    assert state.keys() == held.keys()
    for name in held:
        assert torch.equal(state[name], held[name]), name


def test_loading_in_place_adds_no_anonymous_copy(tmp_path):
    """The experts (80 MB of q8_0 here) stay the file's pages: anonymous memory grows by far less."""
    model = tiny_model("qwen3_moe", num_experts=64, moe_intermediate_size=512, num_hidden_layers=3)
    write_model_gguf(model, tmp_path / "model.gguf", expert_types=MIXES["q8_0"])
    script = textwrap.dedent(f"""
        import torch_ktmoe.hf as kh, torch
        from torch_ktmoe.memory import memory_report
        before = memory_report()["anon_rss_bytes"]
        model = kh.from_pretrained({str(tmp_path)!r}, gguf_file="model.gguf", progress=False)
        x = torch.tensor([[1, 2, 3, 4]])
        with torch.no_grad():
            model(x)
        grown = memory_report()["anon_rss_bytes"] - before
        print(grown, model.ktmoe_report.packed_bytes, model.ktmoe_report.file_backed_bytes)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    grown, experts, file_backed = map(int, out.stdout.split()[-3:])
    assert experts == file_backed > 75 << 20
    dense = sum(p.numel() * 4 for n, p in model.named_parameters() if ".experts." not in n)
    assert grown < 0.05 * experts + 3 * dense + (40 << 20), (grown, experts, dense)


def test_bad_files_are_named(tmp_path):
    import gguf

    write(tmp_path, "qwen3_moe", "q8_0")
    with pytest.raises(ValueError, match="config= cannot be given"):
        kh.from_pretrained(tmp_path, gguf_file="model.gguf", config=object(), progress=False)
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        kh.from_pretrained(tmp_path, gguf_file="missing.gguf", progress=False)
    w = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), arch="bert")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", torch.zeros(4, 32).numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(GGUFError, match="'bert' model; torch_ktmoe.hf.from_pretrained reads"):
        kh.from_pretrained(tmp_path, gguf_file="bert.gguf", progress=False)
    # a dense weight the file lacks: an error, never a random initialization
    src = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    w = gguf.GGUFWriter(str(tmp_path / "lacking.gguf"), arch="qwen3moe")
    for field in src.fields.values():
        if field.name.startswith("qwen3moe."):
            w.add_key_value(field.name, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in src.tensors:
        if t.name != "output_norm.weight":
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(GGUFError, match=r"lacks 1 of Qwen3MoeForCausalLM's weights, e.g. \['model.norm.weight'\]"):
        kh.from_pretrained(tmp_path, gguf_file="lacking.gguf", progress=False)


def test_an_intermediate_size_of_whole_32_blocks_only(tmp_path):
    """DeepSeek-V2-Lite's 1408 is no multiple of 256: llama.cpp writes its down rows in a 32-block type (here I =
    352 = 11 x 32, gate / up still k-quants along H)."""
    model = tiny_model("deepseek_v2", moe_intermediate_size=352)
    held = write_model_gguf(model, tmp_path / "model.gguf", expert_types=(Q.Q4_K, Q.Q5_K, Q.Q8_0))
    ours = kh.from_pretrained(tmp_path, gguf_file="model.gguf", progress=False)
    assert ours.model.layers[1].mlp.experts.ktmoe.intermediate_size == 352
    ref = round_like_the_kernel(reference_model(model, held))
    assert relative_error(logits(ours), logits(ref)) < kernel_like_tolerance()


def test_glm_multi_token_prediction_layers_are_not_the_models(tmp_path):
    model = tiny_model("glm4_moe")
    held = write_model_gguf(model, tmp_path / "model.gguf", expert_types=MIXES["q8_0"], mtp_layers=1)
    with pytest.warns(UserWarning, match=r"1 tensors .* not read, e.g. \['blk.3.nextn.eh_proj.weight'\]"):
        ours = kh.from_pretrained(tmp_path, gguf_file="model.gguf", progress=False)
    assert ours.config.num_hidden_layers == 3 and ours.ktmoe_report.layers_patched == [1, 2]
    ref = round_like_the_kernel(reference_model(model, held))
    assert relative_error(logits(ours), logits(ref)) < kernel_like_tolerance()


def test_bf16_keeps_what_the_model_keeps_in_fp32_exact(tmp_path):
    """dtype=bf16: the weights in bf16, but a router transformers keeps in fp32 (DeepSeek-V3's gate and its
    correction bias) holds the file's fp32 values, not bf16-rounded ones."""
    model = tiny_model("deepseek_v3")
    held = write_model_gguf(model, tmp_path / "model.gguf", expert_types=MIXES["q8_0"])
    ours = kh.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.bfloat16, progress=False)
    gate = ours.model.layers[1].mlp.gate
    assert gate.weight.dtype == torch.float32 and torch.equal(gate.weight, held["model.layers.1.mlp.gate.weight"])
    assert torch.equal(gate.e_score_correction_bias, held["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert ours.model.layers[1].self_attn.q_a_proj.weight.dtype == torch.bfloat16
    ids = PROMPT
    with torch.no_grad():
        out = ours(ids).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
