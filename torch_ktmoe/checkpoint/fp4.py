"""DeepSeek-V4's FP4 experts (``quantization_config.expert_dtype = "fp4"``): MXFP4, one tensor per expert.

Per expert, ``<prefix>.<e>.w1.weight`` (gate) / ``w3`` (up) / ``w2`` (down), or the ``{gate,up,down}_proj``
names of :data:`~torch_ktmoe.checkpoint.dense.PER_EXPERT_LAYOUTS`: int8 (or uint8) ``[n, k / 2]``, two e2m1
codes per byte along k, the low nibble first; beside it its scale (``scale`` in DeepSeek-V4's release,
``weight_scale_inv`` as transformers names it) ``[n, k / 32]``: one UE8M0 power of two per (row, 32 inputs),
float8_e8m0fnu (``scale_fmt="ue8m0"``), uint8 exponent bytes, or fp32 powers of two. This is the layout of
transformers 5.25's ``FP8Experts`` with ``expert_dtype="fp4"`` (``weight_k_div=2``, ``sf_gran_k=32``) and of its
``Fp8Dequantize._unpack_fp4``: ``w = e2m1(q) * scale``, i.e. MXFP4 -- the numbers gpt-oss's ``_blocks`` /
``_scales`` hold (:mod:`.mxfp4`). The weights may also be safetensors' ``F4`` (torch's ``float4_e2m1fn_x2``):
the same bytes, two e2m1 codes each, the low nibble first (as transformers' ``_unpack_fp4`` reads them), whose
header shape counts codes, ``[n, k]``.

:class:`Fp4Experts` reads them exactly (``mxfp4_experts``: codes and scale bytes for ``weight_format="mxfp4"``)
or dequantized to fp32 (``experts``), one expert at a time.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

import torch

from .dense import per_expert_probe_keys, per_expert_suffixes
from .fp8 import weight_scale_key
from .fused_layout import CONCATENATED, FusedLayout
from .mxfp4 import E8M0_DTYPES, dequantize_mxfp4, e8m0_bytes, split_nibbles

FP4_DTYPES = ("I8", "U8", "F4")  # safetensors' names of the packed e2m1 bytes (F4: its shape counts codes)
FP4_SCALE_DTYPES = (*E8M0_DTYPES, "F32")


def header_shape(ckpt, key: str, n: int, k: int) -> list[int]:
    """The safetensors header shape of an FP4 weight [n, k]: ``[n, k]`` for ``F4`` (it counts codes), else
    ``[n, k / 2]`` (bytes)."""
    return [n, k] if ckpt.dtype(key) == "F4" else [n, k // 2]


def packed_bytes(ckpt, key: str) -> torch.Tensor:
    """The packed e2m1 bytes of ``key`` as uint8 [n, k / 2]; ValueError naming it where safetensors cannot load
    an ``F4`` tensor into torch (an older safetensors or torch)."""
    try:
        return ckpt.get(key).view(torch.uint8)
    except Exception as err:  # safetensors' own error type differs by version
        if ckpt.dtype(key) != "F4":
            raise
        raise ValueError(f"{key}: dtype F4 (float4_e2m1fn_x2) in {ckpt.path}, which this safetensors / torch "
                         f"{torch.__version__} cannot load ({err}); a newer safetensors reads it") from err


class Fp4Experts:
    """Per-expert packed e2m1 weights with their UE8M0 scales (see the module docstring). Each expert's tensors
    are checked (dtype, shape, scale present, scale dtype and shape) before it is read."""

    @staticmethod
    def probe_keys(prefix: str) -> list[str]:
        return per_expert_probe_keys(prefix, "scale")

    @classmethod
    def find(cls, ckpt, prefix: str, hidden_size: int, intermediate_size: int, num_experts: Optional[int] = None,
             layout: FusedLayout = CONCATENATED) -> Optional["Fp4Experts"]:
        suffixes = per_expert_suffixes(ckpt, prefix, FP4_DTYPES)
        # two codes a byte: a gate weight [I, H/2] (F4's header counts codes: [I, H]); int8 weights [I, H] are
        # another encoding (refused by dtype later)
        if suffixes is None or ckpt.shape(f"{prefix}.0.{suffixes[0]}") != header_shape(ckpt, f"{prefix}.0.{suffixes[0]}",
                                                                                        intermediate_size, hidden_size):
            return None
        return cls(ckpt, prefix, suffixes, hidden_size, intermediate_size)

    def __init__(self, ckpt, prefix: str, suffixes: tuple[str, str, str], hidden_size: int, intermediate_size: int):
        H, I = hidden_size, intermediate_size
        self.ckpt, self.prefix, self.suffixes = ckpt, prefix, suffixes
        self.shapes = ((I, H), (I, H), (H, I))
        if H % 32 or I % 32:
            raise ValueError(f"{prefix}.0.{suffixes[0]}: FP4 (MXFP4) experts need hidden and intermediate sizes that "
                             f"are multiples of 32 (one scale per 32 inputs), got {H} and {I}")

    def _read(self, e: int, name: str, shape) -> tuple[torch.Tensor, torch.Tensor]:
        """``<prefix>.<e>.<name>``, a [n, k] weight: (blocks [n, k/32, 16] uint8, scale bytes [n, k/32] uint8)."""
        key, (n, k) = f"{self.prefix}.{e}.{name}", shape
        if key not in self.ckpt:
            raise KeyError(f"{key} is missing in {self.ckpt.path}")
        if self.ckpt.dtype(key) not in FP4_DTYPES:
            raise ValueError(f"{key}: dtype {self.ckpt.dtype(key)} in {self.ckpt.path}, but the other experts of this "
                             f"block are FP4 ({'/'.join(FP4_DTYPES)}, two e2m1 codes per byte); a block must be one "
                             "format")
        self.ckpt.expect_shape(key, header_shape(self.ckpt, key, n, k))
        scale_key = weight_scale_key(self.ckpt, key, "FP4 (packed e2m1)", FP4_SCALE_DTYPES)
        self.ckpt.expect_shape(scale_key, (n, k // 32))
        blocks = packed_bytes(self.ckpt, key).reshape(n, k // 32, 16)
        return blocks, e8m0_bytes(self.ckpt.get(scale_key), scale_key)

    def _decoded(self, ids: Iterable[int], decode) -> Iterator[tuple]:
        """Per id, ``decode(blocks, scale_bytes)`` of its gate, up and down."""
        for e in ids:
            yield tuple(decode(*self._read(e, s, shape)) for s, shape in zip(self.suffixes, self.shapes))

    def mxfp4_experts(self, ids: Iterable[int], group: int = 32) -> Iterator[tuple[torch.Tensor, ...]]:
        """Per id, the e2m1 codes ``(gate_up [2I, H], down [H, I])`` (uint8, one per byte) and their E8M0
        scale bytes ``(gate_up_scale [2I, H/32], down_scale [H, I/32])``, exactly; ``group`` must be 32."""
        if group != 32:
            raise ValueError(f"FP4 (MXFP4) checkpoints have one scale per 32 inputs, not per {group}")
        for (gate, gs), (up, us), (down, ds) in self._decoded(ids, lambda b, s: (split_nibbles(b), s)):
            yield torch.cat([gate, up]), down, torch.cat([gs, us]), ds

    def experts(self, ids: Iterable[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Per id, ``(gate_up [2I, H], down [H, I])`` dequantized to fp32 (exact), one expert at a time."""
        for gate, up, down in self._decoded(ids, dequantize_mxfp4):
            yield torch.cat([gate, up]), down
