"""How a fused experts tensor orders its gate, up and down rows, and the views that give KTMoE's order.

KTMoE packs ``gate [I, H]``, ``up [I, H]`` and ``down [H, I]`` per expert (rows are output
features). A fused tensor stacks every expert: ``gate_up [E, 2I, H]`` with all gate rows first
and ``down [E, H, I]``, or, in the variants a :class:`FusedLayout` names,

* ``transposed``: ``gate_up [E, H, 2I]`` / ``down [E, I, H]`` (inputs first);
* ``interleaved``: gate and up alternate along 2I (gate = ``0::2``, up = ``1::2``).

Checkpoint readers split fused tensors with it; ``torch_ktmoe.hf``'s ``ExpertsLayout``
extends it with a transformers module's biases and activation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FusedLayout:
    transposed: bool = False  # gate_up [E, H, 2I], down [E, I, H]
    interleaved: bool = False  # gate = 0::2, up = 1::2 along 2I (else gate = [:I], up = [I:])

    def dims(self, gate_up: torch.Tensor) -> tuple[int, int, int]:
        """(E, H, I) from gate_up's shape (meta tensors are fine)."""
        E, a, b = gate_up.shape
        H, two_i = (a, b) if self.transposed else (b, a)
        return int(E), int(H), int(two_i) // 2

    def shapes(self, E: int, H: int, I: int) -> dict[str, tuple[int, ...]]:
        """The fused tensors' shapes in this layout."""
        return {"gate_up_proj": (E, H, 2 * I) if self.transposed else (E, 2 * I, H),
                "down_proj": (E, I, H) if self.transposed else (E, H, I)}

    # ---- this layout -> KTMoE
    def split_gate_up(self, gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """gate_up [..., (2I, H) or (H, 2I)] -> views gate, up [..., I, H]."""
        gu = gate_up.transpose(-1, -2) if self.transposed else gate_up  # [..., 2I, H]
        if self.interleaved:
            return gu[..., 0::2, :], gu[..., 1::2, :]
        inter = gu.shape[-2] // 2
        return gu[..., :inter, :], gu[..., inter:, :]

    def down(self, down: torch.Tensor) -> torch.Tensor:
        """down -> view [..., H, I]."""
        return down.transpose(-1, -2) if self.transposed else down

    # ---- KTMoE -> this layout
    def join(self, gate_up: torch.Tensor, down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """KTMoE's gate_up [E, 2I, H] (gate rows first), down [E, H, I] -> (gate_up, down) in this layout."""
        if self.interleaved:
            inter = gate_up.shape[1] // 2
            mixed = torch.empty_like(gate_up)
            mixed[:, 0::2], mixed[:, 1::2] = gate_up[:, :inter], gate_up[:, inter:]
            gate_up = mixed
        if self.transposed:
            gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
        return gate_up, down


CONCATENATED = FusedLayout()  # [E, 2I, H] gate rows first, [E, H, I]
