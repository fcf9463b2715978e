"""sglang 0.5.23's KTransformers path (KTEPWrapperMethod) driving torch_ktmoe.sglang.KTMoEWrapper.

Runs in the environment `make test-sglang` builds (sglang 0.5.23 + its torch 2.14.1, the
project pip-installed against that torch); `make test` leaves this directory out.

A real sglang FusedMoE layer is built from published server args (device="cpu",
kt_weight_path=checkpoint, kt_method, kt_num_gpu_experts=G) on a single rank, with
trivial expert-location metadata. Its "GPU" half is a small torch method computing
experts [0, G) (ids -1 skipped); the wrapper, installed by the plugin entry point,
computes the rest. Weights go through sglang's own weight loader; the output is
compared with the unpatched Hugging Face experts block on the same weights.
"""
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# sglang's KT path calls these on its way; on CPU they get a do-nothing sync and a stream with .cuda_stream
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.current_stream = lambda *a, **k: SimpleNamespace(cuda_stream=0)

import torch_ktmoe  # noqa: E402
from torch_ktmoe.reference import moe_reference  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.runtime_context import get_context, get_parallel  # noqa: E402

import torch_ktmoe.sglang as ktsgl  # noqa: E402

E, H, I, K, LAYERS, LAYER = 8, 64, 32, 2, 2, 1
FORMAT_BOUND = {"BF16": 0.01, "INT8": 0.03, "INT4": 0.15}  # tests/helpers FORMAT_TOLERANCE

_parallel = get_parallel().override(tp_size=1, tp_rank=0, attn_tp_size=1, attn_tp_rank=0, moe_ep_size=1,
                                    moe_ep_rank=0, moe_tp_size=1, moe_tp_rank=0,
                                    tp_group=SimpleNamespace(rank_in_group=0, world_size=1))
_parallel.__enter__()
load_plugins()  # through the installed entry point: torch_ktmoe.sglang.plugin:register

from sglang.srt.layers.moe import kt_ep_wrapper  # noqa: E402
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE  # noqa: E402
from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput  # noqa: E402
from sglang.srt.layers.moe.topk import StandardTopKOutput  # noqa: E402
from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod  # noqa: E402


def test_installed_build_against_sglangs_torch():
    import sglang

    assert sglang.__version__ == "0.5.23"
    assert torch.__version__.startswith("2.14.1")
    # the pip-installed package, built against this torch, not the in-tree build of `make build`
    assert "site-packages" in torch_ktmoe.__file__, torch_ktmoe.__file__
    assert torch_ktmoe._native.built_torch_version() == torch.__version__


def test_plugin_installed_our_wrapper():
    assert kt_ep_wrapper.KTMoEWrapper is ktsgl.KTMoEWrapper
    assert kt_ep_wrapper.KTRANSFORMERS_AVAILABLE


def test_plugin_never_shadows_a_real_kt_kernel_silently(tmp_path, monkeypatch, caplog):
    from torch_ktmoe.sglang import plugin

    (tmp_path / "kt_kernel").mkdir()
    (tmp_path / "kt_kernel" / "__init__.py").write_text("class KTMoEWrapper: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kt_ep_wrapper, "KTMoEWrapper", "kt_kernel's", raising=False)
    monkeypatch.delenv(plugin.FORCE_ENV, raising=False)
    with caplog.at_level("WARNING", logger="torch_ktmoe.sglang"):
        assert plugin.install_wrapper() == "kt_kernel"
    assert kt_ep_wrapper.KTMoEWrapper == "kt_kernel's"
    assert "kt_kernel is installed and is used" in caplog.text
    monkeypatch.setenv(plugin.FORCE_ENV, "force")
    with caplog.at_level("WARNING", logger="torch_ktmoe.sglang"):
        assert plugin.install_wrapper() == "torch_ktmoe"
    assert kt_ep_wrapper.KTMoEWrapper is ktsgl.KTMoEWrapper
    assert "forced over the installed kt_kernel" in caplog.text


# ------------------------------------------------------------------ checkpoints
def _save_qwen(path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=H, intermediate_size=96, moe_intermediate_size=I,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=E, num_experts_per_tok=K, max_position_embeddings=64)
    return _save(Qwen3MoeForCausalLM(cfg), path)


def _save_mixtral(path):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=64, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=E, num_experts_per_tok=K,
                        max_position_embeddings=64)
    return _save(MixtralForCausalLM(cfg), path)


def _save(model, path):
    torch.manual_seed(0)
    with torch.no_grad():  # experts ~ N(0, 1/fan_in), like the format bounds assume
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.normal_(0, p.shape[-1] ** -0.5)
    model.to(torch.bfloat16).save_pretrained(path)
    return str(path), model.model.layers[LAYER].mlp.experts.float()


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return _save_qwen(tmp_path_factory.mktemp("qwen3moe"))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return _save_mixtral(tmp_path_factory.mktemp("mixtral"))


# ------------------------------------------------------------------ the sglang layer
def torch_gpu_experts(layer, dispatch_output):
    """Stands in for sglang's GPU runner (the wrapped method's apply): experts [0, G) in torch."""
    x = dispatch_output.hidden_states
    weights, ids, _ = dispatch_output.topk_output  # ids of CPU experts are -1 here (sglang masked them)
    out = moe_reference(x, ids, weights, layer.w13_weight, layer.w2_weight)  # w13 = [gate; up] rows
    return StandardCombineInput(hidden_states=out.to(x.dtype))


def _trivial_expert_location(model_config):
    """sglang's trivial expert-location metadata (physical expert i = logical expert i).

    sglang 0.5.23's MixtralForCausalLM has no get_model_config_for_expert_location, so
    sglang itself builds no metadata for Mixtral, and its KT path then fails (the weight
    loader writes CPU experts into the GPU tensor; process_weights_after_loading reads the
    missing map). The metadata is made from the config's sizes here, as for Qwen3-MoE.
    """
    from sglang.srt.eplb.expert_location import ExpertLocationMetadata, ModelConfigForExpertLocation

    if ModelConfigForExpertLocation.from_model_config(model_config) is None:
        sized = ModelConfigForExpertLocation(num_layers=LAYERS, num_logical_experts=E)
        original = ModelConfigForExpertLocation.from_model_config
        ModelConfigForExpertLocation.from_model_config = staticmethod(lambda mc: sized)
        try:
            return ExpertLocationMetadata.init_trivial(model_config, moe_ep_rank=0)
        finally:
            ModelConfigForExpertLocation.from_model_config = staticmethod(original)
    return ExpertLocationMetadata.init_trivial(model_config, moe_ep_rank=0)


def _sglang_layer(ckpt, method, gpu_experts, names, **server_args):
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang.srt.eplb import expert_location

    server_args.setdefault("kt_weight_path", ckpt)
    override = get_context().override_server_args(device="cpu", model_path=ckpt, kt_method=method,
                                                  kt_num_gpu_experts=gpu_experts, **server_args)
    server_args = override.install()
    try:
        meta = _trivial_expert_location(model_config_of(server_args))
        expert_location.set_global_expert_location_metadata(meta, allow_overwrite=True)
        layer = FusedMoE(num_experts=E, hidden_size=H, intermediate_size=I, layer_id=LAYER, top_k=K,
                         params_dtype=torch.bfloat16, prefix=f"model.layers.{LAYER}.mlp.experts")
        assert type(layer.quant_method).__name__ == "KTEPWrapperMethod"
        gpu = layer.quant_method.gpu_method  # sglang's UnquantizedFusedMoEMethod: keep its weights, swap the runner
        assert isinstance(gpu, UnquantizedFusedMoEMethod) and layer.w13_weight.shape[0] == gpu_experts
        gpu.apply = torch_gpu_experts
        gpu.process_weights_after_loading = lambda layer: None
        assert isinstance(layer.quant_method.wrapper, ktsgl.KTMoEWrapper)
        _load_through_sglang(layer, ckpt, names)
        layer.quant_method.process_weights_after_loading(layer)  # -> wrapper.load_weights(map)
    finally:
        override.restore()
    return layer


def _load_through_sglang(layer, ckpt, names):
    """What the model's load_weights does for the experts: sglang's weight loader, per checkpoint key."""
    from safetensors import safe_open

    mapping = FusedMoE.make_expert_params_mapping(*names, num_experts=E)
    params = dict(layer.named_parameters())
    prefix = f"model.layers.{LAYER}."
    with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as f:
        for key in f.keys():
            if not key.startswith(prefix):
                continue
            for param_name, weight_name, expert_id, shard_id in mapping:
                if weight_name in key:
                    pname = param_name.split("experts.", 1)[1] + "weight"
                    layer.weight_loader(params[pname], f.get_tensor(key), key, shard_id, expert_id)
                    break


QWEN_NAMES = ("gate_proj", "down_proj", "up_proj")
MIXTRAL_NAMES = ("w1", "w2", "w3")


def _routing(T, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    logits = torch.randn(T, E, generator=g)
    w, ids = torch.topk(torch.softmax(logits, -1), K, dim=-1)
    return x, ids.to(torch.int32), w.float(), logits


def _run(layer, x, ids, w, logits):
    # sglang masks topk_ids in place: hand it a copy so the reference keeps the ids
    return layer.forward(x.clone(), StandardTopKOutput(w.clone(), ids.clone(), logits))


def _rel_err(out, ref):
    return float((out.float() - ref).abs().mean() / ref.abs().mean())


def _hf_reference(hf_experts, x, ids, w):
    with torch.no_grad():
        return hf_experts(x.float(), ids.long(), w.float())


@pytest.mark.parametrize("gpu_experts", [0, 3])
def test_qwen3_bf16_matches_hf(qwen, gpu_experts):
    ckpt, hf_experts = qwen
    layer = _sglang_layer(ckpt, "BF16", gpu_experts, QWEN_NAMES)
    x, ids, w, logits = _routing(13)
    out = _run(layer, x, ids, w, logits)
    ref = _hf_reference(hf_experts, x, ids, w)
    assert out.dtype == torch.bfloat16 and out.shape == (13, H)
    assert _rel_err(out, ref) <= FORMAT_BOUND["BF16"], _rel_err(out, ref)
    wrapper = layer.quant_method.wrapper
    assert wrapper.num_cpu_experts == E - gpu_experts and wrapper.moe.num_experts == E - gpu_experts
    # the CPU half alone: exactly the CPU experts' share of the reference
    cpu_ids = torch.where(ids >= gpu_experts, ids, torch.full_like(ids, -1))
    cpu_ref = _hf_reference_masked(hf_experts, x, cpu_ids, w)
    cpu_out = wrapper.forward(x, ids, w)
    assert _rel_err(cpu_out, cpu_ref) <= FORMAT_BOUND["BF16"]


def _hf_reference_masked(hf_experts, x, ids, w):
    keep = (ids >= 0).float()
    return _hf_reference(hf_experts, x, ids.clamp(min=0), w * keep)


def test_mixtral_bf16_matches_hf(mixtral):
    ckpt, hf_experts = mixtral
    layer = _sglang_layer(ckpt, "BF16", 2, MIXTRAL_NAMES)
    x, ids, w, logits = _routing(9)
    assert _rel_err(_run(layer, x, ids, w, logits), _hf_reference(hf_experts, x, ids, w)) <= FORMAT_BOUND["BF16"]


@pytest.mark.parametrize("method", ["INT8", "AMXINT4"])
def test_quantized_methods_within_format_bounds(qwen, method):
    ckpt, hf_experts = qwen
    layer = _sglang_layer(ckpt, method, 2, QWEN_NAMES)
    assert layer.quant_method.wrapper.weight_format == ktsgl.weight_format_of(method)
    x, ids, w, logits = _routing(16)
    ref = _hf_reference(hf_experts, x, ids, w)
    bound = FORMAT_BOUND["INT8" if "8" in method else "INT4"]
    assert _rel_err(_run(layer, x, ids, w, logits), ref) <= bound


def _test_helper(name):
    """tests/helpers/<name>.py loaded by path: the checkpoint writers the main suite uses (the helpers package's
    __init__ imports the in-tree build, which this venv must not see)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_ktmoe_test_helper_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quantized_checkpoint(src, dst, method):
    """(checkpoint dir, {key: dequantized fp32 expert weight}) of `src` in `method`'s checkpoint kind."""
    from safetensors.torch import load_file

    if method.startswith("FP8"):
        fp8 = _test_helper("fp8")
        path = fp8.fp8_checkpoint(src, dst, per_channel=method == "FP8_PERCHANNEL", experts_only=True)
        t = load_file(os.path.join(path, "model.safetensors"))
        deq = {k: (t[k].float() * t[k + "_scale"] if method == "FP8_PERCHANNEL"
                   else fp8.dequantize_blocks(t[k], t[k + "_scale_inv"]))
               for k in t if k.endswith(".weight") and k + ("_scale" if method == "FP8_PERCHANNEL" else "_scale_inv") in t}
        return path, deq
    kind = {"RAWINT4": "compressed-tensors", "GPTQ_INT4": "gptq"}[method]
    path = _test_helper("int4_checkpoints").int4_checkpoint(src, dst, kind)
    return path, {k: v.float() for k, v in load_file(os.path.join(path + "-dequantized", "model.safetensors")).items()}


@pytest.mark.parametrize("method", ["FP8", "FP8_PERCHANNEL", "RAWINT4", "GPTQ_INT4"])
def test_quantized_checkpoints_through_sglangs_kt_path(qwen, tmp_path, method):
    """sglang's server args -> KTEPWrapperMethod -> our wrapper reading an FP8 / compressed-tensors / GPTQ checkpoint
    exactly (fp8, int4_affine): within the bf16 bound of the layer on the dequantized weights."""
    ckpt, _ = qwen
    path, deq = _quantized_checkpoint(ckpt, tmp_path / method, method)
    # sglang on CPU knows no "gptq" (its CUDA hosts turn it into gptq_marlin): GPTQ MoEs are served as moe_wna16
    layer = _sglang_layer(path, method, 0, QWEN_NAMES, **({"quantization": "moe_wna16"} if method == "GPTQ_INT4" else {}))
    assert layer.quant_method.wrapper.weight_format == ktsgl.weight_format_of(method)
    assert layer.quant_method.wrapper.moe.weight_format == ("fp8" if method.startswith("FP8") else "int4_affine")
    prefix = f"model.layers.{LAYER}.mlp.experts"
    gate_up = torch.stack([torch.cat([deq[f"{prefix}.{e}.gate_proj.weight"], deq[f"{prefix}.{e}.up_proj.weight"]])
                           for e in range(E)])
    down = torch.stack([deq[f"{prefix}.{e}.down_proj.weight"] for e in range(E)])
    x, ids, w, logits = _routing(11)
    ref = moe_reference(x.float(), ids, w, gate_up, down, "bf16")
    assert _rel_err(_run(layer, x, ids, w, logits), ref) <= FORMAT_BOUND["BF16"]


def test_llamafile_gguf_through_sglangs_kt_path(qwen, tmp_path):
    """--kt-method LLAMAFILE: the CPU experts where the GGUF in --kt-weight-path holds them (f32 here: the
    checkpoint's own values), the GPU experts from the checkpoint through sglang's loader."""
    import gguf
    from safetensors.torch import load_file

    ckpt, hf_experts = qwen
    tensors = load_file(os.path.join(ckpt, "model.safetensors"))
    directory = tmp_path / "gguf"
    directory.mkdir()
    w = gguf.GGUFWriter(str(directory / "model.gguf"), arch="qwen3moe")
    w.add_block_count(LAYERS)
    w.add_embedding_length(H)
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_expert_feed_forward_length(I)
    for n in range(LAYERS):
        for role in ("gate", "up", "down"):
            rows = [tensors[f"model.layers.{n}.mlp.experts.{e}.{role}_proj.weight"].float() for e in range(E)]
            w.add_tensor(f"blk.{n}.ffn_{role}_exps.weight", torch.stack(rows).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    layer = _sglang_layer(ckpt, "LLAMAFILE", 3, QWEN_NAMES, kt_weight_path=str(directory))
    wrapper = layer.quant_method.wrapper
    assert wrapper.weight_format == "gguf" and wrapper.moe.gguf.mapped and wrapper.num_cpu_experts == E - 3
    x, ids, w, logits = _routing(13)
    assert _rel_err(_run(layer, x, ids, w, logits), _hf_reference(hf_experts, x, ids, w)) <= FORMAT_BOUND["BF16"]


def test_gpu_experts_mask_form(qwen):
    """Newer kt-kernel passes gpu_experts_mask (bool [E]) in place of num_gpu_experts."""
    ckpt, hf_experts = qwen
    args = dict(layer_idx=LAYER, num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I,
                cpuinfer_threads=2, threadpool_count=1, weight_path=ckpt, chunked_prefill_size=64, method="BF16")
    by_count = ktsgl.KTMoEWrapper(num_gpu_experts=3, **args)
    by_mask = ktsgl.KTMoEWrapper(gpu_experts_mask=torch.arange(E) < 3, **args)
    odd = torch.tensor([i % 2 == 1 for i in range(E)])  # odd experts on the GPU
    by_odd = ktsgl.KTMoEWrapper(gpu_experts_mask=odd, **args)
    p2l = torch.arange(E)
    for wr in (by_count, by_mask, by_odd):
        wr.load_weights(p2l)
    x, ids, w, _ = _routing(11)
    assert torch.equal(by_count.forward(x, ids, w), by_mask.forward(x, ids, w))
    cpu_ids = torch.where(odd[ids.long()], torch.full_like(ids, -1), ids)
    assert _rel_err(by_odd.forward(x, ids, w), _hf_reference_masked(hf_experts, x, cpu_ids, w)) <= 0.01


def test_physical_to_logical_map_is_honoured(qwen):
    ckpt, hf_experts = qwen
    wr = ktsgl.KTMoEWrapper(LAYER, E, K, H, I, 0, None, 1, ckpt, 64, method="BF16")
    perm = torch.randperm(E, generator=torch.Generator().manual_seed(3))  # physical p holds logical perm[p]
    wr.load_weights(perm)
    x, ids, w, _ = _routing(10)
    assert _rel_err(wr.forward(x, ids, w), _hf_reference(hf_experts, x, perm[ids.long()], w)) <= 0.01


def test_mmap_experts_dir_via_flag_is_file_backed_and_bit_identical(qwen, tmp_path, monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    ckpt, _ = qwen
    x, ids, w, logits = _routing(12)
    monkeypatch.delenv(ktsgl.MMAP_DIR_ENV, raising=False)
    anon = _sglang_layer(ckpt, "BF16", 2, QWEN_NAMES)
    assert anon.quant_method.wrapper.moe.file_backed_bytes == 0
    out_anon = _run(anon, x, ids, w, logits)

    # the command line through sglang's own parsing (hooked by the plugin), exported for the workers
    d = tmp_path / "experts"
    server_args = prepare_server_args(["--model-path", ckpt, "--kt-weight-path", ckpt, "--kt-mmap-experts-dir", str(d)])
    assert server_args.kt_weight_path == ckpt
    assert os.environ[ktsgl.MMAP_DIR_ENV] == str(d)

    before = torch_ktmoe.memory_report()["arena_file_backed_bytes"]
    filed = _sglang_layer(ckpt, "BF16", 2, QWEN_NAMES)
    moe = filed.quant_method.wrapper.moe
    assert moe.mmap_experts_dir == str(d) and moe.file_backed_bytes == moe.packed_bytes > 0
    assert torch_ktmoe.memory_report()["arena_file_backed_bytes"] - before >= moe.packed_bytes
    assert any(n.endswith(".ktmoe") for n in os.listdir(d))
    assert torch.equal(_run(filed, x, ids, w, logits), out_anon)


def test_overlap_with_caller_work(tmp_path, capsys):
    """submit, 20 ms of busy Python in the caller (the stand-in for GPU work), sync.

    Asserted without timing thresholds: the caller's Python runs *while* the worker is
    inside moe_forward (impossible if the op held the GIL). Printed: cpu ms, 20 ms, total.
    One ATen thread, so that on a 2-core machine the caller's spinning core does not
    slow the experts down (on a GPU host the caller mostly waits on the GPU).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        line = _overlap(tmp_path)
    finally:
        torch.set_num_threads(threads)
    with capsys.disabled():
        print("\n" + line)


def _overlap(tmp_path):
    h, inter = 1024, 512
    wr = ktsgl.KTMoEWrapper(LAYER, E, K, h, inter, 0, None, 1, str(tmp_path), 64, method="BF16")
    g = torch.Generator().manual_seed(0)
    wr.load_weights_from_tensors(torch.randn(E, inter, h, generator=g) / 32, torch.randn(E, inter, h, generator=g) / 32,
                                 torch.randn(E, h, inter, generator=g) / 23)
    T = 256
    x = torch.randn(T, h, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    w = torch.full((T, K), 1.0 / K)
    inside, forward = [], wr.moe.forward

    def recorded(*a):
        t0 = time.perf_counter()
        out = forward(*a)
        inside.append((t0, time.perf_counter()))
        return out

    wr.moe.forward = recorded
    for _ in range(2):
        wr.forward(x, ids, w)  # warm
    cpu_ms = sorted(_timed(lambda: wr.forward(x, ids, w)) for _ in range(5))[2]
    totals, overlapped_steps = [], 0
    for _ in range(5):
        inside.clear()
        t = time.perf_counter()
        wr.submit_forward(x, ids, w, 0)
        stamps = _busy_python(0.020)
        wr.sync_forward(x, 0)
        totals.append((time.perf_counter() - t) * 1e3)
        (t0, t1), = inside
        overlapped_steps += sum(t0 < s < t1 for s in stamps)
    total_ms = sorted(totals)[2]
    assert overlapped_steps > 0, "the caller never ran while moe_forward ran: the op holds the GIL"
    return (f"[overlap, 1 thread] cpu experts {cpu_ms:.1f} ms, caller work 20.0 ms, submit+work+sync "
            f"{total_ms:.1f} ms (max {max(cpu_ms, 20):.1f}, sum {cpu_ms + 20:.1f}; medians of 5)")


def _timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def _busy_python(seconds):
    """Spins in Python for ``seconds``; returns the time stamps of its steps."""
    end, stamps = time.perf_counter() + seconds, []
    while (now := time.perf_counter()) < end:
        stamps.append(now)
    return stamps


# ------------------------------------------------------------------ bad input
def _ctor(ckpt, **kw):
    args = dict(layer_idx=LAYER, num_experts=E, num_experts_per_tok=K, hidden_size=H, moe_intermediate_size=I,
                num_gpu_experts=2, cpuinfer_threads=None, threadpool_count=1, weight_path=ckpt,
                chunked_prefill_size=64, method="BF16")
    args.update(kw)
    return ktsgl.KTMoEWrapper(**args)


def test_bad_input_through_sglang(qwen, tmp_path):
    ckpt, _ = qwen
    with pytest.raises(ValueError, match=r"method 'FP4'.*supported methods"):
        _sglang_layer(ckpt, "FP4", 2, QWEN_NAMES)
    with pytest.raises(ValueError, match=r"num_gpu_experts=8 must be in \[0, num_experts=8\)"):
        _sglang_layer(ckpt, "BF16", E, QWEN_NAMES)
    with pytest.raises(FileNotFoundError, match="weight_path"):
        _ctor(str(tmp_path / "missing"))
    with pytest.raises(KeyError, match=f"no experts of layer {LAYERS + 3}"):
        _ctor(ckpt, layer_idx=LAYERS + 3).load_weights(torch.arange(E))


def test_launcher_reaches_sglangs_parser(tmp_path):
    """python -m torch_ktmoe.sglang --help: sglang's launch_server parser answers, flag hooked in by the plugin."""
    import subprocess
    import sys

    env = dict(os.environ, KTMOE_SGLANG_MMAP_EXPERTS_DIR="")
    res = subprocess.run([sys.executable, "-P", "-m", "torch_ktmoe.sglang", "--kt-mmap-experts-dir", str(tmp_path),
                          "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--kt-weight-path" in res.stdout and "--kt-mmap-experts-dir" in res.stdout


def test_in_tree_build_for_another_torch_gives_a_clear_message():
    """The in-tree module of `make build` (this machine's torch) imported under sglang's torch."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    stamp = os.path.join(root, "torch_ktmoe", "_C.torch-version")
    if not os.path.exists(stamp):
        pytest.skip("no in-tree build (make build) to import")
    built = open(stamp).read().strip()
    if built == torch.__version__:
        pytest.skip("the in-tree build is for this torch")
    res = subprocess.run([sys.executable, "-P", "-c", "import torch_ktmoe"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=root))
    assert res.returncode != 0
    assert f"built against torch {built}, but torch {torch.__version__} is running" in res.stderr, res.stderr[-1500:]
    assert "undefined symbol" not in res.stderr
