"""``python -m torch_ktmoe inspect FILE.gguf``: what a GGUF holds, as torch_ktmoe reads it.

Prints the file (or a split's parts), the architecture and the metadata's expert figures, then per layer the routed
experts' GGML types (gate, up, down), their shape E x H x I and bytes, and the totals: experts against everything
else, bytes per type. A type torch_ktmoe does not read is marked. A file that is not a readable GGUF is one line on
stderr and exit code 2 (the reader's GGUFError: the file, the tensor or key, what is wrong).
"""
from __future__ import annotations

import sys
from collections import Counter

from .. import ops
from ..checkpoint.gguf import GGUFError, expert_layers, open_gguf


def _type(ggml_type: int) -> str:
    row = ops.GGML_TYPES[ggml_type]
    return row["name"] if row["decodable"] else f"{row['name']}*"


def inspect_gguf(path: str) -> int:
    try:
        model = open_gguf(path)
        layers = expert_layers(model)
        arch = model.architecture
    except (OSError, GGUFError, ValueError) as e:
        print(f"inspect: {e}", file=sys.stderr)
        return 2
    for f in model.files:
        print(f"file {f.path}: GGUF v{f.version}, {len(f.tensors)} tensors, data at {f.data_offset} "
              f"(alignment {f.alignment}), {f.file_size / 2**20:.1f} MiB")
    figures = ", ".join(f"{k} {model.arch_value(k)}" for k in ("block_count", "embedding_length", "expert_count",
                                                                "expert_used_count", "expert_feed_forward_length")
                        if model.arch_value(k) is not None)
    print(f"architecture {arch}" + (f": {figures}" if figures else ""))
    if layers:
        print(f"{'layer':>5}  {'gate':<8} {'up':<8} {'down':<8} {'E x H x I':<16} {'MiB':>9}")
        for l in layers:
            e, h, i = l.shape
            print(f"{l.layer:>5}  {_type(l.gate.ggml_type):<8} {_type(l.up.ggml_type):<8} "
                  f"{_type(l.down.ggml_type):<8} {f'{e}x{h}x{i}':<16} {l.nbytes / 2**20:9.1f}")
    expert_names = {t.name for l in layers for t in (l.gate, l.up, l.down)}
    expert_bytes = sum(l.nbytes for l in layers)
    other_bytes = sum(t.nbytes for t in model.tensors.values() if t.name not in expert_names)
    by_type = Counter()
    for l in layers:
        for t in (l.gate, l.up, l.down):
            by_type[_type(t.ggml_type)] += t.nbytes
    print(f"routed experts: {len(layers)} layers, {expert_bytes / 2**20:.1f} MiB"
          + (" (" + ", ".join(f"{name} {b / 2**20:.1f}" for name, b in by_type.most_common()) + ")" if by_type else "")
          + f"; other tensors: {other_bytes / 2**20:.1f} MiB")
    if any(name.endswith("*") for name in by_type):
        print("* a GGML type torch_ktmoe does not read yet")
    return 0
