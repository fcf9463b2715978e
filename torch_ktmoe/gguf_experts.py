"""One layer's routed experts as a GGUF file holds them: GGML blocks used where they lie, run by
``torch.ops.ktmoe.moe_forward_ggml``.

A :class:`GGUFExperts` holds three uint8 tensors, gate [E, I, gate row bytes], up [E, I, up row bytes] and
down [E, H, down row bytes], each a GGUF tensor's rows (usually mapped from the file:
:meth:`torch_ktmoe.checkpoint.gguf.GGUFModel.rows`, so the experts are the file's page cache and nothing is
copied), and their GGML type ids, each role its own. :meth:`torch_ktmoe.KTMoE.load_gguf` takes one. The
blocks are immutable: a copy of the layer shares them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from . import ops

ROLES = ("gate", "up", "down")
_libc = None


def _willneed(address: int, length: int) -> None:
    """madvise(MADV_WILLNEED) over the pages holding [address, address + length); errors are ignored (advice)."""
    global _libc
    import ctypes
    import mmap

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = address & ~(mmap.PAGESIZE - 1)
    _libc.madvise(start, address + length - start, mmap.MADV_WILLNEED)


@dataclass(frozen=True, eq=False)
class GGUFExperts:
    gate: torch.Tensor  # uint8 [E, I, row bytes]
    up: torch.Tensor    # uint8 [E, I, row bytes]
    down: torch.Tensor  # uint8 [E, H, row bytes]
    ggml_types: Tuple[int, int, int]  # gate, up, down
    source: str = ""    # where the blocks lie (a file name), for messages and repr
    mapped: bool = False  # the tensors map a file (its page cache), not anonymous memory
    fits: bool = True     # the model's mapped experts fit in memory together (KTMoE's prefetch="auto" reads
                          # the routed experts ahead when they do not)

    @classmethod
    def of(cls, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, ggml_types: Sequence[int],
           source: str = "", *, mapped: bool = False, fits: bool = True, shape: Optional[Tuple[int, int, int]] = None,
           where: str = "GGUFExperts"):
        """Checked: ``ggml_types`` three decodable type ids (:data:`torch_ktmoe.ops.GGML_TYPES`), each tensor
        uint8 3-D with rows of whole blocks, gate and up [E, I, .], down [E, H, .] holding I weights a row;
        ``shape`` (E, H, I), when given, must agree. ValueError naming what is wrong."""
        types = tuple(int(t) for t in ggml_types)
        if len(types) != 3:
            raise ValueError(f"{where}: ggml_types must be the (gate, up, down) type ids, got {ggml_types!r}")
        cols = {}
        for role, t, type_id in zip(ROLES, (gate, up, down), types):
            row = ops.GGML_TYPES.get(type_id)
            if row is None or not row["decodable"]:
                name = row["name"] if row else f"id {type_id}"
                raise ValueError(f"{where}: {role} is GGML type {name}, which torch_ktmoe does not read; it reads "
                                 + ", ".join(r["name"] for r in ops.GGML_TYPES.values() if r["decodable"]))
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 3:
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{where}: {role} must be a uint8 tensor [E, rows, row bytes], got {got}")
            if t.shape[2] % row["block_bytes"]:
                raise ValueError(f"{where}: {role}'s rows of {t.shape[2]} bytes are not whole {row['name']} blocks "
                                 f"of {row['block_bytes']} bytes")
            cols[role] = t.shape[2] // row["block_bytes"] * row["block_elems"]
        E, inter, H = gate.shape[0], gate.shape[1], cols["gate"]
        want = {"gate": (E, inter, H), "up": (E, inter, H), "down": (E, H, inter)}
        for role, t in zip(ROLES, (gate, up, down)):
            got = (t.shape[0], t.shape[1], cols[role])
            if got != want[role]:
                raise ValueError(f"{where}: {role} holds [E, rows, weights a row] = {list(got)}, expected "
                                 f"{list(want[role])} from gate's {list(want['gate'])}")
        if shape is not None and (E, H, inter) != tuple(shape):
            raise ValueError(f"{where}: the GGUF experts have (E, H, I) = {(E, H, inter)}, the layer {tuple(shape)}")
        return cls(gate, up, down, types, source, mapped, fits)

    @property
    def shape(self) -> Tuple[int, int, int]:
        """(E, H, I)."""
        return self.gate.shape[0], self.down.shape[1], self.gate.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in (self.gate, self.up, self.down))

    @property
    def type_names(self) -> Tuple[str, str, str]:
        return tuple(ops.GGML_TYPES[t]["name"] for t in self.ggml_types)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, b13: Optional[torch.Tensor],
                b2: Optional[torch.Tensor], activation: str, params, prefetch: bool = False) -> torch.Tensor:
        """x [T, H], ids / weights [T, k] -> [T, H] (ops.moe_forward_ggml; ``prefetch``: MADV_WILLNEED over the
        routed experts' rows first)."""
        return torch.ops.ktmoe.moe_forward_ggml(x, ids, weights, self.gate, self.up, self.down, list(self.ggml_types),
                                                b13, b2, activation, params, prefetch)

    def advise(self, experts: torch.Tensor) -> None:
        """``MADV_WILLNEED`` over the listed experts' gate, up and down rows when the blocks map a file (the kernel
        queues their reads and returns; the next-layer prefetch of a GGUF layer, :mod:`torch_ktmoe.residency.predictor`).
        ``experts``: distinct ids in [0, E). Nothing for blocks in anonymous memory."""
        if not self.mapped:
            return
        ids = experts.tolist()
        for t in (self.gate, self.up, self.down):
            base, per = t.data_ptr(), t.stride(0)
            for e in ids:
                _willneed(base + e * per, per)

    def dense(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [E, 2I, H], down [E, H, I]) fp32: the types' exact values (ops.ggml_dequantize)."""
        gate, up, down = (ops.ggml_dequantize(t, ty) for t, ty in zip((self.gate, self.up, self.down),
                                                                       self.ggml_types))
        return torch.cat([gate, up], 1), down

    def __deepcopy__(self, memo):
        return self  # immutable blocks: a copy shares them

    def __repr__(self) -> str:
        E, H, inter = self.shape
        where = f" in {self.source}" if self.source else ""
        return (f"GGUFExperts(E={E}, H={H}, I={inter}, types={'/'.join(self.type_names)}, "
                f"{self.nbytes / 2**20:.1f} MiB{where})")
