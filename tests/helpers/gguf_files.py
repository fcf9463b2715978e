"""GGUF files for the tests, written with the `gguf` package's own writer: routed experts per layer as llama.cpp
names them (random blocks of any GGML type: ktmoe_harness.ggml_rows), single files or splits."""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

from ktmoe_harness.ggml_rows import F16_FIELDS, random_rows  # noqa: F401  (tests import them from here)


def write_moe_gguf(path, *, arch: str = "qwen3moe", layers: int = 2, experts: int = 4, hidden: int = 256,
                   inter: int = 256, types: Optional[Dict[str, Q]] = None, layer_types: Optional[Dict[int, Dict]] = None,
                   split_max_tensors: int = 0, metadata: Optional[Dict[str, int]] = None, alignment: int = 0,
                   sane: bool = False) -> str:
    """A GGUF of `layers` layers of routed experts (blk.N.ffn_{gate,up,down}_exps.weight, gate/up [E, I, H], down
    [E, H, I]) of `types` per role (default q4_K gate/up, q6_K down; `layer_types[N]` overrides a layer's), plus a
    small f32 norm per layer, and the metadata llama.cpp writes for `arch` (`sane`: scales of the size real
    files hold, see random_rows). Returns the path written (a split's first part when split_max_tensors > 0)."""
    types = {"gate": Q.Q4_K, "up": Q.Q4_K, "down": Q.Q6_K, **(types or {})}
    w = gguf.GGUFWriter(os.fspath(path), arch=arch, split_max_tensors=split_max_tensors)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_expert_count(experts)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(inter)
    for key, value in (metadata or {}).items():
        w.add_uint32(key, value)
    for layer in range(layers):
        t = {**types, **((layer_types or {}).get(layer, {}))}
        shapes = {"gate": (experts, inter, hidden), "up": (experts, inter, hidden), "down": (experts, hidden, inter)}
        for role in ("gate", "up", "down"):
            seed = layer * 3 + 1 + ("gate", "up", "down").index(role)
            w.add_tensor(f"blk.{layer}.ffn_{role}_exps.weight", random_rows(t[role], shapes[role], seed, sane=sane),
                         raw_dtype=t[role])
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        stem = os.fspath(path)[:-len(".gguf")]
        n = len([f for f in os.listdir(os.path.dirname(os.fspath(path)) or ".")
                 if f.startswith(os.path.basename(stem) + "-0")])
        return f"{stem}-00001-of-{n:05d}.gguf"
    return os.fspath(path)
