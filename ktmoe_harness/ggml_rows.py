"""Random GGML rows (a GGUF tensor's bytes) for tests and benchmarks: random blocks of any GGML type, written
through the `gguf` package's sizes, every fp16 scale finite (or, `sane`, of the size real files hold)."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

import gguf
from gguf import GGMLQuantizationType as Q

# Byte offsets of each block's fp16 scale fields (ggml's block structs); the rest of a block is any bytes. iq1_m's
# one fp16 scale is the top nibbles of its four 16-bit scale words at bytes 48..55 (put_f16).
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.IQ4_NL: (0,),
              Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_XS: (0,),
              Q.MXFP4: (), Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,), Q.IQ3_S: (0,),
              Q.IQ1_S: (0,), Q.IQ1_M: (48,)}


def put_f16(blocks: np.ndarray, qtype, offset: int, bits: np.ndarray) -> None:
    """Set the fp16 scale field at byte `offset` (one of F16_FIELDS[qtype]) of each of `blocks` (uint8 [n, block
    bytes]) to `bits` (uint16 [n])."""
    if qtype == Q.IQ1_M:  # the scale's bits 4w..4w+3 are the top nibble of word w
        words = blocks[:, offset:offset + 8].view(np.uint16)
        words[:] = (words & 0x0FFF) | ((bits[:, None] >> np.array([0, 4, 8, 12], dtype=np.uint16)) & 0xF) << 12
    else:
        blocks[:, offset:offset + 2] = bits.view(np.uint8).reshape(-1, 2)


def finite_f16_bits(rng, n) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    return np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits).astype(np.uint16)  # exponent 31 -> 0


def sane_f16_bits(rng, n) -> np.ndarray:
    """fp16 scales of the size real files hold (weights of order 0.01 to 0.3), positive."""
    return rng.uniform(1e-3, 2e-2, size=n).astype(np.float16).view(np.uint16)


def random_rows(qtype, shape: Sequence[int], seed: int = 0, scale_bits: Optional[np.ndarray] = None,
                sane: bool = False) -> np.ndarray:
    """uint8 [*shape[:-1], row bytes]: rows of shape[-1] weights of `qtype` as random blocks, every fp16 scale finite
    (the first ones `scale_bits` when given; `sane`: of the size real files hold, and mxfp4 exponents too); F32 /
    F16 / BF16 as random finite values (`sane`: ~N(0, 0.05))."""
    rng = np.random.default_rng(seed * 1000 + int(qtype))
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    lead, cols = tuple(shape[:-1]), shape[-1]
    n = int(np.prod(lead, dtype=np.int64)) * (cols // elems)
    if qtype == Q.F32 or (sane and qtype in (Q.F16, Q.BF16)):
        w = rng.standard_normal(n, dtype=np.float32) * 0.05
        if qtype == Q.F16:
            w = w.astype(np.float16)
        elif qtype == Q.BF16:
            w = (w.view(np.uint32) >> 16).astype(np.uint16)
        return w.view(np.uint8).reshape(*lead, -1)
    if qtype in (Q.F16, Q.BF16):
        if qtype == Q.F16:
            bits = finite_f16_bits(rng, n)
        else:
            bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
            bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0x807F, bits).astype(np.uint16)
        if scale_bits is not None:
            bits[:len(scale_bits)] = scale_bits[:n]
        return bits.view(np.uint8).reshape(*lead, -1)
    blocks = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    for offset in F16_FIELDS.get(qtype, ()):  # types not listed: random bytes
        bits = sane_f16_bits(rng, n) if sane else finite_f16_bits(rng, n)
        if scale_bits is not None:
            bits[:len(scale_bits)] = scale_bits[:n]
        put_f16(blocks, qtype, offset, bits)
    if qtype == Q.MXFP4 and sane:
        blocks[:, 0] = rng.integers(119, 124, size=n)  # 2^(e - 128): 2^-9 .. 2^-5, times levels up to 12
    return blocks.reshape(*lead, -1)


# GGUF type mixes of gate, up and down, as the benchmarks name them.
GGUF_MIXES = {
    "gguf-q4_K_M": (Q.Q4_K, Q.Q4_K, Q.Q6_K),
    "gguf-q4_K": (Q.Q4_K, Q.Q4_K, Q.Q4_K),
    "gguf-q6_K": (Q.Q6_K, Q.Q6_K, Q.Q6_K),
    "gguf-q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0),
    "gguf-iq4_xs": (Q.IQ4_XS, Q.IQ4_XS, Q.IQ4_XS),
    "gguf-q2_K": (Q.Q2_K, Q.Q2_K, Q.Q2_K),
    "gguf-q3_K": (Q.Q3_K, Q.Q3_K, Q.Q3_K),
}


def ggml_experts(types, experts: int, hidden: int, inter: int, seed: int = 0):
    """(gate [E, I, row bytes], up, down [E, H, row bytes]) uint8 tensors of random sane blocks of `types`."""
    shapes = ((experts, inter, hidden), (experts, inter, hidden), (experts, hidden, inter))
    return tuple(torch.from_numpy(random_rows(t, shape, seed + i, sane=True)) for i, (t, shape) in
                 enumerate(zip(types, shapes)))
