"""llama.cpp's CPU backend as a benchmark peer: a whole MoE layer as one ggml graph.

``make peers`` builds it (benchmarks/baselines/llama/build.sh: ggml from the llama-cpp-python sdist's
vendored llama.cpp, GGML_NATIVE=ON, OpenMP, and the harness moe_layer_ggml.cpp). One process per
weight type holds the weights (L distinct layers, so a pass reads cold experts; new routings every
repetition) and answers ``run T THREADS REPS`` on stdin, so a benchmark can alternate it with our
layer in one run without setting the weights up again.

Formats compared with ggml's nearest type: bf16 / int8 / int4 / fp8 / int4_affine / mxfp4 with bf16 /
q8_0 / q4_0 / q8_0 / q4_K / MXFP4 (q4_0, q4_K and MXFP4 repacked into CPU_REPACK's interleaved layouts,
as llama.cpp does at load time on AVX2 / AVX-512 hosts). ``KTMOE_LLAMA_TYPES="int4=q4_K"`` sets another
(bf16, q8_0, q4_0, q4_K or mxfp4) for a format.

``KTMOE_LLAMA_PEER=PATH`` picks another build of the harness, e.g. an AVX2-only ggml to set
against our AVX2 path (``KTMOE_ISA=avx2``) on an AVX-512 host:
``GGML_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
benchmarks/baselines/llama/build.sh moe_layer_ggml build/llama_peer_avx2``.
"""
import json
import math
import os
import subprocess
from typing import List, Optional

from benchmarks import ROOT

BINARY = os.environ.get("KTMOE_LLAMA_PEER") or os.path.join(ROOT, "build", "llama_peer", "moe_layer_ggml")
GGML_TYPE = {"bf16": "bf16", "int8": "q8_0", "int4": "q4_0", "fp8": "q8_0", "int4_affine": "q4_K", "mxfp4": "mxfp4",
             "gguf-q4_K": "q4_K", "gguf-q8_0": "q8_0"}  # GGUF experts: the same type
GGML_TYPE.update(kv.split("=", 1) for kv in os.environ.get("KTMOE_LLAMA_TYPES", "").split(",") if "=" in kv)
TYPE_BYTES_PER_WEIGHT = {"bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_K": 144 / 256, "mxfp4": 17 / 32}
COLD_BYTES = 150 << 20  # routed-expert bytes one pass must read, at least


def available() -> tuple:
    """(True, path) when the harness is built, else (False, how to build it)."""
    if os.access(BINARY, os.X_OK):
        return True, BINARY
    return False, "not built: run `make peers` (benchmarks/baselines/llama/build.sh)"


class GgmlMoeLayer:
    """A live harness process for one weight format and shape (E, k, H, I)."""

    def __init__(self, fmt: str, experts: int, top_k: int, hidden: int, inter: int, *, layers: Optional[int] = None,
                 seed: int = 0):
        self.format, self.type = fmt, GGML_TYPE[fmt]
        if layers is None:  # enough distinct layers that one T=1 pass reads >= COLD_BYTES of experts
            approx_expert = 3 * hidden * inter * TYPE_BYTES_PER_WEIGHT[self.type]
            layers = max(1, math.ceil(COLD_BYTES / (top_k * approx_expert)))
        self.proc = subprocess.Popen([BINARY, self.type, str(experts), str(top_k), str(hidden), str(inter),
                                      str(layers), str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.info = json.loads(self._reply("ready"))

    def _reply(self, tag: str) -> str:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"llama.cpp harness ({self.type}) exited with {self.proc.wait()}")
            if line.startswith(tag + " "):
                return line[len(tag) + 1:]
            if line.startswith("error "):
                raise RuntimeError(f"llama.cpp harness: {line.strip()}")

    @property
    def expert_bytes(self) -> int:
        return int(self.info["expert_bytes"])

    def run(self, tokens: int, threads: int, reps: int) -> List[float]:
        """ms per layer of ``reps`` forwards of ``tokens`` tokens on ``threads`` threads."""
        self.proc.stdin.write(f"run {tokens} {threads} {reps}\n")
        self.proc.stdin.flush()
        return [float(v) for v in self._reply("ms").split()]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
