"""The scale benchmarks' model files: where they live, how big they get, whether one on disk is whole,
generating and deleting them, building llama.cpp's decode harness and its argv (bench_scale, bench_e2e --model scaleN).

Two models of common.py's shape and `layers` layers, one per system:
  * "ours": a torch_ktmoe packed model directory (int8 experts; gen_packed.py), whole once its manifest
    names `layers` layers (the manifest is written last);
  * "llama": a q8_0-experts GGUF (gen_gguf.py), written under a temporary name and renamed when
    complete, whole when its header says `layers` blocks and every tensor lies inside the file.
The file names carry the layer count, so models of different depths sit side by side in one data
directory and a reused file is the depth asked for.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from benchmarks import ROOT
from benchmarks.model.scale import common as C

SYSTEMS = ("ours", "llama")
_NAMES = dict(ours="qwen3moe30b_L{layers}_int8_packed", llama="qwen3moe30b_L{layers}_q8_0.gguf")


def model_path(data: str, system: str, layers: int) -> str:
    return os.path.join(data, _NAMES[system].format(layers=layers))


def expected_sizes(layers: int) -> dict:
    """{system: bytes on disk} of the two models with `layers` layers (int8 / q8_0 experts + bf16 rest)."""
    ne = 2 * C.VOCAB * C.H * 2 + layers * (2 * (C.HEADS + C.KV_HEADS) * C.HEAD_DIM * C.H * 2 + C.E * C.H * 2)
    experts = layers * C.E * 3 * C.H * C.I
    return dict(ours=int(experts * 1.02 + ne), llama=int(experts * 34 / 32 + ne + C.E * C.H * 2 * layers))


def is_complete(system: str, path: str, layers: int) -> bool:
    """Whether `path` holds a whole model of `system` with `layers` layers."""
    if system == "ours":
        try:
            with open(os.path.join(path, "ktmoe_packed.json")) as f:
                return len(json.load(f)["layers"]) == layers
        except (OSError, ValueError, KeyError):
            return False
    if not os.path.isfile(path):
        return False
    import gguf

    try:
        r = gguf.GGUFReader(path, "r")
        blocks = int(r.fields["qwen3moe.block_count"].contents())
        return blocks == layers and all(t.data_offset + t.n_bytes <= os.path.getsize(path) for t in r.tensors)
    except Exception:  # a truncated or foreign file: not ours to reuse
        return False


def disk_bytes(system: str, path: str) -> int:
    if not os.path.exists(path):
        return 0
    return C.dir_bytes(path) if system == "ours" else os.path.getsize(path)


def files(system: str, path: str) -> list:
    """The model's files (ours: every file of the packed directory, by name; llama: the GGUF)."""
    if system != "ours":
        return [path]
    return sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)


def generate(system: str, path: str, layers: int) -> dict:
    """Writes the model (replacing what is at `path`); returns the generator's report (bytes, seconds, MB/s)
    plus the load average at its end. Exits the benchmark if the generator fails."""
    delete(system, path)
    out = path if system == "ours" else path + ".tmp"
    module = "benchmarks.model.scale.gen_packed" if system == "ours" else "benchmarks.model.scale.gen_gguf"
    p = subprocess.run([sys.executable, "-m", module, out, "--layers", str(layers)], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"generating the {system} model ({layers} layers) at {path} failed (rc {p.returncode})")
    if out != path:
        os.replace(out, path)
    report = json.loads(p.stdout.strip().splitlines()[-1])
    report["load_avg"] = C.loadavg()
    return report


def delete(system: str, path: str) -> None:
    if system == "ours":
        shutil.rmtree(path, ignore_errors=True)
    else:
        for p in (path, path + ".tmp"):
            if os.path.exists(p):
                os.remove(p)


def build_llama(data: str) -> str:
    """Builds (once) libllama and benchmarks/baselines/llama/llama_decode.cpp under DATA/llama; returns the
    harness path."""
    p = subprocess.run(["bash", os.path.join(ROOT, "benchmarks/baselines/llama/build.sh"), "llama_decode",
                        os.path.join(data, "llama")],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"building llama.cpp's decode harness failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout.strip().splitlines()[-1]


def llama_argv(harness: str, gguf_path: str, routing: str, threads: int, tokens: str, prompt_tokens: int = 1,
               no_repack: bool = False):
    """argv of llama.cpp's decode harness; first sets the GGUF's routing (which reads pages: drop after).
    no_repack: llama.cpp's --no-repack (every weight stays in the mapping; its default copies the types it repacks)."""
    from benchmarks.model.scale.gen_gguf import set_routing

    set_routing(gguf_path, routing)
    return [harness, gguf_path, str(threads), tokens, str(prompt_tokens)] + (["--no-repack"] if no_repack else [])
