"""checkpoint/gguf.py: GGUF files written by the `gguf` package's writer read back exactly (metadata, tensors at
their bytes, experts per layer, a type mix, splits, a custom alignment), and every malformed file refused with one
GGUFError naming the file and what is wrong, nothing read past its end."""
import os
import struct

import numpy as np
import pytest
import torch

import gguf
from gguf import GGMLQuantizationType as Q

from tests.helpers.gguf_files import write_moe_gguf
from torch_ktmoe import ops
from torch_ktmoe.checkpoint.gguf import GGUFError, expert_layers, open_gguf, read_gguf, split_paths


def tensor_bytes(t):
    with open(t.file, "rb") as f:
        f.seek(t.offset)
        return f.read(t.nbytes)


def test_reads_what_gguf_wrote(tmp_path):
    path = write_moe_gguf(tmp_path / "m.gguf", layers=3, experts=4, hidden=256, inter=512,
                          layer_types={1: {"gate": Q.Q8_0, "up": Q.IQ4_XS, "down": Q.Q5_K}})
    model = open_gguf(path)
    assert model.architecture == "qwen3moe" and model.arch_value("expert_count") == 4
    ref = gguf.GGUFReader(path)
    assert len(model.tensors) == len(ref.tensors) == 12
    for rt in ref.tensors:
        t = model.tensors[rt.name]
        assert t.ggml_type == int(rt.tensor_type) and t.shape == tuple(reversed([int(d) for d in rt.shape]))
        assert t.offset == rt.data_offset and t.nbytes == rt.n_bytes
        assert tensor_bytes(t) == rt.data.tobytes()
    layers = expert_layers(model)
    assert [l.layer for l in layers] == [0, 1, 2]
    assert layers[0].shape == (4, 256, 512)
    assert [layers[1].gate.type_name, layers[1].up.type_name, layers[1].down.type_name] == ["q8_0", "iq4_xs", "q5_K"]
    assert [layers[0].gate.type_name, layers[0].down.type_name] == ["q4_K", "q6_K"]
    down = layers[2].down
    assert down.shape == (4, 256, 512) and down.row_bytes == 2 * 210
    rows = torch.frombuffer(bytearray(tensor_bytes(down)), dtype=torch.uint8).reshape(4, 256, -1)
    ref_down = next(rt for rt in ref.tensors if rt.name == down.name)
    assert torch.equal(ops.ggml_dequantize(rows, down.ggml_type),
                       torch.from_numpy(gguf.quants.dequantize(ref_down.data, Q.Q6_K)).reshape(4, 256, 512))


def test_split_files_and_alignment(tmp_path):
    first = write_moe_gguf(tmp_path / "s.gguf", layers=2, split_max_tensors=3, alignment=64)
    parts = split_paths(first)
    assert len(parts) == 3 and parts[0] == first
    assert split_paths(parts[2]) == parts
    model = open_gguf(parts[1])
    assert model.files[0].alignment == 64 and len(model.tensors) == 8  # each part has its own (the writer: the 1st)
    assert {t.file for t in model.tensors.values()} == set(parts)
    assert all((t.offset - f.data_offset) % 64 == 0 for f in model.files for t in f.tensors.values())
    assert [l.layer for l in expert_layers(model)] == [0, 1]
    os.remove(parts[2])
    with pytest.raises(GGUFError, match=r"part of a split of 3, and 1 parts are missing"):
        open_gguf(first)


def test_no_experts_and_wrong_metadata(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "dense.gguf"), arch="llama")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    assert expert_layers(open_gguf(tmp_path / "dense.gguf")) == []
    path = write_moe_gguf(tmp_path / "m.gguf", metadata={"qwen3moe.expert_feed_forward_length": 768})
    with pytest.raises(GGUFError, match=r"ffn_gate_exps.weight has I = 256, but the metadata's "
                                        r"qwen3moe.expert_feed_forward_length is 768"):
        expert_layers(open_gguf(path))


def write_raw(path, *, version=3, tensors=(), kv=(), alignment=None, data=b"", pad=True):
    """A GGUF by hand: tensors (name, dims innermost first, type id, offset), kv (key, type id, packed value)."""
    def s(text):
        b = text.encode() if isinstance(text, str) else text
        return struct.pack("<Q", len(b)) + b
    kv = list(kv) + ([("general.alignment", 4, struct.pack("<I", alignment))] if alignment else [])
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vtype, value in kv:
        out += s(key) + struct.pack("<I", vtype) + value
    for name, dims, tid, offset in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", tid, offset)
    align = alignment or 32
    if pad:
        out += b"\0" * (-len(out) % align)
    path.write_bytes(out + data)
    return str(path)


BAD_FILES = {
    "not_gguf": (dict(), lambda p: p.write_bytes(b"GGML" + bytes(40)), r"not a GGUF file \(it starts with b'GGML'"),
    "empty": (dict(), lambda p: p.write_bytes(b""), r"truncated: 0 bytes"),
    "version": (dict(version=1), None, r"GGUF version 1; torch_ktmoe reads versions 2, 3"),
    "big_endian": (dict(version=3 << 24), None, r"a big-endian GGUF file"),
    "kv_count_overflow": (dict(), lambda p: p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 62)),
                          r"the metadata count is 4611686018427387904: more than the 0 bytes left could hold"),
    "tensor_count_overflow": (dict(), lambda p: p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0) + bytes(8)),
                              r"the tensor count is 1152921504606846976"),
    "string_past_end": (dict(kv=[("k", 8, struct.pack("<Q", 1 << 40) + b"x")]),
                        None, r"the length of the value of 'k' is 1099511627776"),
    "array_past_end": (dict(kv=[("a", 9, struct.pack("<IQ", 6, 1 << 50))]), None, r"the length of array 'a'"),
    "bad_value_type": (dict(kv=[("k", 13, b"")]), None, r"metadata 'k': value type 13 is not a GGUF type"),
    "not_utf8": (dict(kv=[("k", 8, struct.pack("<Q", 2) + b"\xff\xfe")]), None, r"the value of 'k' .* is not UTF-8"),
    "duplicate_key": (dict(kv=[("k", 4, struct.pack("<I", 1)), ("k", 4, struct.pack("<I", 2))]), None,
                      r"metadata key 'k' appears twice"),
    "alignment": (dict(kv=[("general.alignment", 4, struct.pack("<I", 48))], pad=False), None,
                  r"general.alignment is 48, not a power of two"),
    "unknown_type": (dict(tensors=[("w", [32, 2], 99, 0)], data=bytes(64)), None,
                     r"tensor 'w' has type id 99, which ggml does not define"),
    "partial_block": (dict(tensors=[("w", [100, 2], int(Q.Q4_K), 0)], data=bytes(600)), None,
                      r"tensor 'w' \(q4_K\) has rows of 100 weights, not whole blocks of 256"),
    "past_end": (dict(tensors=[("w", [256, 4], int(Q.Q4_K), 0)], data=bytes(144 * 3)), None,
                 r"tensor 'w' \(q4_K, 576 bytes at offset \d+\) runs past the end of the file"),
    "offset_past_end": (dict(tensors=[("w", [32], int(Q.Q8_0), 1 << 40)], data=bytes(34)), None,
                        r"runs past the end of the file"),
    "misaligned": (dict(tensors=[("w", [32], int(Q.Q8_0), 8)], data=bytes(64)), None,
                   r"tensor 'w' starts at data offset 8, not a multiple of the alignment 32"),
    "overlap": (dict(tensors=[("a", [64], int(Q.F32), 0), ("b", [64], int(Q.F32), 128)], data=bytes(512)), None,
                r"tensors 'a' and 'b' overlap"),
    "too_many_dims": (dict(tensors=[("w", [1, 1, 1, 1, 1], int(Q.F32), 0)], data=bytes(32)), None,
                      r"tensor 'w' has 5 dimensions"),
    "huge_dims": (dict(tensors=[("w", [1 << 40, 1 << 40], int(Q.F32), 0)], data=bytes(32)), None,
                  r"has dimensions \[1099511627776, 1099511627776\]: empty or too large"),
    "zero_dim": (dict(tensors=[("w", [0, 4], int(Q.F32), 0)], data=bytes(32)), None, r"empty or too large"),
    "duplicate_tensor": (dict(tensors=[("w", [8], int(Q.F32), 0), ("w", [8], int(Q.F32), 32)], data=bytes(64)), None,
                         r"tensor 'w' appears twice"),
    "truncated_header": (dict(), lambda p: p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 4)
                                                         + b"abcd" + bytes(7)), r"truncated"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_refused_by_name(tmp_path, case):
    kwargs, writer, message = BAD_FILES[case]
    path = tmp_path / f"{case}.gguf"
    if writer:
        writer(path)
    else:
        write_raw(path, **kwargs)
    with pytest.raises(GGUFError, match=message) as info:
        read_gguf(path)
    assert str(path) in str(info.value)


def test_truncated_real_file_is_refused(tmp_path):
    path = write_moe_gguf(tmp_path / "m.gguf", layers=1)
    data = open(path, "rb").read()
    for cut in (len(data) - 1, len(data) // 2, 100, 30):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="truncated"):
            read_gguf(tmp_path / "cut.gguf")


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "f.gguf")
    with pytest.raises(ValueError, match="is not a regular file"):
        read_gguf(tmp_path / "f.gguf")


def test_expert_shape_disagreements(tmp_path):
    def tensors(down_dims):
        return [("blk.0.ffn_gate_exps.weight", [32, 8, 2], int(Q.F32), 0),
                ("blk.0.ffn_up_exps.weight", [32, 8, 2], int(Q.F32), 2048),
                ("blk.0.ffn_down_exps.weight", down_dims, int(Q.F32), 4096)]
    path = write_raw(tmp_path / "a.gguf", tensors=tensors([32, 8, 2]), data=bytes(6144))
    with pytest.raises(GGUFError, match=r"ffn_down_exps.weight has shape \[2, 8, 32\], expected \[2, 32, 8\]"):
        expert_layers(open_gguf(path))
    path = write_raw(tmp_path / "b.gguf", tensors=tensors([8, 32, 2])[:2], data=bytes(6144))
    with pytest.raises(GGUFError, match=r"layer 0 has ffn_gate/up_exps but no ffn_down_exps.weight"):
        expert_layers(open_gguf(path))
    path = write_raw(tmp_path / "c.gguf", tensors=[(n, d[:2], t, o) for n, d, t, o in tensors([8, 32, 2])],
                     data=bytes(6144))
    with pytest.raises(GGUFError, match=r"has shape \[8, 32\]; expert tensors are 3-D"):
        expert_layers(open_gguf(path))
