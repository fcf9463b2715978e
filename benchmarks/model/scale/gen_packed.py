"""Writes the 30B-class model (see common.py) as a torch_ktmoe packed model directory, layer by layer.

    python -m benchmarks.model.scale.gen_packed OUT_DIR [--layers 48] [--format int8]

Per layer: random bf16 experts (gate_up [E, 2I, H], down [E, H, I], ~1.2 GB) are generated with torch,
packed by KTMoE straight into DIR/experts/layerNNNN.part0.ktmoe (cache="rebuild": the library's own
MAP_SHARED cache file, written back as it goes), then freed: never more than one layer of dense experts
in memory and never a dense checkpoint on disk. The non-expert weights go to model.safetensors, then
config.json and ktmoe_packed.json (last: a directory with a manifest is complete).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from benchmarks.model.scale import common as C


def dense_layer(layer: int):
    g = torch.Generator()
    g.manual_seed(C.SEED * 7919 + layer)
    gate_up = torch.empty(C.E, 2 * C.I, C.H, dtype=torch.bfloat16)
    down = torch.empty(C.E, C.H, C.I, dtype=torch.bfloat16)
    for t in (gate_up, down):
        for e in range(C.E):  # an expert at a time: bounded fp32 temporaries
            t[e].copy_(torch.randn(t.shape[1:], generator=g).mul_(C.W_STD))
    down[:, C.D0, :] = 0  # nothing writes into the popularity channel (see common.py)
    return gate_up, down


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=C.LAYERS)
    ap.add_argument("--format", default="int8")
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    from safetensors.torch import save_file

    from torch_ktmoe import KTMoE
    from torch_ktmoe.hf import packed_dir

    out = args.out
    experts_dir = os.path.join(out, packed_dir.EXPERTS_DIR)
    os.makedirs(experts_dir, exist_ok=True)
    os.chmod(out, 0o755), os.chmod(experts_dir, 0o755)
    t0 = time.time()
    layers, written = [], 0
    state = dict(C.nonexpert_tensors(None))
    bar = C.progress(range(args.layers), args.layers, "packed dir")
    for layer in bar:
        state.update(C.nonexpert_tensors(layer))
        gate_up, down = dense_layer(layer)
        ktm = KTMoE(C.E, C.TOPK, C.H, C.I, weight_format=args.format, mmap_experts_dir=experts_dir,
                    layer_idx=layer, cache="rebuild")
        fingerprint = f"bench_scale:seed={C.SEED}:layer={layer}:{args.format}"
        ktm.load_weights(gate_up, down, fingerprint=fingerprint)
        del gate_up, down
        if ktm.file_backed_bytes != ktm.packed_bytes:
            sys.exit(f"layer {layer}: experts not file-backed ({ktm.arena_stats()})")
        written += ktm.packed_bytes
        layers.append(dict(module=f"model.layers.{layer}.mlp.experts", layer_idx=layer, class_name="Qwen3MoeExperts",
                           num_experts=C.E, top_k=C.TOPK, hidden_size=C.H, intermediate_size=C.I,
                           weight_format=args.format, group_size=ktm.group_size, numa_parts=ktm.numa_parts,
                           dense_dtype="bfloat16", fingerprint=fingerprint, files=ktm.arenas.file_names()))
        del ktm
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(GB=f"{written / 1e9:.1f}", MBps=f"{written / 1e6 / (time.time() - t0):.0f}")
    cfg = C.hf_config()
    cfg["num_hidden_layers"] = args.layers
    cfg["max_window_layers"] = args.layers
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    manifest = dict(format=packed_dir.FORMAT, version=packed_dir.VERSION, experts_dir=packed_dir.EXPERTS_DIR,
                    layers=layers)
    with open(os.path.join(out, packed_dir.MANIFEST + ".tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(os.path.join(out, packed_dir.MANIFEST + ".tmp"), os.path.join(out, packed_dir.MANIFEST))
    os.sync()
    dt = time.time() - t0
    total = C.dir_bytes(out)
    print(json.dumps(dict(dir=out, layers=args.layers, expert_bytes=written, total_bytes=total, seconds=round(dt, 1),
                          MBps=round(total / 1e6 / dt, 1))))


if __name__ == "__main__":
    main()
