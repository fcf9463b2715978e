"""``python -m torch_ktmoe inspect FILE.gguf``: the experts' types, shapes and bytes per layer, the totals; a file
that is not a readable GGUF is one line on stderr, exit code 2. ``pack FILE.gguf DIR``: the experts packed into the
cache that ``from_pretrained(gguf_file=..., weight_format=..., mmap_experts_dir=DIR)`` maps."""
from gguf import GGMLQuantizationType as Q

import torch_ktmoe.hf as kh
from tests.helpers.gguf_files import write_moe_gguf
from ktmoe_harness.gguf_models import tiny_model, write_model_gguf
from torch_ktmoe.__main__ import main


def test_inspect_lists_layers_types_and_bytes(tmp_path, capsys):
    path = write_moe_gguf(tmp_path / "m.gguf", layers=2, experts=4, hidden=256, inter=512,
                          layer_types={1: {"gate": Q.IQ2_XXS, "up": Q.TQ1_0, "down": Q.Q5_K}})
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "architecture qwen3moe: block_count 2, embedding_length 256, expert_count 4" in out
    lines = out.splitlines()
    layer0 = next(l for l in lines if l.split()[:1] == ["0"])
    layer1 = next(l for l in lines if l.split()[:1] == ["1"])
    # q4_K gate/up: 4 * 512 rows * 144 bytes each; q6_K down: 4 * 256 rows * 2 * 210
    assert layer0.split() == ["0", "q4_K", "q4_K", "q6_K", "4x256x512", f"{(2 * 4 * 512 * 144 + 4 * 256 * 420) / 2**20:.1f}"]
    assert layer1.split()[1:4] == ["iq2_xxs", "tq1_0*", "q5_K"]
    assert "routed experts: 2 layers" in out and "* a GGML type torch_ktmoe does not read yet" in out


def test_inspect_split(tmp_path, capsys):
    first = write_moe_gguf(tmp_path / "s.gguf", layers=2, split_max_tensors=4)
    assert main(["inspect", first]) == 0
    out = capsys.readouterr().out
    assert out.count("file ") == 2 and "routed experts: 2 layers" in out


def test_inspect_bad_gguf_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(30))
    assert main(["inspect", str(tmp_path / "bad.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.gguf" in err and "GGUF version 0" in err


def test_pack_a_gguf_then_load_from_its_cache(tmp_path, capsys):
    write_model_gguf(tiny_model("qwen3_moe"), tmp_path / "model.gguf", expert_types=(Q.Q4_K, Q.Q4_K, Q.Q6_K))
    cache = tmp_path / "cache"
    assert main(["pack", str(tmp_path / "model.gguf"), str(cache), "--format", "int8", "--quiet"]) == 0
    assert "packed 2 layers" in capsys.readouterr().out
    model = kh.from_pretrained(tmp_path, gguf_file="model.gguf", weight_format="int8", mmap_experts_dir=cache,
                               progress=False)
    assert all(model.model.layers[n].mlp.experts.ktmoe.cache_hit for n in (0, 1))


def test_pack_refuses_a_gguf_without_experts_in_one_line(tmp_path, capsys):
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(30))
    assert main(["pack", str(tmp_path / "bad.gguf"), str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGUF version 0" in err and not (tmp_path / "cache").exists()
