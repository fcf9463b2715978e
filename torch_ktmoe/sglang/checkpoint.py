"""One MoE layer's experts out of a safetensors checkpoint (what ``--kt-weight-path`` names).

The layouts that kt-kernel's ``NativeMoEWrapper`` reads, under ``model.layers.{L}``:

* per-expert keys ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (Qwen2/3-MoE, DeepSeek, OLMoE);
* Mixtral's ``block_sparse_moe.experts.{e}.w1/w3/w2.weight``;
* fused ``mlp.experts.gate_up_proj`` [E, 2I, H] and ``mlp.experts.down_proj`` [E, H, I].

kt-kernel's own pre-converted files (``blk.*`` keys, AMX layouts) are refused with
an error that says so. Experts are read one at a time (bounded peak memory).
"""
from __future__ import annotations

import os
from typing import Iterator, Sequence, Tuple

import torch

from ..hf import _PER_EXPERT_LAYOUTS, _Checkpoint

_LAYER_PREFIXES = ("model.layers.{L}", "model.language_model.layers.{L}", "language_model.model.layers.{L}")
_EXPERTS_NAMES = ("mlp.experts", "block_sparse_moe.experts")


def check_weight_path(path) -> None:
    """Raises a clear error unless ``path`` is an existing directory."""
    if path is None:
        raise ValueError("KTMoEWrapper: weight_path is None; sglang passes --kt-weight-path (a directory of "
                         "*.safetensors files holding the model's experts)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"KTMoEWrapper: weight_path {path!r} is not a directory (--kt-weight-path must "
                                "name a directory of *.safetensors files)")


class CheckpointLayer:
    """The experts of layer ``layer_idx`` in the checkpoint directory ``path``.

    ``experts(ids)`` yields ``(gate_up [2I, H], down [H, I])`` for each logical
    expert id in ``ids``, in that order, in the checkpoint's dtype.
    """

    def __init__(self, path: str, layer_idx: int, hidden: int, inter: int):
        check_weight_path(path)
        self.path, self.layer_idx = path, layer_idx
        self.H, self.I = hidden, inter
        self.ckpt = _Checkpoint(path)
        try:
            self._layout, self._prefix = self._find_layout()
        except BaseException:
            self.ckpt.close()
            raise

    def _find_layout(self):
        if any(k.startswith("blk.") for k in self.ckpt.key_to_file):
            raise ValueError(f"KTMoEWrapper: {self.path} holds kt-kernel's pre-converted CPU weights (blk.* keys); "
                             "torch_ktmoe packs from the original Hugging Face safetensors: point --kt-weight-path "
                             "at the model's checkpoint directory")
        tried = []
        for lp in _LAYER_PREFIXES:
            for en in _EXPERTS_NAMES:
                p = f"{lp.format(L=self.layer_idx)}.{en}"
                tried.append(p)
                if f"{p}.gate_up_proj" in self.ckpt and f"{p}.down_proj" in self.ckpt:
                    return "fused", p
                for sfx in _PER_EXPERT_LAYOUTS:
                    if f"{p}.0.{sfx[0]}" in self.ckpt:
                        return sfx, p
        raise KeyError(f"KTMoEWrapper: no experts of layer {self.layer_idx} in {self.path}; looked for "
                       f"{tried} with per-expert keys {[s[0] for s in _PER_EXPERT_LAYOUTS]} or fused gate_up_proj")

    def _check(self, what, got, shape):
        got = list(got)
        if got != list(shape):
            raise ValueError(f"KTMoEWrapper: {self._prefix}.{what}: shape {got} in {self.path}, "
                             f"expected {list(shape)} (H={self.H}, I={self.I})")

    def experts(self, ids: Sequence[int]) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        p, H, I = self._prefix, self.H, self.I
        if self._layout == "fused":
            gu, dn = self.ckpt.shape(f"{p}.gate_up_proj"), self.ckpt.shape(f"{p}.down_proj")
            self._check("gate_up_proj", gu[1:], (2 * I, H))
            self._check("down_proj", dn[1:], (H, I))
            if max(ids) >= min(gu[0], dn[0]):
                raise ValueError(f"KTMoEWrapper: expert {max(ids)} of layer {self.layer_idx} is not in {p} "
                                 f"({gu[0]} experts) in {self.path}")
            for e in ids:
                yield self.ckpt.get_row(f"{p}.gate_up_proj", e), self.ckpt.get_row(f"{p}.down_proj", e)
            return
        g_sfx, u_sfx, d_sfx = self._layout
        for e in ids:
            keys = [f"{p}.{e}.{s}" for s in (g_sfx, u_sfx, d_sfx)]
            missing = [k for k in keys if k not in self.ckpt]
            if missing:
                raise KeyError(f"KTMoEWrapper: expert {e} of layer {self.layer_idx} missing in {self.path}: {missing}")
            g, u, d = (self.ckpt.get(k) for k in keys)
            self._check(f"{e}.{g_sfx}", g.shape, (I, H))
            self._check(f"{e}.{u_sfx}", u.shape, (I, H))
            self._check(f"{e}.{d_sfx}", d.shape, (H, I))
            yield torch.cat([g, u], 0), d

    def close(self) -> None:
        self.ckpt.close()
