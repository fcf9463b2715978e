"""Packed experts back to dense tensors (what ``save_pretrained`` of a patched model writes).

Decodes the byte layout of ``csrc/kernels/packed_format.h`` with plain torch ops:
``bf16`` gives back the packed bf16 values exactly; ``int8`` / ``int4`` give the
dequantized weights (``s * (u - 128)``, ``d * L[q]``), which is what the kernels
multiply, not the original dense weights.
"""
from typing import List, Tuple

import numpy as np
import torch

from .reference import INT4_LEVELS

_FORMATS = {0: "bf16", 1: "int8", 2: "int4"}
_ROLE_GATE_UP, _ROLE_DOWN = 1, 2
_MAGIC = 0x574D544B
_VERSION = 3  # kPackedVersion of csrc/kernels/packed_format.h


def packed_header(w: torch.Tensor) -> dict:
    """The 64-byte header of expert 0 of a packed [E, bytes] tensor, as a dict."""
    raw = w[0, :64].contiguous().numpy().tobytes()
    magic, version, fmt, role = np.frombuffer(raw[:8], dtype=np.dtype("<u4,<u2,u1,u1"))[0]
    n, k, np_, kp, group, _ = np.frombuffer(raw[8:32], dtype="<i4")
    data_off, scale_off, total = np.frombuffer(raw[32:56], dtype="<i8")
    if magic != _MAGIC:
        raise ValueError("not packed expert data (bad header magic)")
    if version != _VERSION:
        raise ValueError(f"packed expert data of layout version {version}; this build reads {_VERSION}")
    return dict(version=int(version), format=_FORMATS[int(fmt)], role=int(role), n=int(n), k=int(k),
                np=int(np_), kp=int(kp), group=int(group), data_offset=int(data_off),
                scale_offset=int(scale_off), total_bytes=int(total))


def _bf16_from_u8(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.int16).view(torch.bfloat16)


def _decode(w: torch.Tensor, h: dict) -> torch.Tensor:
    """[E, bytes] -> padded dense [E, np, kp] (bf16 for bf16, fp32 otherwise), packed row order."""
    E, np_, kp = w.shape[0], h["np"], h["kp"]
    nb = np_ // 16
    d0 = h["data_offset"]
    if h["format"] == "bf16":  # per block: kp/2 pairs x 16 columns x 2 bf16
        data = _bf16_from_u8(w[:, d0:d0 + nb * kp * 32]).reshape(E, nb, kp // 2, 16, 2)
        return data.permute(0, 1, 3, 2, 4).reshape(E, np_, kp)
    s0 = h["scale_offset"]
    if h["format"] == "int8":  # per block: kp/4 quads x 16 columns x 4 u8; scales fp32 [np]
        u = w[:, d0:d0 + nb * kp * 16].reshape(E, nb, kp // 4, 16, 4).permute(0, 1, 3, 2, 4)
        q = u.reshape(E, np_, kp).float() - 128.0
        s = w[:, s0:s0 + np_ * 4].contiguous().view(torch.float32)
        return q * s[:, :, None]
    # int4: per block kp/8 octets x 16 columns x 4 bytes, low nibble k = 8j + k%4, high k = 8j + 4 + k%4,
    # each an index into the codebook; scales per (block, group): 16 bf16 d
    g = h["group"]
    ng = kp // g
    b = w[:, d0:d0 + nb * kp * 8].reshape(E, nb, kp // 8, 16, 4)
    q = torch.stack([b & 0xF, b >> 4], dim=-2)  # [E, nb, kp/8, 16, 2, 4]
    q = q.permute(0, 1, 3, 2, 4, 5).reshape(E, np_, kp).long()
    levels = torch.tensor(INT4_LEVELS, dtype=torch.float32)[q]
    sc = _bf16_from_u8(w[:, s0:s0 + nb * ng * 32]).reshape(E, nb, ng, 16).float()
    d = sc.permute(0, 1, 3, 2).reshape(E, np_, ng)
    return (levels.reshape(E, np_, ng, g) * d[..., None]).reshape(E, np_, kp)


def unpack_matrix(w: torch.Tensor) -> Tuple[torch.Tensor, dict]:
    """Packed [E, bytes] -> (dense [E, n, k] in logical row order, header)."""
    h = packed_header(w)
    dense = _decode(w, h)
    if h["role"] == _ROLE_GATE_UP:  # packed blocks: gate 0, up 0, gate 1, up 1, ...
        inter, ip = h["n"] // 2, h["np"] // 2
        rows = torch.arange(h["np"]).reshape(ip // 16, 2, 16)
        gate, up = rows[:, 0].reshape(-1)[:inter], rows[:, 1].reshape(-1)[:inter]
        dense = dense[:, torch.cat([gate, up])]
    else:
        dense = dense[:, :h["n"]]
    return dense[:, :, :h["k"]], h


def unpack_experts(parts: List[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """[(w13, w2)] per NUMA part (split along I) -> (gate_up [E, 2I, H], down [E, H, I], format).

    bf16 comes back as bf16 (exact), int8 / int4 as fp32 (dequantized).
    """
    gates, ups, downs, fmt = [], [], [], None
    for w13, w2 in parts:
        gu, h = unpack_matrix(w13)
        dn, _ = unpack_matrix(w2)
        inter = h["n"] // 2
        gates.append(gu[:, :inter])
        ups.append(gu[:, inter:])
        downs.append(dn)
        fmt = h["format"]
    return torch.cat(gates + ups, dim=1), torch.cat(downs, dim=2), fmt
