"""torch_ktmoe.sglang.KTMoEWrapper without sglang: kt-kernel's contract, id mapping, checkpoint layouts,
bad input, the launcher's flag handling.

The same wrapper driven by a real sglang layer: tests/integration/test_sglang.py (`make test-sglang`).
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from torch_ktmoe.checkpoint.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from torch_ktmoe.reference import moe_reference
from torch_ktmoe.sglang import MMAP_DIR_ENV, KTMoEWrapper, weight_format_of
from tests.helpers import FORMAT_TOLERANCE, random_experts

E, H, I, K, L = 6, 64, 32, 2, 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _experts(seed=0):
    gate_up, down = random_experts(E, H, I, seed=seed)
    return gate_up.to(torch.bfloat16), down.to(torch.bfloat16)


def _write(path, layout, gate_up, down, layer=L):
    """A checkpoint of one layer's experts in one of the layouts NativeMoEWrapper reads."""
    os.makedirs(path, exist_ok=True)
    t = {}
    for e in range(E):
        g, u = gate_up[e, :I], gate_up[e, I:]
        if layout == "qwen":
            p = f"model.layers.{layer}.mlp.experts.{e}"
            t.update({f"{p}.gate_proj.weight": g, f"{p}.up_proj.weight": u, f"{p}.down_proj.weight": down[e]})
        elif layout == "mixtral":
            p = f"model.layers.{layer}.block_sparse_moe.experts.{e}"
            t.update({f"{p}.w1.weight": g, f"{p}.w3.weight": u, f"{p}.w2.weight": down[e]})
    if layout == "fused":
        t = {f"model.layers.{layer}.mlp.experts.gate_up_proj": gate_up,
             f"model.layers.{layer}.mlp.experts.down_proj": down}
    if layout == "kt-amx":
        t = {"blk.3.ffn_up_exps.0.numa.0.weight": torch.zeros(4, dtype=torch.uint8)}
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(path, "model.safetensors"))
    return str(path)


def _wrapper(path, **kw):
    args = dict(num_gpu_experts=2, cpuinfer_threads=4, threadpool_count=2, weight_path=path,
                chunked_prefill_size=512, method="BF16")
    args.update(kw)
    return KTMoEWrapper(L, E, K, H, I, **args)


def _routing(T, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w, ids = torch.topk(torch.softmax(torch.randn(T, E, generator=g), -1), K, dim=-1)
    return x, ids.to(torch.int32), w.float()


def _ref(gate_up, down, x, ids, w, on_cpu):
    """fp32 reference of the experts where ``on_cpu[id]`` (others skipped, as on the GPU)."""
    ids = torch.where(on_cpu[ids.long()], ids.long(), torch.full_like(ids.long(), -1))
    return moe_reference(x.float(), ids, w, gate_up.float(), down.float())


def _rel(out, ref):
    return float((out.float() - ref).abs().mean() / ref.abs().mean())


@pytest.mark.parametrize("layout", ["qwen", "mixtral", "fused"])
def test_layouts_and_gpu_split_match_reference(tmp_path, layout):
    gate_up, down = _experts()
    wr = _wrapper(_write(tmp_path, layout, gate_up, down))
    wr.load_weights(torch.arange(E))
    x, ids, w = _routing(17)
    before = ids.clone()
    out = wr.forward(x, ids, w)
    assert torch.equal(ids, before)  # inputs untouched
    assert out.dtype == x.dtype and out.shape == x.shape
    assert wr.moe.num_experts == E - 2
    assert _rel(out, _ref(gate_up, down, x, ids, w, torch.arange(E) >= 2)) <= FORMAT_TOLERANCE["bf16"]


@pytest.mark.parametrize("method,fmt", [("BF16", "bf16"), ("AMXINT8", "int8"), ("MOE_INT4", "int4"),
                                        ("MXFP4", "mxfp4")])
def test_methods_within_format_bounds(tmp_path, method, fmt):
    gate_up, down = _experts(seed=2)
    wr = _wrapper(_write(tmp_path, "qwen", gate_up, down), method=method, num_gpu_experts=0)
    assert wr.weight_format == fmt == weight_format_of(method.lower())
    wr.load_weights(None)
    x, ids, w = _routing(32)
    assert _rel(wr.forward(x, ids, w), _ref(gate_up, down, x, ids, w, torch.ones(E, dtype=torch.bool))) \
        <= FORMAT_TOLERANCE[fmt]


def test_mxfp4_method_packs_fp4_experts_exactly(tmp_path):
    """--kt-method MXFP4 on DeepSeek-V4's FP4 experts (ffn.experts.{e}.w1/w3/w2.weight int8 [n, k/2], two e2m1
    codes a byte, + .scale E8M0 [n, k/32]): the codes and scales are packed as they are, so the layer matches the
    reference on the dequantized weights within bf16's bound (only the activations round)."""
    gate_up, down = _experts(seed=4)
    tensors, dequantized = {}, {}
    for e in range(E):
        for name, w in (("w1", gate_up[e, :I]), ("w3", gate_up[e, I:]), ("w2", down[e])):
            blocks, scales = quantize_mxfp4(w.float())
            tensors[f"model.layers.{L}.ffn.experts.{e}.{name}.weight"] = blocks.flatten(-2).view(torch.int8)
            tensors[f"model.layers.{L}.ffn.experts.{e}.{name}.scale"] = scales.view(torch.float8_e8m0fnu)
            dequantized[e, name] = dequantize_mxfp4(blocks, scales)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    wr = _wrapper(str(tmp_path), method="MXFP4", num_gpu_experts=0)
    assert wr.weight_format == "mxfp4"
    wr.load_weights(None)
    gu = torch.stack([torch.cat([dequantized[e, "w1"], dequantized[e, "w3"]]) for e in range(E)])
    dn = torch.stack([dequantized[e, "w2"] for e in range(E)])
    x, ids, w = _routing(32)
    ref = _ref(gu, dn, x, ids, w, torch.ones(E, dtype=torch.bool))
    assert _rel(wr.forward(x, ids, w), ref) <= FORMAT_TOLERANCE["bf16"]


def test_submit_copies_inputs_before_returning(tmp_path):
    """sglang masks topk_ids in place right after submit and may overwrite x: the result must not change."""
    gate_up, down = _experts()
    wr = _wrapper(_write(tmp_path, "qwen", gate_up, down))
    wr.load_weights(torch.arange(E))
    x, ids, w = _routing(9)
    expected = wr.forward(x, ids, w)
    x2, ids2, w2 = x.clone(), ids.clone(), w.clone()
    wr.submit_forward(x2, ids2, w2, 0)
    ids2[ids2 >= 2] = -1
    x2.zero_()
    w2.zero_()
    assert torch.equal(wr.sync_forward(x2, 0), expected)


def test_gpu_experts_mask_and_physical_to_logical_map(tmp_path):
    gate_up, down = _experts()
    path = _write(tmp_path, "fused", gate_up, down)
    mask = torch.tensor([False, True, False, True, True, False])  # experts 1, 3, 4 on the GPU
    perm = torch.tensor([5, 0, 3, 1, 2, 4])  # physical p holds logical perm[p]
    wr = _wrapper(path, num_gpu_experts=None, gpu_experts_mask=mask)
    wr.load_weights(perm)
    assert wr.cpu_physical.tolist() == [0, 2, 5]
    x, ids, w = _routing(15)
    ref = moe_reference(x.float(), torch.where(mask[ids.long()], -1, perm[ids.long()]), w,
                        gate_up.float(), down.float())
    assert _rel(wr.forward(x, ids, w), ref) <= FORMAT_TOLERANCE["bf16"]


def test_load_weights_from_tensors_both_forms(tmp_path):
    gate_up, down = _experts()
    gate, up = gate_up[:, :I], gate_up[:, I:]
    all_e = _wrapper(str(tmp_path))
    all_e.load_weights_from_tensors(gate, up, down, torch.arange(E))
    cpu_only = _wrapper(str(tmp_path))
    cpu_only.load_weights_from_tensors(gate[2:], up[2:], down[2:])
    x, ids, w = _routing(8)
    assert torch.equal(all_e.forward(x, ids, w), cpu_only.forward(x, ids, w))
    with pytest.raises(ValueError, match="gate_proj has 3 experts"):
        _wrapper(str(tmp_path)).load_weights_from_tensors(gate[:3], up[:3], down[:3])


def test_mmap_dir_from_environment_and_static_methods(tmp_path, monkeypatch):
    gate_up, down = _experts()
    path = _write(tmp_path / "ckpt", "qwen", gate_up, down)
    monkeypatch.setenv(MMAP_DIR_ENV, str(tmp_path / "experts"))
    wr = _wrapper(path, unknown_future_kwarg=1)  # unknown keywords are ignored
    wr.load_weights(torch.arange(E))
    assert wr.moe.file_backed_bytes == wr.moe.packed_bytes > 0 and not wr.moe.cache_hit
    again = _wrapper(path)  # a restart: the packed cache is mapped, not packed again
    again.load_weights(torch.arange(E))
    assert again.moe.cache_hit
    x, ids, w = _routing(5)
    assert torch.equal(again.forward(x, ids, w), wr.forward(x, ids, w))
    # the same number of CPU experts, but other ones: another fingerprint, packed again
    other_split = _wrapper(path, num_gpu_experts=None, gpu_experts_mask=torch.arange(E) >= E - 2)
    other_split.load_weights(torch.arange(E))
    assert not other_split.moe.cache_hit
    assert torch.equal(other_split.forward(x, ids, w), _wrapper_forward_reference(path, x, ids, w))
    assert _wrapper(path, mmap_experts_dir=None).mmap_experts_dir == str(tmp_path / "experts")
    KTMoEWrapper.set_capture_batch_sizes([1, 2, 4])
    assert KTMoEWrapper.get_capture_batch_sizes() == [1, 2, 4]
    KTMoEWrapper.clear_buffer_cache()
    assert KTMoEWrapper._buffer_cache == {}


def _wrapper_forward_reference(path, x, ids, w):
    """The experts [0, E-2) of the checkpoint, packed without a directory."""
    anon = _wrapper(path, num_gpu_experts=None, gpu_experts_mask=torch.arange(E) >= E - 2, mmap_experts_dir="")
    anon.load_weights(torch.arange(E))
    assert anon.mmap_experts_dir is None
    return anon.forward(x, ids, w)


def test_bad_input_gets_clear_errors(tmp_path):
    gate_up, down = _experts()
    path = _write(tmp_path / "ckpt", "qwen", gate_up, down)
    for m in ("FP4", "GPTQ", "AMXBF16"):
        with pytest.raises(ValueError, match=f"method '{m}' is not supported.*supported methods"):
            _wrapper(path, method=m)
    with pytest.raises(ValueError, match="weight_path is None"):
        _wrapper(None)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        _wrapper(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"num_gpu_experts=6 must be in \[0, num_experts=6\)"):
        _wrapper(path, num_gpu_experts=E)
    with pytest.raises(ValueError, match="every one of the 6 experts is on the GPU"):
        _wrapper(path, num_gpu_experts=None, gpu_experts_mask=torch.ones(E, dtype=torch.bool))
    with pytest.raises(ValueError, match="disagrees with gpu_experts_mask"):
        _wrapper(path, num_gpu_experts=1, gpu_experts_mask=torch.arange(E) < 2)
    with pytest.raises(KeyError, match="no experts of layer 3"):
        _wrapper(_write(tmp_path / "other", "qwen", gate_up, down, layer=0)).load_weights(torch.arange(E))
    with pytest.raises(ValueError, match="pre-converted"):
        _wrapper(_write(tmp_path / "amx", "kt-amx", gate_up, down), method="AMXINT4").load_weights(torch.arange(E))
    with pytest.raises(ValueError, match="expected \\[16, 64\\]"):
        KTMoEWrapper(L, E, K, H, 16, 2, None, 1, path, 64, method="BF16").load_weights(torch.arange(E))
    wr = _wrapper(path)
    x, ids, w = _routing(4)
    with pytest.raises(RuntimeError, match="call load_weights"):
        wr.submit_forward(x, ids, w, 0)
    wr.load_weights(torch.arange(E))
    with pytest.raises(ValueError, match="expert id 6 >= num_experts=6"):
        wr.forward(x, torch.full_like(ids, E), w)
    with pytest.raises(RuntimeError, match="without submit_forward"):
        wr.sync_forward(x)
    wr.submit_forward(x, ids, w)
    with pytest.raises(RuntimeError, match="called again before sync_forward"):
        wr.submit_forward(x, ids, w)
    assert wr.sync_forward(x).shape == x.shape  # the first submit is intact


def test_launcher_takes_the_flag_off_the_command_line():
    from torch_ktmoe.sglang.__main__ import split_flag

    argv = ["--model-path", "m", "--kt-mmap-experts-dir", "/nvme/x", "--port", "1"]
    assert split_flag(argv) == (["--model-path", "m", "--port", "1"], "/nvme/x")
    assert split_flag(["--kt-mmap-experts-dir=/d", "--tp", "1"]) == (["--tp", "1"], "/d")
    assert split_flag(["--model-path", "m"]) == (["--model-path", "m"], None)
    with pytest.raises(SystemExit, match="needs a directory"):
        split_flag(["--kt-mmap-experts-dir"])


def test_physical_to_logical_map_is_checked_slot_by_slot(tmp_path):
    gate_up, down = _experts()
    path = _write(tmp_path, "fused", gate_up, down)
    negative = torch.tensor([0, 1, 2, -3, 4, 5])  # fused rows: -3 would be expert E-3
    slot_msg = r"CPU slot 1 \(physical expert 3\) maps to logical expert -3, outside \[0, num_experts=6\)"
    with pytest.raises(ValueError, match=slot_msg):
        _wrapper(path).load_weights(negative)
    with pytest.raises(ValueError, match=slot_msg):
        _wrapper(path).load_weights_from_tensors(gate_up[:, :I], gate_up[:, I:], down, negative)
    with pytest.raises(ValueError, match=r"CPU slot 0 \(physical expert 2\) maps to logical expert 6.*3 more"):
        _wrapper(path).load_weights(torch.arange(E) + 4)
    with pytest.raises(TypeError, match="must hold integer expert ids, got dtype torch.float32"):
        _wrapper(path).load_weights(torch.arange(E, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"must be 1-D \[num_physical_experts\], got shape \(2, 3\)"):
        _wrapper(path).load_weights(torch.arange(E).reshape(2, 3))
    with pytest.raises(ValueError, match="has 5 entries, fewer than num_experts=6"):
        _wrapper(path).load_weights(list(range(5)))
    wr = _wrapper(path)
    wr.load_weights([0, 1, 5, 4, 3, 2])  # a list of ints is a map too
    x, ids, w = _routing(6)
    ref = _ref(gate_up[[0, 1, 5, 4, 3, 2]], down[[0, 1, 5, 4, 3, 2]], x, ids, w, torch.arange(E) >= 2)
    assert _rel(wr.forward(x, ids, w), ref) <= FORMAT_TOLERANCE["bf16"]


@pytest.mark.parametrize("cache_dir", [False, True])
def test_nonfinite_weight_names_the_logical_expert_and_layer(tmp_path, cache_dir):
    gate_up, down = _experts()
    gate_up[4, 3, 5] = float("nan")
    path = _write(tmp_path / "ckpt", "fused", gate_up, down)
    perm = torch.tensor([0, 1, 4, 3, 2, 5])  # logical expert 4 is in physical slot 2: CPU slot 0
    msg = r"logical expert 4 of layer 3 \(CPU slot 0, physical expert 2\) in .*ckpt has a non-finite weight"
    with pytest.raises(RuntimeError, match=msg):
        _wrapper(path, mmap_experts_dir=str(tmp_path / "experts") if cache_dir else "").load_weights(perm)
    with pytest.raises(RuntimeError, match=r"logical expert 4 of layer 3 \(CPU slot 0, physical expert 2\) in the "
                                           "given tensors"):
        _wrapper(path, mmap_experts_dir="").load_weights_from_tensors(gate_up[:, :I], gate_up[:, I:], down, perm)


def test_zero_experts_per_token(tmp_path):
    gate_up, down = _experts()
    path = _write(tmp_path, "qwen", gate_up, down)
    with pytest.raises(ValueError, match=r"num_experts_per_tok=0 must be >= 1"):
        KTMoEWrapper(L, E, 0, H, I, num_gpu_experts=2, weight_path=path, method="BF16")
    wr = _wrapper(path)
    wr.load_weights(None)
    x, ids, w = _routing(5)
    out = wr.forward(x, ids[:, :0], w[:, :0])  # no expert routed: nothing to add to the GPU's output
    assert out.shape == x.shape and out.dtype == x.dtype and not out.any()


def test_non_utf8_paths_are_refused_at_construction_naming_them(tmp_path, monkeypatch):
    gate_up, down = _experts()
    bad = os.fsdecode(os.fsencode(tmp_path) + b"/ckpt\xff")
    _write(bad, "qwen", gate_up, down)
    with pytest.raises(ValueError, match=r"weight_path \(--kt-weight-path\) b'.*/ckpt\\xff' is not a valid UTF-8"):
        _wrapper(bad)
    good = _write(tmp_path / "ckpt", "qwen", gate_up, down)
    with pytest.raises(ValueError, match=r"mmap_experts_dir b'.*/experts\\xff' is not a valid UTF-8"):
        _wrapper(good, mmap_experts_dir=os.fsdecode(os.fsencode(tmp_path) + b"/experts\xff"))
    monkeypatch.setenv(MMAP_DIR_ENV, os.fsdecode(os.fsencode(tmp_path) + b"/env\xff"))
    with pytest.raises(ValueError, match=r"mmap_experts_dir b'.*/env\\xff' is not a valid UTF-8"):
        _wrapper(good)


def _refused_in_a_child(code: str, hang: str) -> str:
    """stdout and stderr of ``code`` run in a child process; the test fails with ``hang`` if it runs past 60 s."""
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    except subprocess.TimeoutExpired:
        pytest.fail(hang)
    return r.stdout + r.stderr


def test_fifo_shard_without_an_index_is_a_value_error_naming_it(tmp_path):
    """load_weights lists the *.safetensors files when there is no index: a FIFO among them is refused, never
    opened for reading (that would wait for a writer forever). In a child process: a hang fails the test."""
    gate_up, down = _experts()
    path = _write(tmp_path / "ckpt", "qwen", gate_up, down)
    os.mkfifo(os.path.join(path, "zz-pipe.safetensors"))
    code = textwrap.dedent(f"""
        import torch
        from torch_ktmoe.sglang import KTMoEWrapper
        wrapper = KTMoEWrapper({L}, {E}, {K}, {H}, {I}, num_gpu_experts=2, cpuinfer_threads=1, threadpool_count=1,
                               weight_path={path!r}, chunked_prefill_size=64, method="BF16")
        try:
            wrapper.load_weights(torch.arange({E}))
        except ValueError as e:
            print("REFUSED", e)
    """)
    out = _refused_in_a_child(code, "load_weights blocked on a FIFO named *.safetensors")
    assert "REFUSED" in out and "zz-pipe.safetensors' is not a regular file" in out, out


def test_next_layer_prefetch_reads_the_next_wrappers_predicted_cpu_experts(tmp_path, monkeypatch):
    """Layer L's wrapper applies layer L + 1's router (read from the checkpoint) to its hidden state: with the next
    layer routed by that router on the same state, every routed CPU expert was predicted (recall 1), and only
    the next wrapper's CPU slots are read ahead."""
    from torch_ktmoe.residency import reads as expert_reads

    reads = []
    monkeypatch.setattr(expert_reads, "read_ahead_experts", lambda w13, w2, ids: reads.append(ids))
    gate_up, down = _experts()
    path = _write(tmp_path / "a", "fused", gate_up, down)
    _write(tmp_path / "b", "fused", gate_up, down, layer=L + 1)
    router = torch.randn(E, H, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    from safetensors.torch import load_file
    tensors = {**load_file(os.path.join(path, "model.safetensors")),
               **load_file(os.path.join(tmp_path / "b", "model.safetensors")),
               f"model.layers.{L + 1}.mlp.gate.weight": router}
    save_file(tensors, os.path.join(path, "model.safetensors"))
    first = _wrapper(path, next_layer_prefetch=True)
    second = KTMoEWrapper(L + 1, E, K, H, I, num_gpu_experts=2, weight_path=path, method="BF16",
                          next_layer_prefetch=True)
    first.load_weights()
    second.load_weights()
    x, ids, w = _routing(1)  # one token: k of the 6 router rows predicted
    first.forward(x, ids, w)
    routed = (x.float() @ router.float().T).topk(K, -1).indices  # what layer L + 1 routes to on that state
    second.forward(x, routed.to(torch.int32), w)
    s = second.moe.residency_stats()
    cpu_routed = int((routed >= 2).sum())  # experts 0 and 1 are on the GPU: skipped
    assert s["predicted_routed"] == cpu_routed and s["recall"] == 1.0
    predicted = (x.float() @ router.float().T).topk(K, -1).indices
    cpu_predicted = int(torch.unique(predicted[predicted >= 2]).numel())
    if cpu_predicted * 4 >= second.num_cpu_experts * 3:  # most of the CPU experts: a prefill, streamed, not read
        assert reads == []
    else:
        assert len(reads) == 1 and reads[0].min() >= 0 and reads[0].max() < second.num_cpu_experts
    again = _wrapper(path, next_layer_prefetch=True)  # another model of the same checkpoint
    again.load_weights()
    off = KTMoEWrapper(L + 1, E, K, H, I, num_gpu_experts=2, weight_path=path, method="BF16",
                       next_layer_prefetch="auto")  # anonymous: its layer does not ask
    off.load_weights()
    assert not off.moe.next_layer_prefetching
    again.forward(x, ids, w)
    assert again._predictor is None and len(reads) == 1  # asked again next forward, nothing read


def test_llamafile_runs_a_gguf_in_place_with_a_gpu_split(tmp_path):
    """--kt-method LLAMAFILE: the layer's experts where the GGUF in --kt-weight-path holds them (all E mapped,
    the GPU experts never routed to), any physical-to-logical map; the same as the op over the file's blocks."""
    from gguf import GGMLQuantizationType as Q

    from tests.helpers.gguf_files import write_moe_gguf
    from torch_ktmoe import ops

    types = {"gate": Q.Q8_0, "up": Q.Q4_0, "down": Q.Q8_0}
    write_moe_gguf(tmp_path / "model.gguf", layers=L + 1, experts=E, hidden=H, inter=I, types=types, sane=True)
    mask = torch.tensor([False, True, False, True, True, False])
    perm = torch.tensor([5, 0, 3, 1, 2, 4])
    wr = _wrapper(str(tmp_path), method="LLAMAFILE", num_gpu_experts=None, gpu_experts_mask=mask,
                  mmap_experts_dir=str(tmp_path / "unused"))
    assert wr.weight_format == "gguf"
    wr.load_weights(perm)
    assert wr.moe.num_experts == E and wr.moe.gguf.mapped and not (tmp_path / "unused").exists()
    x, ids, w = _routing(15)
    gate, up, down = wr.moe.gguf.gate, wr.moe.gguf.up, wr.moe.gguf.down
    logical = torch.where(mask[ids.long()], -1, perm[ids.long()])
    want = ops.moe_forward_ggml(x, logical, w, gate, up, down, [types[r] for r in ("gate", "up", "down")])
    assert torch.equal(wr.forward(x, ids, w), want)
    gate_up = torch.cat([ops.ggml_dequantize(gate, Q.Q8_0), ops.ggml_dequantize(up, Q.Q4_0)], 1)
    ref = moe_reference(x.float(), logical, w, gate_up, ops.ggml_dequantize(down, Q.Q8_0))
    assert _rel(want, ref) <= FORMAT_TOLERANCE["bf16"]


def test_llamafile_bad_directories_are_named(tmp_path):
    from tests.helpers.gguf_files import write_moe_gguf

    with pytest.raises(FileNotFoundError, match="holds no \\*.gguf file"):
        _wrapper(str(tmp_path), method="LLAMAFILE").load_weights(None)
    write_moe_gguf(tmp_path / "a.gguf", layers=2, experts=E, hidden=256, inter=256)
    with pytest.raises(ValueError, match="no routed experts for layer 3"):
        _wrapper(str(tmp_path), method="LLAMAFILE").load_weights(None)
    write_moe_gguf(tmp_path / "a.gguf", layers=4, experts=E, hidden=256, inter=256)
    with pytest.raises(ValueError, match=r"\(E, H, I\) = \(6, 256, 256\), sglang's layer \(6, 64, 32\)"):
        _wrapper(str(tmp_path), method="LLAMAFILE").load_weights(None)
    write_moe_gguf(tmp_path / "b.gguf", layers=4, experts=E, hidden=256, inter=256)
    with pytest.raises(ValueError, match="holds 2 GGUF models"):
        _wrapper(str(tmp_path), method="LLAMAFILE").load_weights(None)


def test_config_json_is_read_through_the_safe_opener(tmp_path):
    """A FIFO named config.json never blocks (in a child: a hang fails the test); a JSON list and a gpt-oss
    swiglu_limit that is no number are ValueErrors naming the file (and the field)."""
    gate_up, down = _experts()
    fifo = _write(tmp_path / "fifo", "fused", gate_up, down)
    os.mkfifo(os.path.join(fifo, "config.json"))
    code = textwrap.dedent(f"""
        from torch_ktmoe.sglang import KTMoEWrapper
        try:
            KTMoEWrapper({L}, {E}, {K}, {H}, {I}, num_gpu_experts=2, weight_path={fifo!r}, method="BF16").load_weights()
        except ValueError as e:
            print("REFUSED", e)
    """)
    out = _refused_in_a_child(code, "KTMoEWrapper blocked on a FIFO named config.json")
    assert "REFUSED" in out and "config.json' is not a regular file" in out, out
    listed = _write(tmp_path / "list", "fused", gate_up, down)
    with open(os.path.join(listed, "config.json"), "w") as f:
        f.write("[1, 2]")
    with pytest.raises(ValueError, match=r"list/config.json' is not a JSON object \(it holds a list\)"):
        _wrapper(listed).load_weights()
    limit = _write(tmp_path / "limit", "fused", gate_up, down)
    with open(os.path.join(limit, "config.json"), "w") as f:
        f.write('{"model_type": "gpt_oss", "swiglu_limit": "abc"}')
    with pytest.raises(ValueError, match=r"limit/config.json: swiglu_limit must be a finite number, got 'abc'"):
        _wrapper(limit).load_weights()
