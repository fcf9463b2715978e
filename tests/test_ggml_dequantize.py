"""ktmoe::ggml_dequantize and the GGML type table: every type torch_ktmoe reads decodes bit for bit as the `gguf`
package's gguf.quants.dequantize (an implementation we did not write), over random blocks with the scale edges real
files hold (fp16 subnormals, zero, +-65504, every E8M0 byte), Inf and NaN scales too; the table's block sizes are
ggml's."""
import numpy as np
import pytest
import torch

import gguf
from gguf import GGMLQuantizationType as Q

from ktmoe_harness.ggml_rows import put_f16
from tests.helpers.gguf_files import F16_FIELDS, random_rows
from torch_ktmoe import ops

DECODABLE = sorted(tid for tid, row in ops.GGML_TYPES.items() if row["decodable"])
# fp16 bit patterns every scale field takes in the first blocks: +-0, the smallest and largest subnormals,
# the smallest normal, 1, +-65504.
F16_EDGES = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF], dtype=np.uint16)


def random_blocks(qtype, rows, blocks_per_row, seed=0):
    """uint8 [rows, blocks_per_row * block_bytes]: random blocks, finite fp16 scales, the edges first; mxfp4's
    first blocks (up to 256) take every E8M0 byte (0xFF included: ggml reads it as 2^127, no NaN)."""
    data = random_rows(qtype, (rows, blocks_per_row * gguf.GGML_QUANT_SIZES[qtype][0]), seed, F16_EDGES)
    if qtype == Q.MXFP4:
        e = data.reshape(-1, 17)[:256, 0]
        e[:] = np.arange(len(e))
    return data


def assert_same_bits(ours: torch.Tensor, ref: np.ndarray):
    ref = torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32))
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(ours), nan)
    diff = (ours.view(torch.int32) != ref.view(torch.int32)) & ~nan
    assert not diff.any(), (f"{int(diff.sum())} weights differ, first at {diff.nonzero()[0].tolist()}: "
                            f"{ours[diff][0].item()} != {ref[diff][0].item()}")


def test_table_is_ggmls():
    for tid, row in ops.GGML_TYPES.items():
        qtype = Q(tid)
        assert (row["block_elems"], row["block_bytes"]) == gguf.GGML_QUANT_SIZES[qtype], qtype.name
        assert row["name"].lower() == qtype.name.lower()
    assert {Q(t) for t in DECODABLE} >= {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K,
                                         Q.Q3_K, Q.IQ4_XS, Q.IQ4_NL, Q.MXFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S,
                                         Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M}


@pytest.mark.parametrize("tid", DECODABLE, ids=lambda t: ops.GGML_TYPES[t]["name"])
def test_decodes_as_gguf(tid):
    qtype = Q(tid)
    elems = gguf.GGML_QUANT_SIZES[qtype][0]
    blocks_per_row = max(1, 768 // elems) if elems > 1 else 1024
    data = random_blocks(qtype, 300, blocks_per_row)
    with np.errstate(over="ignore"):  # mxfp4's largest scales times its largest levels are inf, in ggml too
        ref = gguf.quants.dequantize(data, qtype)
    assert_same_bits(ops.ggml_dequantize(torch.from_numpy(data), tid), ref)


@pytest.mark.parametrize("tid", [t for t in DECODABLE if F16_FIELDS.get(Q(t))], ids=lambda t: ops.GGML_TYPES[t]["name"])
def test_non_finite_scales_are_kept(tid):
    """A scale of Inf or NaN (a corrupt file) is not hidden: the weights are what gguf makes of it, Inf / NaN."""
    qtype = Q(tid)
    data = random_blocks(qtype, 4, 2)
    nbytes = gguf.GGML_QUANT_SIZES[qtype][1]
    put_f16(data.reshape(-1, nbytes)[:2], qtype, F16_FIELDS[qtype][0], np.array([0x7C00, 0x7E00], dtype=np.uint16))
    ours = ops.ggml_dequantize(torch.from_numpy(data), tid)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = gguf.quants.dequantize(data, qtype)
    assert_same_bits(ours, ref)
    assert not torch.isfinite(ours.reshape(-1)[:2 * gguf.GGML_QUANT_SIZES[qtype][0]]).all()


def test_shapes_and_offsets():
    """Leading dimensions are kept; a view that starts at an odd byte (a 17-byte mxfp4 block) decodes the same."""
    data = random_blocks(Q.MXFP4, 6, 4)
    t = torch.from_numpy(data)
    ours = ops.ggml_dequantize(t.reshape(2, 3, -1), int(Q.MXFP4))
    assert ours.shape == (2, 3, 128)
    flat = torch.cat([torch.zeros(1, dtype=torch.uint8), t.reshape(-1)])[1:].reshape(6, -1)
    assert flat.data_ptr() % 2 == 1
    assert torch.equal(ops.ggml_dequantize(flat, int(Q.MXFP4)), ours.reshape(6, -1))
    assert ops.ggml_dequantize(torch.empty(0, 0, dtype=torch.uint8), int(Q.Q4_K)).shape == (0, 0)


def test_bad_input_is_named():
    blocks = torch.zeros(2, 144, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="GGML type id 1000 is not one ggml defines"):
        ops.ggml_dequantize(blocks, 1000)
    with pytest.raises(RuntimeError, match=r"tq1_0 \(id 34\) is not read by torch_ktmoe; it reads f32, f16"):
        ops.ggml_dequantize(blocks, int(Q.TQ1_0))
    with pytest.raises(RuntimeError, match="a row of 143 bytes is not whole q4_K blocks"):
        ops.ggml_dequantize(blocks[:, :143], int(Q.Q4_K))
    with pytest.raises(RuntimeError, match="blocks must be a uint8 CPU tensor"):
        ops.ggml_dequantize(blocks.float(), int(Q.Q4_K))


def test_opcheck():
    data = torch.from_numpy(random_blocks(Q.Q4_K, 3, 2))
    torch.library.opcheck(torch.ops.ktmoe.ggml_dequantize.default, (data, int(Q.Q4_K)))


def test_compiles():
    data = torch.from_numpy(random_blocks(Q.Q6_K, 3, 2))
    fn = torch.compile(lambda b: ops.ggml_dequantize(b, int(Q.Q6_K)) * 2, fullgraph=True)
    assert torch.equal(fn(data), ops.ggml_dequantize(data, int(Q.Q6_K)) * 2)
