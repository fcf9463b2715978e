"""Peer MoE implementations for the kernel benchmark: kt-kernel 0.7.2 and transformers 5.x experts.

Both peers are optional: ``available_peers()`` says which ones import here, and why not.

Install (torch 2.13.0+cpu must stay as it is -- never let pip resolve a plain ``torch`` requirement, it pulls
a multi-GB CUDA build):

    # kt-kernel: its wheel declares torch/triton/... as requirements, so install it WITHOUT dependencies.
    pip install --no-deps --dry-run kt-kernel==0.7.2      # check: "Would install kt-kernel-0.7.2" only
    pip install --no-deps kt-kernel==0.7.2               # ~100 MB wheel, bundles libgomp/hwloc/numa
    pip install gguf                                     # optional: only `import kt_kernel` (its Python
                                                         # wrapper) needs it; this file loads the C++
                                                         # extension without it when it is missing
    # transformers 5.x (depends on neither torch nor CUDA packages; check the dry run anyway):
    pip install --dry-run "transformers>=5,<6"           # must not list torch
    pip install "transformers>=5,<6"

Notes on kt-kernel (its Python wrapper ``KTMoEWrapper`` needs CUDA, so we drive the C++ classes):

* The wheel holds one extension per ISA (``_kt_kernel_ext_{amx,avx512_bf16,avx512_vbmi,avx512_vnni,
  avx512_base,avx2}``); ``kt_kernel/_cpu_detect.py`` picks one from /proc/cpuinfo.  On an AVX-512
  (bf16+vnni+vbmi) CPU without AMX it loads ``avx512_bf16``, in which the "AMX" MoE classes run AVX-512
  kernels: ``AMXBF16_MOE`` (backend AVX512-BF16), ``AMXInt8_MOE`` (int8 kernel "avx512-vnni"),
  ``AMXInt4_MOE``.  All three quantise online from bf16 [E, I, H] / [E, H, I] tensors.
* Call sequence (mirrors kt-kernel/examples/test_moe_amx.py):

      cpu = kt_kernel_ext.CPUInfer(threads)                # 1 subpool with `threads` workers
      cfg = kt_kernel_ext.moe.MOEConfig(E, k, H, I, 0)      # 5th arg: gpu_experts_mask ptr (0 = none)
      cfg.max_len = max_tokens; cfg.pool = cpu.backend_
      cfg.gate_proj, cfg.up_proj, cfg.down_proj = gate.data_ptr(), up.data_ptr(), down.data_ptr()
      moe = kt_kernel_ext.moe.AMXInt8_MOE(cfg)
      cpu.submit(moe.load_weights_task(arange(E, int64).data_ptr())); cpu.sync()   # quantise/pack
      cpu.submit(moe.warm_up_task()); cpu.sync()
      bsz = tensor([T], int32)
      cpu.submit(moe.forward_task(bsz.data_ptr(), k, ids_i64.data_ptr(), w_f32.data_ptr(),
                                  x_bf16.data_ptr(), out_bf16.data_ptr(), False)); cpu.sync()

* Threading caveat: ``submit`` enqueues on a TaskQueue thread that busy-spins forever (no pause/sleep)
  and acts as pool thread 0; ``sync`` busy-spins the calling thread; pool workers spin for 50 ms before
  napping.  So ``CPUInfer(n)`` keeps n+1 threads busy during a forward (n while idle): on a 2-core host
  ``CPUInfer(2)`` is oversubscribed.  A live CPUInfer also burns one core while idle, so ``close()``
  each kt-kernel peer before timing anything else.

Run the benchmark:  python -m benchmarks.baselines.experts            (reference shape, T in {1, 512}, threads 1, 2)
                    python -m benchmarks.baselines.experts --quick    (fewer repetitions)

The inputs come from ktmoe_harness.moe_inputs, the accuracy reference and metric from torch_ktmoe.reference.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import os
import statistics
import sys
import time

import torch

from benchmarks.cli import add_shape_arguments
from ktmoe_harness.moe_inputs import random_experts, random_routing
from torch_ktmoe.reference import moe_reference, relative_error

# kt-kernel MoE class per weight format.
KT_FORMATS = {"bf16": "AMXBF16_MOE", "int8": "AMXInt8_MOE", "int4": "AMXInt4_MOE"}
HF_IMPLS = ("eager", "grouped_mm")

_KT_EXT = None
_KT_EXT_ERR = None


# ----------------------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _quiet_stdout(enabled: bool = True):
    """Silence C++ printf chatter (kt-kernel prints on every construct/destruct) at the fd level."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _load_kt_ext():
    """Return the kt-kernel C++ extension module (``kt_kernel_ext``), or raise ImportError."""
    global _KT_EXT, _KT_EXT_ERR
    if _KT_EXT is not None:
        return _KT_EXT
    if _KT_EXT_ERR is not None:
        raise ImportError(_KT_EXT_ERR)
    try:
        ext = sys.modules.get("kt_kernel_ext")
        if ext is None:
            try:
                import kt_kernel  # noqa: F401  (loads the ISA variant and registers sys.modules["kt_kernel_ext"])
            except ImportError:
                # The package __init__ registers the extension before importing its wrapper, whose extra
                # dependencies (gguf, ...) may be missing; otherwise load it with kt-kernel's own detector.
                ext = sys.modules.get("kt_kernel_ext")
                if ext is None:
                    spec = importlib.util.find_spec("kt_kernel")
                    if spec is None or spec.origin is None:
                        raise ImportError("kt-kernel is not installed (pip install --no-deps kt-kernel==0.7.2)")
                    det_path = os.path.join(os.path.dirname(spec.origin), "_cpu_detect.py")
                    det_spec = importlib.util.spec_from_file_location("_kt_kernel_cpu_detect", det_path)
                    det = importlib.util.module_from_spec(det_spec)
                    det_spec.loader.exec_module(det)
                    ext, _variant = det.initialize()
                    sys.modules["kt_kernel_ext"] = ext
            ext = sys.modules.get("kt_kernel_ext", ext)
        if ext is None or not hasattr(ext, "moe"):
            raise ImportError("kt_kernel_ext has no 'moe' submodule")
    except Exception as e:  # noqa: BLE001 -- any failure means "peer unavailable"
        _KT_EXT_ERR = f"{type(e).__name__}: {e}"
        raise ImportError(_KT_EXT_ERR) from e
    _KT_EXT = ext
    return ext


def _kt_version() -> str:
    try:
        from importlib.metadata import version

        return version("kt-kernel")
    except Exception:  # noqa: BLE001
        return "?"


def available_peers() -> dict[str, tuple[bool, str]]:
    """Map peer name -> (available, detail).  detail is a version/variant string, or the reason it is not."""
    peers: dict[str, tuple[bool, str]] = {}
    try:
        ext = _load_kt_ext()
        variant = getattr(ext, "__cpu_variant__", "?")
        int8k = getattr(ext, "__int8_kernel__", "?")
        for fmt, cls in KT_FORMATS.items():
            if hasattr(ext.moe, cls):
                peers[f"kt-kernel {fmt}"] = (True, f"kt-kernel {_kt_version()} {cls}, {variant} build"
                                             + (f", int8 kernel {int8k}" if fmt == "int8" else ""))
            else:
                peers[f"kt-kernel {fmt}"] = (False, f"kt_kernel_ext.moe has no {cls} ({variant} build)")
    except ImportError as e:
        for fmt in KT_FORMATS:
            peers[f"kt-kernel {fmt}"] = (False, str(e))
    try:
        import transformers
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts  # noqa: F401

        major = int(transformers.__version__.split(".")[0])
        for impl in HF_IMPLS:
            if major < 5:
                peers[f"transformers {impl}"] = (False, f"transformers {transformers.__version__} < 5")
            elif impl != "eager" and impl not in ALL_EXPERTS_FUNCTIONS:
                peers[f"transformers {impl}"] = (False, f"experts implementation {impl!r} not registered")
            else:
                peers[f"transformers {impl}"] = (True, f"transformers {transformers.__version__} Qwen3MoeExperts")
    except Exception as e:  # noqa: BLE001
        for impl in HF_IMPLS:
            peers[f"transformers {impl}"] = (False, f"{type(e).__name__}: {e}")
    return peers


# ----------------------------------------------------------------------------------------------- kt-kernel


class KtKernelMoE:
    """Callable kt-kernel MoE layer: forward(x [T,H] bf16, ids [T,k] int64, weights [T,k] fp32) -> [T,H] bf16.

    Call ``close()`` when done: a live CPUInfer keeps a busy-spinning thread.
    """

    def __init__(self, fmt, E, k, H, I, threads, gate, up, down, max_len=512, quiet=True):
        ext = _load_kt_ext()
        if fmt not in KT_FORMATS:
            raise ValueError(f"fmt must be one of {sorted(KT_FORMATS)}, got {fmt!r}")
        assert gate.shape == (E, I, H) and up.shape == (E, I, H) and down.shape == (E, H, I), "weight shapes"
        # The int8/int4 kernels need max_len to be a multiple of their M_STEP (32): round up.
        max_len = -(-max(int(max_len), 1) // 32) * 32
        self.fmt, self.E, self.k, self.H, self.I, self.threads, self.max_len = fmt, E, k, H, I, threads, max_len
        self.quiet = quiet
        # Keep the bf16 sources alive: the C++ side is handed raw pointers.
        self._gate = gate.to(torch.bfloat16).contiguous()
        self._up = up.to(torch.bfloat16).contiguous()
        self._down = down.to(torch.bfloat16).contiguous()
        self._p2l = torch.arange(E, dtype=torch.int64)  # physical -> logical expert map (identity)
        self._bsz = torch.zeros(1, dtype=torch.int32)
        cls = getattr(ext.moe, KT_FORMATS[fmt])
        with _quiet_stdout(quiet):
            self.cpu = ext.CPUInfer(threads)
            cfg = ext.moe.MOEConfig(E, k, H, I, 0)
            cfg.max_len = max_len
            cfg.pool = self.cpu.backend_
            cfg.gate_proj = self._gate.data_ptr()
            cfg.up_proj = self._up.data_ptr()
            cfg.down_proj = self._down.data_ptr()
            self.moe = cls(cfg)
            self.cpu.submit(self.moe.load_weights_task(self._p2l.data_ptr()))
            self.cpu.sync()
            self.cpu.submit(self.moe.warm_up_task())
            self.cpu.sync()

    def __call__(self, x, ids, weights, out=None):
        if self.moe is None:
            raise RuntimeError("KtKernelMoE is closed")
        T = x.shape[0]
        if T > self.max_len:
            raise ValueError(f"T={T} > max_len={self.max_len}")
        x = x.to(torch.bfloat16).contiguous()
        ids = ids.to(torch.int64).contiguous()
        weights = weights.to(torch.float32).contiguous()
        if out is None:
            out = torch.empty(T, self.H, dtype=torch.bfloat16)
        self._bsz[0] = T
        self.cpu.submit(self.moe.forward_task(self._bsz.data_ptr(), ids.shape[1], ids.data_ptr(),
                                              weights.data_ptr(), x.data_ptr(), out.data_ptr(), False))
        self.cpu.sync()
        return out

    def close(self):
        if getattr(self, "moe", None) is None:
            return
        with _quiet_stdout(self.quiet):
            self.moe = None  # the MoE object references the pool: drop it before the CPUInfer
            gc.collect()
            self.cpu = None
            gc.collect()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def make_ktkernel_moe(fmt, E, k, H, I, threads, gate, up, down, max_len=512):
    """kt-kernel peer.  fmt in {'bf16','int8','int4'}; gate/up [E,I,H], down [E,H,I] (bf16).

    Returns a callable forward(x [T,H] bf16, ids [T,k] int64, weights [T,k] fp32) -> out [T,H] bf16 with a
    ``close()`` method (see KtKernelMoE).
    """
    return KtKernelMoE(fmt, E, k, H, I, threads, gate, up, down, max_len=max_len)


# ----------------------------------------------------------------------------------------------- transformers


def make_hf_experts(impl, E, k, H, I, gate_up, down):
    """transformers 5.x peer: Qwen3MoeExperts with ``config._experts_implementation = impl``.

    gate_up [E, 2I, H] (gate rows first, then up -- HF's concatenated layout), down [E, H, I], bf16.
    Returns forward(x [T,H] bf16, ids [T,k] int64, weights [T,k]) -> [T,H] bf16.  Routing weights are cast to
    the activation dtype first, as Qwen3MoeTopKRouter does in a bf16 model.
    """
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    assert gate_up.shape == (E, 2 * I, H) and down.shape == (E, H, I), "weight shapes"
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                         hidden_act="silu", num_hidden_layers=1, vocab_size=8, num_attention_heads=1,
                         num_key_value_heads=1)
    cfg._experts_implementation = impl
    with torch.device("meta"):  # avoid allocating (and filling) the fp32 default parameters
        mod = Qwen3MoeExperts(cfg)
    mod.gate_up_proj = torch.nn.Parameter(gate_up.to(torch.bfloat16).contiguous(), requires_grad=False)
    mod.down_proj = torch.nn.Parameter(down.to(torch.bfloat16).contiguous(), requires_grad=False)
    mod.eval()

    def forward(x, ids, weights):
        with torch.inference_mode():
            return mod(x.to(torch.bfloat16), ids, weights.to(torch.bfloat16))

    forward.module = mod
    forward.impl = impl
    return forward


# ----------------------------------------------------------------------------------------------- benchmark


def _time(fn, inputs, warmup, reps, budget_s=10.0):
    """Wall times (ms) of fn(*inputs[i % len(inputs)]); each repetition gets a fresh routing.

    Stops early (after at least 3 repetitions) once budget_s is spent, so a contended host cannot blow up
    the run time.  Returns (median, min, n).
    """
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    ts = []
    t_start = time.perf_counter()
    for i in range(reps):
        args = inputs[(warmup + i) % len(inputs)]
        t0 = time.perf_counter()
        fn(*args)
        ts.append((time.perf_counter() - t0) * 1e3)
        if len(ts) >= 3 and time.perf_counter() - t_start > budget_s:
            break
    return statistics.median(ts), min(ts), len(ts)


def _fmt(r):
    med, mn, n = r
    return f"{med:.2f} ms (min {mn:.2f}, n={n})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_arguments(ap)
    ap.add_argument("--tokens", default="1,512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--peers", default="", help="comma-separated substrings to select peers (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--acc-tokens", type=int, default=32, help="tokens for the accuracy check (0 = skip)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    E, k, H, I = args.experts, args.top_k, args.hidden, args.intermediate
    tokens = [int(t) for t in args.tokens.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    sel = [s for s in args.peers.split(",") if s]

    peers = available_peers()
    print(f"torch {torch.__version__}; shape E={E} k={k} H={H} I={I}; tokens {tokens}; threads {threads}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (the host is shared: rerun if high)")
    for name, (ok, detail) in peers.items():
        print(f"  {name:26s} {'ok  ' if ok else 'SKIP'} {detail}")
    run = [n for n, (ok, _) in peers.items() if ok and (not sel or any(s in n for s in sel))]
    if not run:
        print("no peer available")
        return 0

    t0 = time.perf_counter()
    gate_up, down = random_experts(E, H, I, dtype=torch.bfloat16, seed=args.seed)
    gate, up = gate_up[:, :I].contiguous(), gate_up[:, I:].contiguous()  # kt-kernel takes them apart
    g = torch.Generator().manual_seed(args.seed + 1)
    n_routings = 8
    inputs = {}
    for T in tokens:
        inputs[T] = []
        for _ in range(n_routings):
            x = torch.randn(T, H, generator=g).to(torch.bfloat16)
            ids, w = random_routing(T, E, k, generator=g)
            inputs[T].append((x, ids, w))
    acc_in = None
    if args.acc_tokens > 0:
        x = torch.randn(args.acc_tokens, H, generator=g).to(torch.bfloat16)
        ids, w = random_routing(args.acc_tokens, E, k, generator=g)
        acc_in = (x, ids, w, moe_reference(x, ids, w, gate_up, down))
    print(f"setup {time.perf_counter() - t0:.1f} s")

    def reps_for(T):
        if T <= 16:
            return (3, 10) if args.quick else (5, 30)
        return (1, 3) if args.quick else (2, 7)

    results: dict[str, dict] = {}
    accuracy: dict[str, float] = {}
    torch_threads = torch.get_num_threads()
    for name in run:
        results[name] = {}
        if name.startswith("kt-kernel"):
            fmt = name.split()[-1]
            for th in threads:
                t1 = time.perf_counter()
                moe = make_ktkernel_moe(fmt, E, k, H, I, th, gate, up, down, max_len=max(tokens + [args.acc_tokens]))
                t_load = time.perf_counter() - t1
                try:
                    if acc_in is not None and name not in accuracy:
                        accuracy[name] = relative_error(moe(*acc_in[:3]), acc_in[3])
                    for T in tokens:
                        results[name][(T, th)] = _time(moe, inputs[T], *reps_for(T))
                finally:
                    moe.close()
                print(f"  {name} threads={th}: load {t_load:.1f} s, "
                      + ", ".join(f"T={T} {_fmt(results[name][(T, th)])}" for T in tokens), flush=True)
        else:
            impl = name.split()[-1]
            fwd = make_hf_experts(impl, E, k, H, I, gate_up, down)
            try:
                if acc_in is not None:
                    accuracy[name] = relative_error(fwd(*acc_in[:3]), acc_in[3])
                for th in threads:
                    torch.set_num_threads(th)
                    for T in tokens:
                        results[name][(T, th)] = _time(fwd, inputs[T], *reps_for(T))
                    print(f"  {name} threads={th}: "
                          + ", ".join(f"T={T} {_fmt(results[name][(T, th)])}" for T in tokens), flush=True)
            finally:
                torch.set_num_threads(torch_threads)
                del fwd
                gc.collect()
        time.sleep(0.2)  # let spinning worker threads of the previous peer settle

    cols = [(T, th) for T in tokens for th in threads]
    print()
    print(f"Peers, E={E} top-{k} H={H} I={I}, bf16 activations; median ms per layer forward "
          f"(gate+up+down), fresh random routing per repetition")
    print()
    print("| peer | " + " | ".join(f"T={T}, {th} thr" for T, th in cols) + " | rel. err. |")
    print("| --- |" + " --- |" * (len(cols) + 1))
    for name in run:
        cells = [f"{results[name][c][0]:.2f}" if c in results[name] else "—" for c in cols]
        acc = f"{accuracy[name]:.4f}" if name in accuracy else "—"
        print(f"| {name} | " + " | ".join(cells) + f" | {acc} |")
    print()
    print(f"rel. err. = mean|out - ref| / mean|ref| against an fp32 torch reference, {args.acc_tokens} tokens.")
    print(f"total {time.perf_counter() - t0:.0f} s; load average now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
