"""One int4 linear weight of a checkpoint as codes, group scales and zero points; the experts reader over them.

Every int4-group encoding read here (compressed-tensors ``pack-quantized``, GPTQ, AWQ) comes down to

    w[r, c] = s[r, g(c)] * (q[r, c] - z[r, g(c)])

with codes q in [0, 15], a float scale s and an integer zero point z in [0, 16] per (output row, group),
and g(c) = c // group unless the checkpoint has an act-order ``g_idx`` [k] (then g(c) = g_idx[c]).
:class:`Int4Linear` holds one such weight unpacked (one code per byte); the modules of each encoding
(:mod:`.compressed_tensors`, :mod:`.gptq`) turn their tensors into it, checking dtypes and shapes.

:class:`Int4Experts` reads per-expert ``{gate,up,down}_proj`` int4 linears, either exactly
(:meth:`~Int4Experts.int4_experts`: the codes, fp32 scales and zeros per (row, k-group) that the
``int4_affine`` format packs as they are) or dequantized to fp32 (:meth:`~Int4Experts.experts`).

Act-order: a non-trivial ``g_idx`` on ``down_proj`` (k = I) is made trivial by permuting the
intermediate dimension (down's columns and gate / up's rows by the same permutation: ``silu(g) * u``
is elementwise over I, so the layer computes the same function). A non-trivial ``g_idx`` on gate / up
(k = H) would need the hidden state permuted per expert; it is refused by name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch

from .dense import PER_EXPERT_LAYOUTS

SCALE_DTYPES = ("F32", "BF16", "F16")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def unpack_int32_nibbles(packed: torch.Tensor, dim: int, size: int, order=None) -> torch.Tensor:
    """int32 ``packed`` with 8 codes per int32 along ``dim`` -> uint8 codes, ``size`` along ``dim``.
    Nibble i (bits 4i..4i+3) of word j holds element ``8 j + order[i]`` (``order`` None: ``8 j + i``)."""
    t = packed.movedim(dim, -1)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nib = (t.unsqueeze(-1) >> shifts) & 0xF  # [..., words, 8]: nibble i of each word
    if order is not None:
        nib = nib[..., torch.argsort(torch.tensor(order))]  # element j of the word is nibble order^-1[j]
    return nib.flatten(-2)[..., :size].to(torch.uint8).movedim(-1, dim).contiguous()


def expect_scale_dtype(ckpt, key: str) -> None:
    if ckpt.dtype(key) not in SCALE_DTYPES:
        raise ValueError(f"{key}: dtype {ckpt.dtype(key)} in {ckpt.path}, expected a float scale (F32 / BF16 / F16)")


def expect_int32(ckpt, key: str, what: str) -> None:
    if ckpt.dtype(key) != "I32":
        raise ValueError(f"{key}: dtype {ckpt.dtype(key)} in {ckpt.path}, expected I32 ({what}, 8 int4 codes per "
                         "int32)")


def group_of(ckpt, scale_key: str, k: int, groups: int) -> int:
    """The group size of a weight with ``k`` inputs whose scale has ``groups`` groups: k itself for one group,
    else the one the checkpoint's quantization_config names (``ckpt.int4_group_sizes``) with
    ceil(k / group) == groups, or without one the smallest power of two >= 32 that fits; ValueError naming
    ``scale_key`` if none does (a config's group size that does not fit the scales is not guessed around)."""
    if groups == 1:
        return k
    named = ckpt.int4_group_sizes
    if named:
        for g in named:
            if cdiv(k, g) == groups:
                return g
        raise ValueError(f"{scale_key}: {groups} groups over k={k} inputs in {ckpt.path}, but the "
                         f"quantization_config's group_size {', '.join(map(str, named))} gives "
                         f"{', '.join(str(cdiv(k, g)) for g in named)} (ceil(k / group_size))")
    g = 32
    while g < k:
        if cdiv(k, g) == groups:
            return g
        g *= 2
    raise ValueError(f"{scale_key}: {groups} groups over k={k} inputs fit no group size (a power of two >= 32 with "
                     f"ceil(k / group) == {groups}; the directory has no quantization_config naming one) in "
                     f"{ckpt.path}")


def read_g_idx(ckpt, key: str, k: int, groups: int) -> torch.Tensor:
    """An act-order ``g_idx`` [k] (the group of each input), checked to lie in [0, groups)."""
    ckpt.expect_shape(key, (k,))
    if ckpt.dtype(key) not in ("I32", "I64", "I16"):
        raise ValueError(f"{key}: dtype {ckpt.dtype(key)} in {ckpt.path}, expected an integer group index")
    g_idx = ckpt.get(key).long()
    if k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
        raise ValueError(f"{key}: group indices in [{int(g_idx.min())}, {int(g_idx.max())}] in {ckpt.path}, "
                         f"outside the {groups} groups of its scales")
    return g_idx


@dataclass
class Int4Linear:
    """``w[r, c] = scale[r, g(c)] * (codes[r, c] - zero[r, g(c)])`` (see the module docstring).

    codes uint8 [n, k] (0..15); scale fp32 [n, G]; zero int32 [n, G] (0..16) or None for symmetric 8;
    ``g_idx`` int64 [k] or None for g(c) = c // group."""
    key: str  # the checkpoint module, e.g. "model.layers.1.mlp.experts.0.down_proj"
    codes: torch.Tensor
    scale: torch.Tensor
    zero: Optional[torch.Tensor]
    group: int
    g_idx: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.g_idx is not None:
            k = self.codes.shape[1]
            if torch.equal(self.g_idx, torch.arange(k) // self.group):
                self.g_idx = None

    def _columns(self) -> torch.Tensor:
        k = self.codes.shape[1]
        return torch.arange(k) // self.group if self.g_idx is None else self.g_idx

    def dequantize(self) -> torch.Tensor:
        """fp32 [n, k]: every product exact (s has at most 24 significant bits and q - z at most 5 here: s
        from fp16 / bf16 has 11 / 8)."""
        cols = self._columns()
        zero = torch.full_like(self.scale, 8.0) if self.zero is None else self.zero.float()
        return self.scale[:, cols] * (self.codes.float() - zero[:, cols])

    def act_order_permutation(self) -> Optional[torch.Tensor]:
        """None for g(c) = c // group; else the permutation p of the k inputs that makes it so (column
        p[j] goes to j): the stable sort of ``g_idx``, when every group holds ``group`` inputs (ValueError
        otherwise)."""
        if self.g_idx is None:
            return None
        k = self.codes.shape[1]
        perm = torch.sort(self.g_idx, stable=True).indices
        if not torch.equal(self.g_idx[perm], torch.arange(k) // self.group):
            raise ValueError(f"{self.key}: its act-order g_idx does not put {self.group} inputs in each of its "
                             f"{self.scale.shape[1]} groups; it cannot be reordered into consecutive groups")
        return perm

    def permuted_inputs(self, perm: torch.Tensor) -> "Int4Linear":
        """The same linear with its inputs reordered by ``perm`` (its own :meth:`act_order_permutation`)."""
        return Int4Linear(self.key, self.codes[:, perm].contiguous(), self.scale, self.zero, self.group)

    def permuted_rows(self, perm: torch.Tensor) -> "Int4Linear":
        """The same linear with its outputs reordered by ``perm`` (row perm[j] goes to j)."""
        zero = None if self.zero is None else self.zero[perm]
        return Int4Linear(self.key, self.codes[perm], self.scale[perm], zero, self.group, self.g_idx)

    def grouped(self, group: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(codes [n, k], scale fp32 [n, ceil(k/group)], zero int32 [n, ceil(k/group)] or None) for groups of
        ``group`` consecutive inputs, each inside one of the checkpoint's groups (``g_idx`` must be trivial)."""
        if self.g_idx is not None:
            raise ValueError(f"{self.key}: act-order g_idx; reorder its inputs first (act_order_permutation)")
        k = self.codes.shape[1]
        if self.group % group and self.group < k:
            raise ValueError(f"{self.key}: group_size {group} does not divide the checkpoint's group of "
                             f"{self.group} inputs; pick a divisor (e.g. {math.gcd(self.group, group)})")
        cols = torch.arange(cdiv(k, group)) * group // self.group
        zero = None if self.zero is None else self.zero[:, cols].contiguous()
        return self.codes, self.scale[:, cols].contiguous(), zero


PROJECTIONS = ("gate", "up", "down")


class Int4Experts:
    """Per-expert int4 linears under ``<prefix>.<e>.`` with the module names of one of
    :data:`~torch_ktmoe.checkpoint.dense.PER_EXPERT_LAYOUTS` (``gate_proj`` / ``up_proj`` / ``down_proj``,
    Mixtral's ``w1`` / ``w3`` / ``w2``).

    A subclass names its encoding (``ENCODING``), the key that marks it (``MARKER``, e.g. ``"qweight"``) and
    reads one linear (``read_linear(ckpt, module, n, k) -> Int4Linear``, checking every tensor)."""

    ENCODING = ""
    MARKER = ""

    @staticmethod
    def read_linear(ckpt, module: str, n: int, k: int) -> Int4Linear:
        raise NotImplementedError

    @classmethod
    def modules(cls, suffixes) -> tuple[str, str, str]:
        return tuple(s[: -len(".weight")] for s in suffixes)

    @classmethod
    def probe_keys(cls, prefix: str) -> list[str]:
        return [f"{prefix}.0.{cls.modules(s)[0]}.{cls.MARKER}" for s in PER_EXPERT_LAYOUTS]

    @classmethod
    def find(cls, ckpt, prefix: str, hidden_size: int, intermediate_size: int, num_experts: Optional[int] = None,
             layout=None):
        for suffixes in PER_EXPERT_LAYOUTS:
            if f"{prefix}.0.{cls.modules(suffixes)[0]}.{cls.MARKER}" in ckpt:
                return cls(ckpt, prefix, cls.modules(suffixes), hidden_size, intermediate_size)
        return None

    def __init__(self, ckpt, prefix: str, modules: tuple[str, str, str], hidden_size: int, intermediate_size: int):
        H, I = hidden_size, intermediate_size
        self.ckpt, self.prefix, self.names = ckpt, prefix, modules
        self.shapes = ((I, H), (I, H), (H, I))
        first = self._read(0)  # checks expert 0 now; every other expert is checked as it is read
        self.groups = tuple(lin.group for lin in first)
        gate_up_group = math.gcd(self.groups[0], self.groups[1])
        self.group_size = math.gcd(gate_up_group, self.groups[2])  # the default group of int4_experts

    def _read(self, e: int) -> list[Int4Linear]:
        out = []
        for name, (n, k) in zip(self.names, self.shapes):
            module = f"{self.prefix}.{e}.{name}"
            if f"{module}.{self.MARKER}" not in self.ckpt:
                raise self._mixed_error(module)
            out.append(self.read_linear(self.ckpt, module, n, k))
        return out

    def _mixed_error(self, module: str) -> Exception:
        found = self.ckpt.keys_under(module + ".")
        if not found:
            return KeyError(f"{module}: missing in {self.ckpt.path} (expected {module}.{self.MARKER} like the other "
                            f"experts under {self.prefix})")
        return ValueError(f"{module}: holds {found}, but the experts under {self.prefix} are {self.ENCODING} "
                          f"({self.MARKER}); a layer must be one format (mixed-format layer) in {self.ckpt.path}")

    def _aligned(self, e: int) -> list[Int4Linear]:
        """Expert e's (gate, up, down) with trivial group indices: a down_proj act-order permutes the
        intermediate dimension (down's inputs, gate / up's rows); a gate / up act-order is refused."""
        gate, up, down = self._read(e)
        for lin in (gate, up):
            if lin.g_idx is not None:
                raise ValueError(f"{lin.key}: act-order g_idx over the hidden inputs (desc_act); reading it "
                                 "exactly would need the hidden state permuted per expert, which torch_ktmoe does "
                                 "not do (down_proj's act-order is read: it permutes the intermediate dimension)")
        perm = down.act_order_permutation()
        if perm is None:
            return [gate, up, down]
        return [gate.permuted_rows(perm), up.permuted_rows(perm), down.permuted_inputs(perm)]

    def int4_experts(self, ids: Iterable[int], group: Optional[int] = None) -> Iterator[tuple]:
        """Per id, ``(gate_up_codes [2I, H], down_codes [H, I])`` uint8 (0..15), ``(gate_up_scale
        [2I, ceil(H/group)], down_scale [H, ceil(I/group)])`` fp32 and ``(gate_up_zero, down_zero)``
        int32 of the same shapes (0..16), or None for symmetric (z = 8): exact. ``group`` (default
        :attr:`group_size`) must divide the checkpoint's groups."""
        group = group or self.group_size
        for e in ids:
            (gq, gs, gz), (uq, us, uz), (dq, ds, dz) = (lin.grouped(group) for lin in self._aligned(e))
            if (gz is None) != (uz is None):
                raise ValueError(f"{self.prefix}.{e}: gate and up differ in having zero points; a layer must be "
                                 "one format (mixed-format layer)")
            gate_up_zero = None if gz is None else torch.cat([gz, uz])
            if (gate_up_zero is None) != (dz is None):  # the format stores zeros for both or neither
                gate_up_zero = torch.full_like(torch.cat([gs, us]), 8, dtype=torch.int32) \
                    if gate_up_zero is None else gate_up_zero
                dz = torch.full_like(ds, 8, dtype=torch.int32) if dz is None else dz
            yield torch.cat([gq, uq]), dq, torch.cat([gs, us]), ds, gate_up_zero, dz

    def experts(self, ids: Iterable[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Per id, ``(gate_up [2I, H], down [H, I])`` dequantized to fp32 (exactly), one expert at a time."""
        for e in ids:
            gate, up, down = (lin.dequantize() for lin in self._read(e))
            yield torch.cat([gate, up]), down
