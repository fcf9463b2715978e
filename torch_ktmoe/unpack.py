"""Packed experts back to dense tensors (what ``save_pretrained`` of a patched model writes).

Decodes the byte layout of ``csrc/kernels/packed_format.h`` with plain torch ops, driven
by the native format table (``_C.weight_formats()``: each row's code bits, code values and
scale layout), so a format is decoded without a case of its own here. ``bf16`` gives back
the packed bf16 values exactly; ``int8`` / ``int4`` / ``fp8`` / ``int4_affine`` / ``mxfp4`` give the
dequantized weights (``s * (u - 128)``, ``d * L[q]``, ``s * e4m3(q)``, ``s * q - s * z``,
``2^(e - 127) * e2m1(q)``), which is what the kernels multiply, not the original dense weights.
"""
from typing import List, Tuple

import numpy as np
import torch

from ._native import _C

_FORMATS = {row["id"]: row for row in _C.weight_formats()}
FORMAT_ROWS = {row["name"]: row for row in _FORMATS.values()}
_ROLE_GATE_UP = _C.matrix_roles["gate_up"]
# e2m1 codes 0..15 (csrc/kernels/mxfp4_format.h): 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def packed_header(w: torch.Tensor) -> dict:
    """The 64-byte header of expert 0 of a packed [E, bytes] tensor, as a dict."""
    raw = w[0, :64].contiguous().numpy().tobytes()
    magic, version, fmt, role = np.frombuffer(raw[:8], dtype=np.dtype("<u4,<u2,u1,u1"))[0]
    n, k, np_, kp, group, _ = np.frombuffer(raw[8:32], dtype="<i4")
    data_off, scale_off, total = np.frombuffer(raw[32:56], dtype="<i8")
    if magic != _C.packed_magic:
        raise ValueError("not packed expert data (bad header magic)")
    if version != _C.packed_layout_version:
        raise ValueError(f"packed expert data of layout version {version}; "
                         f"this build reads {_C.packed_layout_version}")
    if int(fmt) not in _FORMATS:
        raise ValueError(f"packed expert data of format id {int(fmt)}, which this build does not know")
    return dict(version=int(version), format=_FORMATS[int(fmt)]["name"], role=int(role), n=int(n), k=int(k),
                np=int(np_), kp=int(kp), group=int(group), data_offset=int(data_off),
                scale_offset=int(scale_off), total_bytes=int(total))


def _bf16_from_u8(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.int16).view(torch.bfloat16)


def _codes(w: torch.Tensor, h: dict, bits: int) -> torch.Tensor:
    """[E, bytes] -> the stored codes [E, np, kp] (int16 for 16 bits, else uint8), packed row order.

    Per block of 16 columns: kp / run slots, each 16 columns x ``run`` consecutive k (the row's
    ``k_run``) of ``run * bits / 8`` bytes. 16 bits: int16 (k % 2); 8 bits: bytes (k % run);
    4 bits (run 8): low nibbles of the 4 bytes are k 0..3 of the slot, high nibbles k 4..7.
    """
    E, np_, kp, d0 = w.shape[0], h["np"], h["kp"], h["data_offset"]
    run = FORMAT_ROWS[h["format"]]["k_run"]
    raw = w[:, d0:d0 + np_ * kp * bits // 8].reshape(E, np_ // 16, kp // run, 16, run * bits // 8)
    if bits == 16:
        c = raw.contiguous().view(torch.int16)  # [E, nb, slots, 16, 2]
    elif bits == 8:
        c = raw
    elif bits == 4:
        c = torch.stack([raw & 0xF, raw >> 4], dim=-2).flatten(-2)  # [E, nb, slots, 16, 8]
    else:
        raise ValueError(f"unpack: {bits}-bit codes are not decoded here")
    return c.permute(0, 1, 3, 2, 4).reshape(E, np_, kp)


def _scales(w: torch.Tensor, h: dict, row: dict) -> torch.Tensor:
    """[E, bytes] -> the scale of every (packed row, group) [E, np, kp / group], fp32."""
    E, np_, s0 = w.shape[0], h["np"], h["scale_offset"]
    ng = h["kp"] // h["group"]
    if row["scales"] == "f32_per_row":
        return w[:, s0:s0 + np_ * 4].contiguous().view(torch.float32).reshape(E, np_, 1)
    if row["scales"] in ("bf16_per_block_group", "f32_per_block_group"):  # per (block, group): 16, one per column
        raw = w[:, s0:s0 + np_ * ng * row["scale_bytes"]].contiguous()
        sc = (_bf16_from_u8(raw) if row["scale_bytes"] == 2 else raw.view(torch.float32)).float()
        return sc.reshape(E, np_ // 16, ng, 16).permute(0, 1, 3, 2).reshape(E, np_, ng)
    if row["scales"] == "e8m0_per_block_group":  # per (block, group): 16 E8M0 bytes e, s = 2^(e - 127)
        e = w[:, s0:s0 + np_ * ng].reshape(E, np_ // 16, ng, 16).permute(0, 1, 3, 2).reshape(E, np_, ng)
        return e8m0_values(e)
    if row["scales"] == "f32_u8_zero_per_block_group":  # per (block, group): 16 fp32 s, then 16 u8 z
        return _affine_records(w, h)[0]
    raise ValueError(f"unpack: scale layout {row['scales']!r} is not decoded here")


def e8m0_values(e: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> 2^(e - 127) fp32, exactly (by the bits: e << 23; e = 0 is the subnormal 2^-127)."""
    e = e.to(torch.int32)
    return torch.where(e == 0, 0x00400000, e << 23).view(torch.float32)


def _affine_records(w: torch.Tensor, h: dict) -> Tuple[torch.Tensor, torch.Tensor]:
    """int4_affine's 80-byte (block, group) records -> (s fp32, z fp32), each [E, np, kp / group]."""
    E, nb, ng, s0 = w.shape[0], h["np"] // 16, h["kp"] // h["group"], h["scale_offset"]
    raw = w[:, s0:s0 + nb * ng * 80].reshape(E, nb, ng, 80)
    s = raw[..., :64].contiguous().view(torch.float32)
    z = raw[..., 64:].float()

    def by_row(t):  # [E, nb, ng, 16] -> [E, np, ng]
        return t.permute(0, 1, 3, 2).reshape(E, nb * 16, ng)
    return by_row(s), by_row(z)


def _decode(w: torch.Tensor, h: dict) -> torch.Tensor:
    """[E, bytes] -> padded dense [E, np, kp] (bf16 for bf16 codes, fp32 otherwise), packed row order."""
    row = FORMAT_ROWS[h["format"]]
    codes = _codes(w, h, row["code_bits"])
    if row["codes"] == "bf16":
        return codes.view(torch.bfloat16)
    if row["codes"] == "offset":
        values = codes.float() - row["code_offset"]
    elif row["codes"] == "codebook":
        values = torch.tensor(row["codebook"], dtype=torch.float32)[codes.long()]
    elif row["codes"] == "e2m1":
        values = torch.tensor(_E2M1, dtype=torch.float32)[codes.long()]
    elif row["codes"] == "e4m3":
        values = codes.contiguous().view(torch.float8_e4m3fn).float()
    elif row["codes"] == "affine":  # w = s * q + o, o = -(s * z), in fp32 (exact for bf16 / fp16 s)
        s, z = _affine_records(w, h)
        E, np_, kp = codes.shape
        q = codes.float().reshape(E, np_, s.shape[-1], -1)
        return (q * s[..., None] + (-(s * z))[..., None]).reshape(E, np_, kp)
    else:
        raise ValueError(f"unpack: codes {row['codes']!r} are not decoded here")
    E, np_, kp = values.shape
    s = _scales(w, h, row)
    return (values.reshape(E, np_, s.shape[-1], -1) * s[..., None]).reshape(E, np_, kp)


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

    bf16 comes back as bf16 (exact), int8 / int4 / fp8 / int4_affine / mxfp4 as fp32 (dequantized).
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
